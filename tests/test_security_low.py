"""Attack tests for the security review's low findings (issue 26, item 7): a token count that ignored the key's
limits and budgets, a key cache that unknown keys flushed, client user ids stored as sent, a symlink alias of
another team's model folder, /metrics open behind a same-host proxy, metric labels from refused model names, data
files readable by every local user, and the launcher's Redis without a password."""
import secrets

import httpx
import pytest
import redis

from panel.accounts.keys import key_issue
from panel.budgets.counters import counter_keys, month_of
from panel.budgets.models import Budget
from tests.conftest import REDIS_URL, run_coroutine
from tests.fake_messages_upstream import FakeMessagesUpstream
from tests.gateway_server import GatewayServer
from tests.test_gateway import channel
from tests.test_gateway_messages import route_to

COUNT = {"model": "claude", "messages": [{"role": "user", "content": "Review the change in src/app.py please"}]}


@pytest.fixture
def gateway(transactional_db):
    from django.db import connection

    server = GatewayServer(connection.settings_dict["NAME"], TOKENWISE_BUDGET_CACHE_SECONDS="0")
    yield server
    server.stop()


@pytest.fixture
def counting_route(team_setup):
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-ant-0000", apis="messages") as fake:
        team = team_setup["team_a"]
        route_to(team, "claude", channel(team, "claude", fake, "claude-fake", key="sk-ant-0000", apis="messages"))
        yield fake


def count_tokens(gateway, raw):
    return httpx.post(f"{gateway.url}/v1/messages/count_tokens", json=COUNT, timeout=10,
                      headers={"x-api-key": raw, "anthropic-version": "2023-06-01"})


def test_count_tokens_keeps_to_the_keys_rate_limit(gateway, team_setup, counting_route):
    _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent", rpm_limit=2)
    assert [count_tokens(gateway, raw).status_code for _ in range(2)] == [200, 200]
    refused = count_tokens(gateway, raw)
    assert refused.status_code == 429 and "requests per minute" in refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert len(counting_route.requests) == 2  # the third never reached the provider


def test_count_tokens_is_refused_when_a_budget_is_spent_and_costs_nothing(gateway, team_setup, counting_route):
    team = team_setup["team_a"]
    key, raw = key_issue(team=team, user=team_setup["alice"], name="agent")
    Budget.objects.create(team=team, tokens_per_month=100)
    tokens = counter_keys(month_of(), "team", team.id)[1]
    store = redis.Redis.from_url(REDIS_URL)
    store.set(tokens, 99)
    answer = count_tokens(gateway, raw)
    assert answer.status_code == 200 and answer.json()["input_tokens"] > 0
    assert int(store.get(tokens)) == 99  # a count is not charged
    store.set(tokens, 100)
    refused = count_tokens(gateway, raw)
    assert refused.status_code == 402 and "budget" in refused.json()["error"]["message"]
    Budget.objects.all().delete()
    Budget.objects.create(team=team, key=key, tokens_per_month=5)
    store.set(counter_keys(month_of(), "key", key.id)[1], 5)
    assert count_tokens(gateway, raw).status_code == 402
    assert len(counting_route.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_unknown_keys_does_not_evict_a_known_key_from_the_gateway_cache(team_setup, settings, monkeypatch):
    from panel.accounts.models import TeamKey
    from panel.gateway import keys

    settings.KEY_CACHE_SECONDS = 600
    monkeypatch.setattr(keys, "CACHE", keys.KeyCache())
    key, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent")
    assert run_coroutine(keys.key_lookup(raw)).id == key.id
    for _ in range(60_000):  # what key_lookup does with each random key an attacker sends
        keys.CACHE.put(secrets.token_hex(32), None)
    # The row no longer matches: only the cache can still answer for the key.
    TeamKey.objects.filter(id=key.id).update(key_hash="0" * 64)
    served = run_coroutine(keys.key_lookup(raw))
    assert served is not None and served.id == key.id
    assert len(keys.CACHE.unknown) <= keys.UNKNOWN_KEYS_CACHED
