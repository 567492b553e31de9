"""The engine scraper against a fake /metrics server: current and older vLLM names, deltas between scrapes, a
counter reset (an engine restart), and a /metrics that is down, slow, an HTTP error or garbage (a gap with a
warning; the other deployments are still scraped)."""
import http.server
import threading
import time

import pytest

from panel.dashboards.models import EngineSample
from panel.dashboards.scraper import deployment_scrape, deployments_scrape, parse_metrics
from panel.dashboards.selectors import DashboardQuery, engine_by_deployment, engine_percentile
from tests.support.dashboards import make_deployment


def vllm_text(*, queries, hits, prompt, generation, ttft_counts, kv=0.25, old=False):
    """/metrics as vLLM writes it (labels per model and engine); `ttft_counts` are cumulative per bucket."""
    labels = 'engine="0",model_name="tiny-chat"'
    prefix = "gpu_" if old else ""
    kv_name = "vllm:gpu_cache_usage_perc" if old else "vllm:kv_cache_usage_perc"
    itl = "vllm:time_per_output_token_seconds" if old else "vllm:inter_token_latency_seconds"
    lines = [
        f"# HELP vllm:{prefix}prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        f"# TYPE vllm:{prefix}prefix_cache_queries_total counter",
        f"vllm:{prefix}prefix_cache_queries_total{{{labels}}} {queries}",
        f"vllm:{prefix}prefix_cache_queries_created{{{labels}}} 1.7e9",
        f"# TYPE vllm:{prefix}prefix_cache_hits_total counter",
        f"vllm:{prefix}prefix_cache_hits_total{{{labels}}} {hits}",
        "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{{{labels}}} {prompt}",  # hand-written style
        "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{labels}}} {generation}",
        f"# TYPE {kv_name} gauge", f"{kv_name}{{{labels}}} {kv}",
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} 2.0",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} 1.0",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for bound, count in zip(("0.01", "0.1", "1.0", "+Inf"), ttft_counts):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{bound}"}} {count}')
    lines += [f"vllm:time_to_first_token_seconds_count{{{labels}}} {ttft_counts[-1]}",
              f"vllm:time_to_first_token_seconds_sum{{{labels}}} {0.05 * ttft_counts[-1]}",
              f"# TYPE {itl} histogram", f'{itl}_bucket{{{labels},le="0.02"}} 5',
              f'{itl}_bucket{{{labels},le="+Inf"}} 6',
              f"{itl}_count{{{labels}}} 6", f"{itl}_sum{{{labels}}} 0.1"]
    return "\n".join(lines) + "\n"


