"""In Chromium, on the panel as uvicorn serves it (streams need the ASGI server; live_server is WSGI): the Compare
page streams two columns side by side, shows their metrics, diagnoses the failing third, diffs two answers, runs
the JSON and prefix-cache checks, and refuses bad input with a message while staying usable."""
import subprocess
import sys
from decimal import Decimal

from playwright.sync_api import expect

from panel.serving.models import Deployment
from tests.support.browser import screenshot, sign_in
from tests.support.compare import channel
from tests.support.dashboards import make_deployment
from tests.support.environment import ROOT, panel_env
from tests.support.fake_upstream import FakeUpstream, closed_port, content_text
from tests.support.gateway_server import GatewayServer


def test_it_streams_columns_side_by_side_in_the_browser(page, team_setup, transactional_db, tmp_path):
    from django.db import connection

    team_a = team_setup["team_a"]
    static_root = tmp_path / "static"
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, check=True,
                   env=panel_env(TOKENWISE_STATIC_ROOT=str(static_root)))
    with FakeUpstream(("qwen-awq",), chunks=24, chunk_delay=0.12) as engine, \
            FakeUpstream(("qwen-plus",), chunks=18, chunk_delay=0.15) as cloud:
        deployment = make_deployment(team_a, price=Decimal("2.50"))
        Deployment.objects.filter(pk=deployment.pk).update(base_url=engine.base_url)
        local = channel(team_a, "local-qwen-awq", engine.base_url, model="qwen-awq", kind="local",
                        deployment=deployment)
        remote = channel(team_a, "taotoken", cloud.base_url, model="qwen-plus", price_input_per_million="0.5",
                         price_output_per_million="2")
        down = channel(team_a, "old-box", f"http://127.0.0.1:{closed_port()}/v1", model="qwen-awq", kind="local")
        server = GatewayServer(connection.settings_dict["NAME"], TOKENWISE_STATIC_ROOT=str(static_root))
        try:
            sign_in(page, server.url, "alice", "pw-alice-123")
            page.click("nav.sidebar >> text=Compare")
            expect(page.locator("h1")).to_have_text("Compare")
            expect(page.locator("#column-0")).to_have_value(f"channel:{local.pk}")
            expect(page.locator("#column-1")).to_have_value(f"channel:{remote.pk}")
            expect(page.locator("#temperature")).to_have_value("0.7")

            page.click("#send")  # nothing typed yet
            expect(page.locator("#compare-error")).to_contain_text("empty message is not sent")
            page.fill("#message", "Explain prefix caching in one paragraph.")
            page.fill("#max-tokens", "99999999")
            page.click("#send")
            expect(page.locator("#compare-error")).to_contain_text("max_tokens must be from 1 to")
            page.fill("#max-tokens", "200")
            page.select_option("#column-2", f"channel:{down.pk}")
            page.fill("#system-prompt", "You are a concise assistant.")
            page.click("#send")
            expect(page.locator("#compare-error")).to_be_hidden()
            expect(page.locator(".conversations li.current")).to_contain_text("Explain prefix caching")

            columns = page.locator(".compare-column")
            expect(columns).to_have_count(3)
            first, second, third = (columns.nth(i).locator(".bubble.assistant") for i in range(3))
            # Both columns fill while they stream: text in each, neither finished.
            expect(first).to_contain_text("alpha bravo")
            expect(second).to_contain_text("alpha bravo")
            expect(columns.nth(0).locator(".pill")).to_have_text("streaming")
            expect(columns.nth(1).locator(".pill")).to_have_text("streaming")
            assert first.inner_text() != content_text(24) and second.inner_text() != content_text(18)
            screenshot(page, "compare-streaming")

            expect(columns.nth(0).locator(".pill")).to_have_text("done", timeout=20000)
            expect(columns.nth(1).locator(".pill")).to_have_text("done", timeout=20000)
            expect(first).to_have_text(content_text(24))
            expect(second).to_have_text(content_text(18))
            for index in (0, 1):
                ttft = columns.nth(index).locator("[data-metric=TTFT] dd")
                expect(ttft).to_contain_text(" ms")
                expect(columns.nth(index).locator("[data-metric=completion] dd")).not_to_have_text("–")
            expect(columns.nth(0).locator("[data-metric=cost] dd")).to_have_text("GPU 2.5/h, by the minute")
            expect(columns.nth(1).locator("[data-metric=cost] dd")).not_to_have_text("0")
            expect(columns.nth(2).locator(".pill")).to_have_text("failed")
            expect(columns.nth(2).locator(".diagnosis")).to_contain_text("Connection refused")
            expect(third).to_have_count(0)

            page.click("#diff-show")
            expect(page.locator("#diff del")).to_contain_text("sierra")  # only in the 24-word answer
            expect(page.locator("#diff")).to_contain_text("Similarity")
            screenshot(page, "compare-done")

            page.fill("#message", "A colour as JSON?")
            engine.behave("json_content")
            page.fill("#repeats", "3")
            page.click("#json-check")
            expect(columns.nth(0).locator(".check-result .rate")).to_have_text("0.0 % failed to parse", timeout=20000)
            expect(columns.nth(1).locator(".check-result .rate")).to_have_text("100.0 % failed to parse",
                                                                               timeout=20000)
            expect(columns.nth(1).locator(".check-result")).to_contain_text("above it")
            expect(columns.nth(2).locator(".check-result")).to_contain_text("3 requests failed", timeout=20000)
            expect(columns.nth(2).locator(".check-result .rate")).to_have_text("no answer to check")
            screenshot(page, "compare-json-check")

            page.click("#cache-check")
            expect(columns.nth(1).locator(".check-result")).to_contain_text("No clear drop", timeout=20000)
            expect(columns.nth(1).locator(".check-result li").first).to_contain_text("minimum length")
            expect(columns.nth(0).locator(".check-result")).to_contain_text("TTFT first → second", timeout=20000)
            expect(columns.nth(2).locator(".check-result .diagnosis")).to_contain_text("Connection refused")
            screenshot(page, "compare-cache-check")

            page.click("#share-toggle")
            expect(page.locator("#share-toggle")).to_contain_text("Shared with the team")
            page.reload()
            expect(page.locator(".compare-column").nth(0).locator(".bubble.assistant").first).to_have_text(
                content_text(24))
            expect(page.locator(".conversations li.current")).to_contain_text("Explain prefix caching")
        finally:
            server.stop()
