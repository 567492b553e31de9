"""A vLLM pool's engines (started outside the panel) on the dashboards, against a real Prometheus-text server: the
scraper reads each scrape URL with the pool's token and stores one sample for the pool (deltas and queues summed,
an engine that fails counted as a gap and its missed counts taken up when it answers again); the Latency and Cache
tabs name the pool beside the deployments; the ledger sets its engines' token counters against the pool channel's
usage rows (and notifies a difference); the Cost tab charges its GPUs × its price per GPU-hour."""
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.utils import timezone

from panel.channels.models import Channel, ChannelKind
from panel.channels.services import channel_create
from panel.dashboards.compaction import engine_samples_compact
from panel.dashboards.cost import cost_summary
from panel.dashboards.home import ledger_differences
from panel.dashboards.ledger import deployment_ledger, ledgers_check
from panel.dashboards.models import EngineSample
from panel.dashboards.pages import dashboard_page
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.scraper import pool_scrape, pools_scrape
from panel.dashboards.selectors import DashboardQuery, engine_by_deployment
from panel.usage.models import RequestLog
from tests.support.channels import remote
from tests.support.dashboards import make_deployment
from tests.support.prometheus_text import PrometheusText, vllm_metrics

TOKEN = "pool-scrape-token-4242"


@pytest.fixture
def engines():
    server = PrometheusText(token=TOKEN)
    server.bodies["/a/metrics"] = vllm_metrics(prompt=1000, generation=100, queries=800, hits=200, waiting=1,
                                               running=2, kv=0.2, ttft=(1, 2, 2))
    server.bodies["/b/metrics"] = vllm_metrics(prompt=500, generation=50, queries=400, hits=100, waiting=3,
                                               running=1, kv=0.4, ttft=(0, 1, 1))
    yield server
    server.close()


def make_pool(team, engines, **extra):
    return channel_create(team=team, name="gpu-pool", kind=ChannelKind.POOL, base_url="http://127.0.0.1:9/v1",
                          model_id="pool-chat", scrape_urls=f"{engines.url('/a/metrics')}\n{engines.url('/b/metrics')}",
                          scrape_token=TOKEN, **extra)


def test_it_scrapes_each_engine_with_the_token_and_sums_them_into_one_sample(engines, team_setup, caplog):
    pool = make_pool(team_setup["team_a"], engines)
    first = pool_scrape(channel=pool)
    assert first.ok and first.channel_id == pool.pk and first.deployment_id is None and not first.gaps
    assert (first.prompt_tokens, first.running, first.waiting) == (0, 3, 4)  # a baseline; the queues as read
    assert first.kv_cache_usage == pytest.approx(0.3)
    assert {path for path, _ in engines.seen} == {"/a/metrics", "/b/metrics"}
    assert {auth for _, auth in engines.seen} == {f"Bearer {TOKEN}"}

    engines.bodies["/a/metrics"] = vllm_metrics(prompt=1600, generation=160, queries=1400, hits=500, ttft=(2, 4, 5))
    engines.bodies["/b/metrics"] = vllm_metrics(prompt=900, generation=90, queries=600, hits=250, ttft=(1, 2, 3))
    second = pool_scrape(channel=pool)
    assert (second.prompt_tokens, second.generation_tokens, second.prefix_queries, second.prefix_hits) == (
        1000, 100, 800, 450)
    assert second.ttft["count"] == 5 and second.ttft["le"] == {"0.1": 2, "1.0": 3, "+Inf": 5}
    assert second.seconds > 0 and not second.restarted

    # Engine b fails: a gap that names it, while a is still counted; b's missed counts come with its next answer.
    engines.statuses["/b/metrics"] = 500
    engines.bodies["/a/metrics"] = vllm_metrics(prompt=1700, generation=170, queries=1400, hits=500, ttft=(2, 4, 5))
    engines.bodies["/b/metrics"] = vllm_metrics(prompt=1200, generation=120, queries=600, hits=250, ttft=(1, 2, 3))
    partial = pool_scrape(channel=pool)
    assert partial.ok and partial.gaps == 1 and engines.url("/b/metrics") in partial.warning
    assert "HTTP 500" in partial.warning and (partial.prompt_tokens, partial.generation_tokens) == (100, 10)
    assert "scrape of pool channel" in caplog.text
    del engines.statuses["/b/metrics"]
    back = pool_scrape(channel=pool)
    assert (back.prompt_tokens, back.generation_tokens, back.gaps) == (300, 30, 0)

    # A restarted engine counts from zero; every engine down, or a wrong token, is a gap in words.
    engines.bodies["/a/metrics"] = vllm_metrics(prompt=40, generation=4)
    assert pool_scrape(channel=pool).restarted
    engines.token = "another"
    down = pool_scrape(channel=pool)
    assert not down.ok and down.gaps == 2 and down.warning.count("HTTP 401") == 2
    totals = engine_by_deployment(DashboardQuery(team=team_setup["team_a"], range="1h"))
    assert [(total["source"], total["prompt_tokens"], total["gaps"]) for total in totals] == [
        (("pool", pool.pk), 1000 + 100 + 300 + 40, 3)]


