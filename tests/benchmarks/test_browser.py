"""A benchmark run launched from the page, run by a real default worker against a fake cloud channel, watched
through the live region until its figures appear; then two runs compared with their charts. Run under
`flock /tmp/tw-heavy.lock` (a worker and Chromium)."""
from django.urls import reverse

from panel.benchmarks.models import BenchmarkRun
from panel.benchmarks.services import benchmark_execute, benchmark_launch
from panel.channels.models import Channel
from tests.support.browser import screenshot, sign_in
from tests.support.fake_upstream import FakeUpstream


def test_it_runs_a_benchmark_from_the_page_with_live_progress(start_worker, team_setup, live_server, page):
    team = team_setup["team_a"]
    start_worker("long")
    with FakeUpstream(chunks=30, chunk_delay=0.04) as fake:  # 80 requests, 4 at a time: about 25 s
        channel = Channel.objects.create(team=team, name="cloud-fake", kind="remote", base_url=fake.base_url,
                                         model_id="fake-model", credential_kind="none", timeout_seconds=10)
        sign_in(page, live_server.url, "alice", "pw-alice-123")
        page.goto(f"{live_server.url}{reverse('benchmarks')}")
        page.select_option("#id_target", f"channel:{channel.pk}")
        page.fill("#id_name", "cloud, 4 in flight")
        page.fill("#id_requests", "80")
        page.fill("#id_concurrency", "4")
        page.fill("#id_output_tokens", "30")
        page.fill("#id_slo_e2el_ms", "60000")
        page.click("text=Start benchmark")
        page.wait_for_url("**/benchmarks/runs/*/")
        # The live region moves through the run: some requests done, not all.
        page.wait_for_selector("text=/request [1-9][0-9]* of 80/", timeout=60000)
        screenshot(page, "benchmarks-run-progress")
        page.wait_for_selector("text=Output token throughput", timeout=60000)
        run = BenchmarkRun.objects.get(name="cloud, 4 in flight")
        assert run.state == "succeeded" and run.result["failed"] == 0 and run.result["completed"] == 80
        assert fake.request_count == 82  # two warm-up requests, not counted
        text = page.inner_text("main").lower()  # table headers are styled in capitals
        for figure in ("ttft", "tpot", "itl", "e2el", "mean", "median", "std", "p90", "p99", "request goodput"):
            assert figure in text, figure
        # 30 chunks 40 ms apart: vLLM's TPOT and the per-token ITL are both about the fake's delay, never ~0.
        assert 30 <= run.result["median_itl_ms"] < 200 and 30 <= run.result["median_tpot_ms"] < 200
        assert run.result["request_goodput"] is not None and run.result["goodput_slo"] == {"e2el": 60000.0}
        assert "export as vllm result json" in text
        assert page.get_attribute("[role=progressbar]", "aria-valuenow") == "100"
        screenshot(page, "benchmarks-run")

        fake.chunk_delay = 0.01
        other = benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk,
                                 name="cloud, 8 in flight", requests=40, concurrency=8, output_tokens=30, enqueue=False)
        benchmark_execute(run_id=other.pk, worker="test")

    page.goto(f"{live_server.url}{reverse('benchmarks')}")
    page.check(f"input[name=run][value='{run.pk}']")
    page.check(f"input[name=run][value='{other.pk}']")
    screenshot(page, "benchmarks-home")
    page.click("text=Compare selected")
    page.wait_for_selector("[data-plotly] .main-svg")
    assert page.locator("[data-plotly] .main-svg").count() >= 2
    table = page.inner_text("table.compare").lower()  # the header row is styled in capitals
    assert "cloud, 4 in flight" in table and "cloud, 8 in flight" in table and "p99 ttft" in table
    screenshot(page, "benchmarks-compare")
