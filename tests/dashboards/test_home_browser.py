"""In Chromium: the overview page with a month of traffic, a live deployment and a failing channel, then the way
from "Needs attention" to the channel."""
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone
from playwright.sync_api import expect

from panel.channels.models import Channel
from panel.dashboards.rollup import usage_rollup_run
from panel.hosts.models import WorkerHost
from panel.serving.models import Deployment
from panel.usage.models import RequestLog
from tests.support.advisor_objects import make_host, make_model, make_profile, serve
from tests.support.browser import screenshot, sign_in


def test_it_answers_how_the_team_is_doing(page, live_server, team_setup):
    team = team_setup["team_a"]
    now = timezone.now()
    cloud = Channel.objects.create(team=team, name="taotoken", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("3"), price_output_per_million=Decimal("6"))
    deployment, local = serve(team, make_profile(team, make_model(team), "chat"), host=make_host("h200"))
    WorkerHost.objects.filter(host="h200").update(gpu_price_per_hour=Decimal("0.01"))
    since = max(now - timedelta(hours=1), now.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    Deployment.objects.filter(pk=deployment.pk).update(ready_at=since)
    RequestLog.objects.bulk_create(
        [RequestLog(team=team, channel=local, endpoint="chat", model="chat", status_code=200, outcome="ok",
                    latency_ms=90, prompt_tokens=20_000, created_at=now) for _ in range(30)]
        + [RequestLog(team=team, channel=cloud, endpoint="chat", model="chat", status_code=200, outcome="ok",
                      latency_ms=400, prompt_tokens=20_000, cost=Decimal("0.06"), created_at=now) for _ in range(10)])
    down = Channel.objects.create(team=team, name="cloud-eu", base_url="http://no-such-host.invalid/v1", model_id="m",
                                  last_test={"ok": False, "diagnosis": "no-such-host.invalid does not resolve"})
    usage_rollup_run(lock=False)

    sign_in(page, live_server.url, "alice", "pw-alice-123")
    expect(page.locator("[data-figure=requests] .stat-value")).to_have_text("40")
    expect(page.locator("[data-figure=local-share] .stat-value")).to_have_text("75%")
    expect(page.locator("[data-figure=savings]")).to_contain_text("of what taotoken would have charged")
    expect(page.locator("#deployments")).to_contain_text(f"chat #{deployment.pk}")
    expect(page.locator("#attention")).to_contain_text("no-such-host.invalid does not resolve")
    screenshot(page, "overview")
    page.click("#attention >> text=Channel cloud-eu")
    page.wait_for_url(f"{live_server.url}/channels/{down.pk}/")