def test_the_scrape_task_reads_enabled_pools_only_and_one_failing_pool_stops_none(engines, team_setup):
    pool = make_pool(team_setup["team_a"], engines)
    broken = channel_create(team=team_setup["team_b"], name="gone", kind=ChannelKind.POOL,
                            base_url="http://127.0.0.1:9/v1", model_id="m", scrape_urls="http://127.0.0.1:9/metrics")
    off = make_pool(team_setup["team_b"], engines)
    Channel.objects.filter(pk=off.pk).update(enabled=False)
    samples = pools_scrape()
    assert {(sample.channel_id, sample.ok) for sample in samples} == {(pool.pk, True), (broken.pk, False)}
    assert "unreachable" in EngineSample.objects.get(channel=broken).warning


def test_the_latency_and_cache_tabs_show_the_pool_beside_a_deployment(engines, team_setup):
    team = team_setup["team_a"]
    pool = make_pool(team, engines)
    deployment = make_deployment(team)
    now = timezone.now()
    EngineSample.objects.create(deployment=deployment, team=team, at=now - timedelta(minutes=3), seconds=10,
                                prefix_queries=100, prefix_hits=10, waiting=0, kv_cache_usage=0.1,
                                ttft={"le": {"0.1": 1, "+Inf": 1}, "count": 1, "sum": 0.05})
    pool_scrape(channel=pool)
    engines.bodies["/a/metrics"] = vllm_metrics(prompt=1600, generation=160, queries=1400, hits=500, waiting=5,
                                                ttft=(2, 4, 5))
    pool_scrape(channel=pool)
    query = DashboardQuery(team=team, range="1h", now=timezone.now().timestamp() + 1)
    cache = dashboard_page(tab="cache", query=query)
    rows = {row[0]: row for row in cache.table("cache").rows}
    assert set(rows) == {"pool gpu-pool", f"tiny-chat #{deployment.pk}"}
    assert rows["pool gpu-pool"][1:3] == [600, 300]  # prefix queries and hits, as the pool's engines counted them
    assert {trace["name"] for trace in cache.figures["hit_rate"]["data"]} == {"pool gpu-pool",
                                                                              f"tiny-chat #{deployment.pk}"}
    latency = dashboard_page(tab="latency", query=query)
    assert "engine p95 · pool gpu-pool" in {trace["name"] for trace in latency.figures["ttft"]["data"]}
    queue = {trace["name"]: trace["y"] for trace in latency.figures["queue"]["data"]}
    assert queue["pool gpu-pool"] and max(queue["pool gpu-pool"]) >= 4  # engine a's 5 waiting and b's 3, averaged
    # The pool's channel as the filter: its samples alone.
    only = DashboardQuery(team=team, range="1h", now=query.now, channel_id=pool.pk)
    assert [total["source"] for total in engine_by_deployment(only)] == [("pool", pool.pk)]


