"""The admission's one Redis call (gateway/admission.py): per-minute limits, budgets and the session lookup together,
each with its own rules: a refused request is no turn of a session, budgets compare exactly past what a Lua number
holds, concurrent turns of one session get a turn each, and a dead Redis lets the request through."""
import asyncio
from dataclasses import replace
from decimal import Decimal

import pytest
import redis

from panel.accounts.keys import key_issue
from panel.budgets.counters import counter_keys, money_units, month_of
from panel.budgets.models import Budget
from panel.core import redis_client
from panel.gateway import admission
from panel.gateway.keys import KeyInfo
from tests.support.environment import REDIS_URL
from tests.support.fake_upstream import closed_port
from tests.support.waiting import run_coroutine

BODY = {"model": "chat", "messages": [{"role": "user", "content": "review main.py"}]}
SESSION = [(b"x-session-id", b"review-42")]


@pytest.fixture
def key(team_setup, monkeypatch, settings):
    monkeypatch.setattr(redis_client, "_client", None)  # a client of each test's own event loop
    settings.BUDGET_CACHE_SECONDS = 0  # a budget made in a test counts at once
    issued, _ = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent")
    return KeyInfo(id=issued.id, team_id=issued.team_id, allowed_models=(), rpm_limit=None, tpm_limit=None,
                   expires_at=None, revoked=False)


async def admitted(key, headers=SESSION):
    """The admission with its session fields in `.session`, whether it looked the session up before the upstream
    call (a key with limits or budgets) or after it (`session_lookup`)."""
    answer = await admission.admit(key, body=BODY, headers=headers)
    if answer.session_lookup is not None:
        answer.session = await admission.session_fields(asyncio.ensure_future(answer.session_lookup()))
    return answer


def admit(key, headers=SESSION):
    async def one():
        redis_client._client = None  # each call runs in an event loop of its own (the fixture restores it)
        return await admitted(key, headers)
    return run_coroutine(one())


@pytest.mark.django_db(transaction=True)
def test_a_request_refused_by_a_limit_or_a_budget_is_no_turn_of_its_session(key):
    limited = replace(key, rpm_limit=1)
    assert admit(limited).session["session_turn"] == 1
    refused = admit(limited)
    assert refused.rate_limited[0] == "requests per minute" and refused.session == {}
    Budget.objects.create(team_id=key.team_id, key_id=key.id, tokens_per_month=10)
    redis.Redis.from_url(REDIS_URL).set(counter_keys(month_of(), "key", key.id)[1], 10)
    spent = admit(key)
    assert "this key's monthly budget of 10 tokens is spent (10 tokens this month)" in spent.budget_spent
    assert spent.rate_limited is None and spent.session == {}
    Budget.objects.all().delete()
    unlimited = admit(key)  # no limits, no budgets: looked up after the first byte, with the same answer
    assert unlimited.session_lookup is not None
    assert unlimited.session == {"session_id": "review-42", "session_turn": 2, "repeated_share": 1.0}


@pytest.mark.django_db(transaction=True)
def test_a_budget_is_compared_exactly_past_what_a_lua_number_holds(key):
    limit = Decimal("90071992.55")  # 9,007,199,255,000,000 units: above 2**53, where doubles step by 2
    assert money_units(limit) > 2**53
    Budget.objects.create(team_id=key.team_id, money_per_month=limit)
    money = counter_keys(month_of(), "team", key.team_id)[0]
    redis.Redis.from_url(REDIS_URL).set(money, money_units(limit) - 1)  # one unit under: the same double
    assert admit(key).budget_spent is None
    redis.Redis.from_url(REDIS_URL).set(money, money_units(limit))
    assert "this team's monthly budget of 90071992.55 USD is spent" in admit(key).budget_spent


@pytest.mark.django_db(transaction=True)
def test_concurrent_turns_of_one_session_get_a_turn_each(key):
    async def together():
        redis_client._client = None
        return await asyncio.gather(*(admitted(key) for _ in range(8)))
    turns = sorted(answer.session["session_turn"] for answer in run_coroutine(together()))
    assert turns == list(range(1, 9))


@pytest.mark.django_db(transaction=True)
def test_without_redis_the_request_goes_without_session_fields(key, settings, caplog):
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    Budget.objects.create(team_id=key.team_id, tokens_per_month=1)
    answer = admit(replace(key, rpm_limit=1))
    assert (answer.rate_limited, answer.budget_spent, answer.session) == (None, None, {})
    assert "letting the request through" in caplog.text
    Budget.objects.all().delete()  # nothing to check first: only the session lookup, after the first byte
    answer = admit(key)
    assert answer.session_lookup is not None and answer.session == {}
    assert "the request is recorded without it" in caplog.text