class FakeMetrics:
    """An HTTP server whose /metrics answers whatever `body`, `status` and `delay` say."""

    def __init__(self):
        self.body, self.status, self.delay = "", 200, 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                time.sleep(fake.delay)
                data = fake.body.encode()
                try:
                    self.send_response(fake.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeMetrics()
    yield server
    server.close()


def test_it_parses_current_and_older_names_alike():
    for old in (False, True):
        parsed = parse_metrics(vllm_text(queries=100, hits=40, prompt=120, generation=30, ttft_counts=(1, 3, 4, 4),
                                         old=old))
        assert parsed["counters"] == {"prefix_queries": 100, "prefix_hits": 40, "prompt_tokens": 120,
                                      "generation_tokens": 30}, old
        assert parsed["gauges"] == {"kv_cache_usage": 0.25, "running": 2.0, "waiting": 1.0}
        assert parsed["histograms"]["ttft"]["le"] == {"0.01": 1, "0.1": 3, "1.0": 4, "+Inf": 4}
        assert parsed["histograms"]["itl"]["count"] == 6


def test_it_stores_deltas_handles_a_restart_and_records_gaps(fake, team_setup, settings, caplog):
    settings.DASHBOARDS_SCRAPE_TIMEOUT_SECONDS = 1
    deployment = make_deployment(team_setup["team_a"])
    deployment.base_url = fake.base_url
    deployment.save()
    fake.body = vllm_text(queries=100, hits=40, prompt=120, generation=30, ttft_counts=(1, 3, 4, 4))
    first = deployment_scrape(deployment=deployment)
    assert first.ok and first.prefix_queries == 0 and first.kv_cache_usage == 0.25  # the baseline only
    fake.body = vllm_text(queries=300, hits=190, prompt=320, generation=80, ttft_counts=(1, 5, 8, 9))
    second = deployment_scrape(deployment=deployment)
    assert (second.prefix_queries, second.prefix_hits, second.prompt_tokens, second.generation_tokens) == (
        200, 150, 200, 50)
    assert second.ttft["le"] == {"0.01": 0, "0.1": 2, "1.0": 4, "+Inf": 5} and second.ttft["count"] == 5
    assert not second.restarted and second.seconds > 0

    # Faults: each is a gap with the reason, and a warning in the log.
    cases = [("garbage", lambda: setattr(fake, "body", "<html>\x00 not { prometheus")),
             ("HTTP 500", lambda: (setattr(fake, "status", 500), setattr(fake, "body", "oops"))),
             ("none of vLLM's metrics", lambda: (setattr(fake, "status", 200),
                                                   setattr(fake, "body", "# TYPE up gauge\nup 1\n"))),
             ("did not answer within 1 s", lambda: (setattr(fake, "delay", 2), setattr(fake, "body", "x 1\n")))]
    for words, arrange in cases:
        arrange()
        gap = deployment_scrape(deployment=deployment)
        assert not gap.ok and (words in gap.warning or words == "garbage" and "not Prometheus text" in gap.warning), (
            words, gap.warning)
    assert "scrape of deployment" in caplog.text
    fake.delay = 0

    # The engine restarted: its counters start again from zero. The delta is what it counted since.
    fake.body = vllm_text(queries=50, hits=20, prompt=60, generation=10, ttft_counts=(0, 1, 2, 2))
    after = deployment_scrape(deployment=deployment)
    assert after.ok and after.restarted
    assert (after.prefix_queries, after.prefix_hits, after.ttft["count"]) == (50, 20, 2)

    totals = engine_by_deployment(DashboardQuery(team=team_setup["team_a"], range="1h"))
    (total,) = totals
    assert (total["prefix_queries"], total["prefix_hits"], total["gaps"]) == (250, 170, 4)
    assert total["hit_rate"] == pytest.approx(170 / 250)
    assert total["ttft"]["count"] == 7
    assert 0.01 < engine_percentile(total["ttft"], 0.5) <= 1.0


def test_a_deployment_that_is_down_does_not_stop_the_others(fake, team_setup, settings):
    settings.DASHBOARDS_SCRAPE_TIMEOUT_SECONDS = 1
    down = make_deployment(team_setup["team_a"])  # http://127.0.0.1:9: nothing listens there
    up = make_deployment(team_setup["team_b"])
    up.base_url = fake.base_url
    up.save()
    fake.body = vllm_text(queries=1, hits=0, prompt=1, generation=1, ttft_counts=(0, 0, 1, 1))
    samples = deployments_scrape()
    assert {(sample.deployment_id, sample.ok) for sample in samples} == {(down.pk, False), (up.pk, True)}
    gap = EngineSample.objects.get(deployment=down)
    assert "unreachable" in gap.warning


def test_it_compacts_old_samples_without_losing_counts(fake, team_setup):
    from datetime import timedelta

    from django.utils import timezone

    from panel.dashboards.compaction import engine_samples_compact

    deployment = make_deployment(team_setup["team_a"])
    now = timezone.now()
    rows = []
    for i in range(3 * 360):  # three hours of scrapes every 10 s, one in 36 failed
        at = now - timedelta(seconds=10 * i)
        if i % 36 == 5:
            rows.append(EngineSample(deployment=deployment, team=deployment.team, at=at, ok=False, gaps=1,
                                     warning="/metrics answered HTTP 500"))
        else:
            rows.append(EngineSample(deployment=deployment, team=deployment.team, at=at, prefix_queries=10,
                                     prefix_hits=4, kv_cache_usage=0.5, seconds=10,
                                     ttft={"le": {"0.1": 1, "+Inf": 1}, "count": 1, "sum": 0.05},
                                     cumulative={"counters": {"prefix_queries": 1e6 - i}}))
    EngineSample.objects.bulk_create(rows)
    query = DashboardQuery(team=team_setup["team_a"], range="24h", now=now.timestamp() + 1)
    before = engine_by_deployment(query)[0]
    removed = engine_samples_compact(now=now)
    assert removed > 550 and EngineSample.objects.count() < 500  # two hours of 10 s rows became 120 minute rows
    assert EngineSample.objects.filter(period=60).exists() and EngineSample.objects.filter(period=0).exists()
    after = engine_by_deployment(query)[0]
    for name in ("prefix_queries", "prefix_hits", "gaps"):
        assert after[name] == before[name], name
    assert after["ttft"]["count"] == before["ttft"]["count"] and after["kv"] == pytest.approx(0.5)
    assert engine_samples_compact(now=now) == 0  # already compacted
    # The newest good sample still carries the cumulative values the next scrape subtracts.
    latest = EngineSample.objects.filter(ok=True).order_by("-at").first()
    assert latest.cumulative["counters"]["prefix_queries"] == 1e6