def test_the_ledger_sets_the_pools_engines_against_its_usage_rows_and_notifies_a_difference(engines, team_setup):
    team = team_setup["team_a"]
    pool = make_pool(team, engines)
    hour = int(timezone.now().timestamp() // 3600 * 3600) - 3600  # the last whole hour
    at = datetime.fromtimestamp(hour + 1800, tz=dt_timezone.utc)
    for _ in range(2):  # 2 x (1,000 + 100) tokens charged through the gateway
        RequestLog.objects.create(team=team, channel=pool, created_at=at, endpoint="chat", model="pool-chat",
                                  status_code=200, outcome="ok", prompt_tokens=1000, completion_tokens=100,
                                  latency_ms=100)
    EngineSample.objects.create(channel=pool, team=team, at=at, seconds=10, prompt_tokens=2000, generation_tokens=205)
    usage_rollup_run()
    query = DashboardQuery(team=team, range="24h", now=hour + 3600)
    [line] = deployment_ledger(query)
    assert (line.source, line.engine_tokens, line.recorded_tokens, line.agrees) == (("pool", pool.pk), 2205, 2200,
                                                                                    True)
    table = dashboard_page(tab="cost", query=query).table("ledger")
    assert table.rows[0][:3] == ["pool gpu-pool", 2205, 2200]
    # Engine work that never went through the gateway: the ledger names it, beat notifies it once, the overview
    # lists it with a link to the pool's figures.
    EngineSample.objects.create(channel=pool, team=team, at=at, seconds=10, prompt_tokens=800, generation_tokens=0)
    [line] = deployment_ledger(query)
    assert not line.agrees and line.words.startswith("the engine served")
    [note] = ledgers_check(now=hour + 3600 + 60)
    assert note.title.startswith("vLLM pool gpu-pool: its engine's token count differs") and \
        note.facts["pool_channel_id"] == pool.pk
    assert ledgers_check(now=hour + 3600 + 60) == []  # once an hour
    [attention] = ledger_differences(team, hour + 3600)
    assert attention.what.startswith("vLLM pool gpu-pool: ledger differs") and f"channel={pool.pk}" in attention.link


def test_the_cost_tab_charges_the_pools_gpus_at_its_price_per_gpu_hour(engines, team_setup):
    team = team_setup["team_a"]
    pool = make_pool(team, engines, gpu_count=2, price_per_gpu_hour=Decimal("1.5"))
    Channel.objects.filter(pk=pool.pk).update(created_at=timezone.now() - timedelta(hours=10))
    now = timezone.now().timestamp()
    RequestLog.objects.create(team=team, channel=pool, created_at=timezone.now() - timedelta(minutes=5),
                              endpoint="chat", model="pool-chat", status_code=200, outcome="ok", prompt_tokens=3000,
                              completion_tokens=1000, latency_ms=100)
    usage_rollup_run()
    summary = cost_summary(DashboardQuery(team=team, range="1h", now=now))
    [line] = summary.lines
    assert (line.name, line.kind, line.tokens, line.hourly) == ("gpu-pool", "local", 4000, 3.0)
    # The range starts at a whole step, a little over an hour before now.
    assert line.gpu_hours == pytest.approx(1.0, abs=0.05) and line.cost == pytest.approx(3 * line.gpu_hours)
    assert summary.local_cost == line.cost and not summary.missing_prices
    # A pool that served nothing in the range still costs its GPU hours; one without a price makes the cost unknown.
    earlier = DashboardQuery(team=team, range="1h", now=now - 7200)
    [idle] = cost_summary(earlier).lines
    assert idle.name == "gpu-pool (idle)" and idle.requests == 0 and idle.gpu_hours > 0.9
    Channel.objects.filter(pk=pool.pk).update(price_per_gpu_hour=None)
    unknown = cost_summary(DashboardQuery(team=team, range="1h", now=now))
    assert unknown.local_unknown and unknown.missing_prices == [
        "the vLLM pool gpu-pool (its channel's price per GPU-hour)"]


def test_a_pool_is_never_the_cloud_baseline_even_when_it_carried_the_most(engines, team_setup):
    """The cloud figure prices local traffic at the remote channel that carried the most; a pool is local GPUs."""
    team = team_setup["team_a"]
    pool = make_pool(team, engines, gpu_count=1, price_per_gpu_hour=Decimal("1"))
    cloud = remote(team, price_input_per_million=Decimal("2"), price_output_per_million=Decimal("8"))
    at = timezone.now() - timedelta(minutes=5)
    for channel, tokens in ((pool, 9000), (cloud, 100)):
        RequestLog.objects.create(team=team, channel=channel, created_at=at, endpoint="chat", model="m",
                                  status_code=200, outcome="ok", prompt_tokens=tokens, completion_tokens=tokens,
                                  latency_ms=100)
    usage_rollup_run()
    summary = cost_summary(DashboardQuery(team=team, range="1h", now=timezone.now().timestamp()))
    assert summary.baseline_channel == cloud
    [pool_line] = [line for line in summary.lines if line.name == "gpu-pool"]
    assert pool_line.baseline == pytest.approx(9000 * (2 + 8) / 1e6)  # the pool's tokens at the cloud's prices


def test_compaction_keeps_a_pools_samples_apart_from_a_deployments(team_setup, engines):
    team = team_setup["team_a"]
    pool = make_pool(team, engines)
    deployment = make_deployment(team)
    old = timezone.now() - timedelta(hours=3)
    rows = []
    for i in range(12):
        rows.append(EngineSample(channel=pool, team=team, at=old + timedelta(seconds=5 * i), prompt_tokens=10,
                                 cumulative={"engines": {"x": i}}))
        rows.append(EngineSample(deployment=deployment, team=team, at=old + timedelta(seconds=5 * i),
                                 prompt_tokens=1))
    EngineSample.objects.bulk_create(rows)
    engine_samples_compact()
    pooled = EngineSample.objects.filter(channel=pool)
    assert sum(sample.prompt_tokens for sample in pooled) == 120 and all(s.period for s in pooled)
    assert pooled.order_by("-at").first().cumulative == {"engines": {"x": 11}}
    assert sum(sample.prompt_tokens for sample in EngineSample.objects.filter(deployment=deployment)) == 12
