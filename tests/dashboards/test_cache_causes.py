"""The Cache tab says per replica why its prefix-cache hit rate is low: evictions (its KV cache full, requests
preempted), routing (requests sharing a prefix sent to different replicas) or the workload (few requests share a
prefix), from the engines' scraped samples and the gateway's hashes of prompts' heads and system prompts, wherever
the shared text sits; and a replica whose rate is fine says so."""
import os
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from panel.channels.models import Channel
from panel.dashboards.models import EngineSample
from panel.dashboards.pages import cache
from panel.dashboards.selectors import DashboardQuery
from panel.serving.models import Deployment
from panel.usage.models import RequestLog
from tests.support.browser import SHOTS, sign_in
from tests.support.dashboards import make_deployment


@pytest.fixture
def replicas(team_setup):
    team = team_setup["team_a"]
    first = make_deployment(team)
    rows = [first] + [Deployment.objects.create(team=team, profile=first.profile, host=first.host, state="ready",
                                                served_model_name="tiny-chat", base_url=f"http://127.0.0.1:{9 + i}/v1",
                                                replica_index=i, ready_at=first.ready_at) for i in range(1, 5)]
    channels = [Channel.objects.create(team=team, name=f"replica-{i}", kind="local", deployment=row,
                                       base_url=row.base_url, model_id="tiny-chat") for i, row in enumerate(rows)]
    return team, rows, channels


def sample(deployment, at, *, hits, kv, preemptions=0):
    EngineSample.objects.create(deployment=deployment, team_id=deployment.team_id, at=at, seconds=10,
                                prefix_queries=1000, prefix_hits=hits, prompt_tokens=1000, kv_cache_usage=kv,
                                preemptions=preemptions, running=1, waiting=0)


def request(team, channel, at, prompt_hash, head=None):
    """A usage row as the gateway writes it: with a system prompt, its head hash is the system prompt's (a long
    one fills the prompt's first 1,024 characters) unless given."""
    RequestLog.objects.create(team=team, channel=channel, created_at=at, endpoint="chat", model="tiny-chat",
                              status_code=200, outcome="ok", prompt_tokens=1000, latency_ms=100,
                              system_prompt_hash=prompt_hash, prompt_head_hash=prompt_hash if head is None else head)


def seed(replicas, now):
    """Five replicas over ten minutes: one whose KV cache filled, two that split shared system prompts between
    them, one whose requests share nothing, one whose cache works."""
    team, rows, channels = replicas
    start = now - timedelta(minutes=30)
    for minute in range(10):
        at = start + timedelta(minutes=minute)
        sample(rows[0], at, hits=200, kv=0.97 if minute == 5 else 0.6, preemptions=1 if minute > 7 else 0)
        sample(rows[1], at, hits=150, kv=0.3)
        sample(rows[2], at, hits=150, kv=0.3)
        sample(rows[3], at, hits=100, kv=0.3)
        sample(rows[4], at, hits=800, kv=0.5)
    for number in range(10):
        at = start + timedelta(minutes=number, seconds=1)
        request(team, channels[0], at, "tenant-a")  # one tenant, always here: the cache itself was too small
        request(team, channels[1 + number % 2], at, f"tenant-r{number % 3}")  # shared prompts, split between two
        request(team, channels[3], at, f"unique-{number}")  # nothing shared
        request(team, channels[4], at, "tenant-e")


def test_each_replica_with_a_low_hit_rate_is_given_its_likely_cause(replicas, client, team_setup):
    team, rows, _ = replicas
    now = datetime.now(timezone.utc)
    seed(replicas, now)
    page = cache(DashboardQuery(team=team, range="1h", now=now.timestamp()))
    table = page.table("cache_causes")
    found = {row[0].split(" #")[1]: dict(zip(table.columns, row)) for row in table.rows}
    by_replica = {str(row.pk): found[str(row.pk)] for row in rows}
    evicted, routed, routed_too, unshared, fine = by_replica.values()
    assert evicted["hit rate %"] == 20.0 and evicted["peak KV usage %"] == 97.0 and evicted["preempted"] == 2
    assert evicted["likely cause"] == "evictions: its KV cache was full (peak 97%, 2 preempted)"
    assert routed["sharing a prefix with an earlier one %"] == 60.0  # 3 of its 5 requests had a prompt seen before
    assert routed["of those, sent to another replica %"] == 100.0  # each time, the previous went to the other
    assert routed["likely cause"] == "routing: requests sharing a prefix went to different replicas"
    assert routed_too["likely cause"].startswith("routing")
    assert unshared["sharing a prefix with an earlier one %"] == 0.0
    assert unshared["likely cause"] == "workload: few requests share a prefix with an earlier one"
    assert fine["likely cause"] == "not low"

    client.force_login(team_setup["alice"])
    response = client.get(reverse("dashboards_cache") + "?range=1h")
    assert response.status_code == 200
    assert b"Why a replica&#x27;s prefix-cache hit rate is low" in response.content
    assert b"routing: requests sharing a prefix went to different replicas" in response.content


def test_shared_text_opening_the_user_turn_is_judged_by_the_prompts_head(replicas):
    """No system prompt: a document opens each user turn. Split between two replicas it is the routing, not the
    workload; kept on one replica, with a low hit rate and a full cache, it is the evictions. A short system prompt
    before varied turns still counts as shared by the system prompt's own hash."""
    team, rows, channels = replicas
    now = datetime.now(timezone.utc)
    start = now - timedelta(minutes=30)
    for minute in range(10):
        at = start + timedelta(minutes=minute)
        sample(rows[1], at, hits=150, kv=0.3)
        sample(rows[2], at, hits=150, kv=0.3)
        sample(rows[3], at, hits=100, kv=0.95)
        sample(rows[4], at, hits=300, kv=0.3)
    for number in range(10):
        at = start + timedelta(minutes=number, seconds=1)
        request(team, channels[1 + number % 2], at, "", head=f"document-{number % 3}")
        request(team, channels[3], at, "", head="contract")
        request(team, channels[4], at, "be-brief", head=f"question-{number}")
    page = cache(DashboardQuery(team=team, range="1h", now=now.timestamp()))
    table = page.table("cache_causes")
    found = {row[0].split(" #")[1]: dict(zip(table.columns, row)) for row in table.rows}
    split, split_too, full, short_system = (found[str(row.pk)] for row in rows[1:])
    assert split["requests"] == 5 and split["sharing a prefix with an earlier one %"] == 60.0
    assert split["of those, sent to another replica %"] == 100.0
    assert split["likely cause"] == "routing: requests sharing a prefix went to different replicas"
    assert split_too["likely cause"] == split["likely cause"]
    assert full["sharing a prefix with an earlier one %"] == 90.0 and full["of those, sent to another replica %"] == 0
    assert full["likely cause"] == "evictions: its KV cache was full (peak 95%, 0 preempted)"
    assert short_system["sharing a prefix with an earlier one %"] == 90.0
    assert short_system["likely cause"] == "none of these (short shared prefixes)"


def test_the_cache_tab_shows_the_causes_in_chromium(replicas, page, live_server, team_setup):
    seed(replicas, datetime.now(timezone.utc))
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/dashboards/cache/?range=1h")
    section = page.locator('[data-table="cache_causes"]')
    expect(section).to_contain_text("evictions: its KV cache was full")
    expect(section).to_contain_text("workload: few requests share a prefix")
    section.scroll_into_view_if_needed()
    os.makedirs(SHOTS, exist_ok=True)
    section.screenshot(path=os.path.join(SHOTS, "dashboards-cache-causes.png"))
