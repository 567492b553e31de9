"""A web process's advance on a busy key's limits and budgets (gateway/advances.py): requests admitted in memory once
the advance is taken, held in Redis all along so that other processes see it, what a request did not use given back to
the advance, none taken near a limit, and given back whole when idle or when the key's limits change."""
import asyncio
from dataclasses import replace

import pytest
import redis

from panel.accounts.keys import key_issue
from panel.budgets import enforcement
from panel.budgets.counters import counter_keys, held_keys, month_of
from panel.budgets.models import Budget
from panel.core import redis_client
from panel.gateway import admission, advances, rate_limits
from panel.gateway.keys import KeyInfo
from tests.support.environment import REDIS_URL
from tests.support.waiting import run_coroutine

BODY = {"model": "chat", "messages": [{"role": "user", "content": "review main.py"}], "max_tokens": 100}


@pytest.fixture
def key(team_setup, monkeypatch, settings):
    monkeypatch.setattr(redis_client, "_client", None)  # a client of each test's own event loop
    monkeypatch.setattr(advances, "_advances", {})
    monkeypatch.setattr(advances, "_seen", {})
    settings.BUDGET_CACHE_SECONDS = 0  # a budget made in a test counts at once
    issued, _ = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent")
    return KeyInfo(id=issued.id, team_id=issued.team_id, allowed_models=(), rpm_limit=600, tpm_limit=None,
                   expires_at=None, revoked=False)


def counters(key):
    store = redis.Redis.from_url(REDIS_URL)
    month = month_of()
    held = [int(value or 0) for value in store.mget(held_keys(month, "key", key.id))]
    spent = [int(value or 0) for value in store.mget(counter_keys(month, "key", key.id))]
    window = int(store.get(rate_limits.window_keys(key.id, rate_limits.window()[0])[0]) or 0)
    return {"held": held, "spent": spent, "window": window}


async def settled():
    """Until the advances' background calls are done."""
    while advances._pending:
        await asyncio.gather(*list(advances._pending))


def script_calls(monkeypatch):
    """The admission script's calls from here on."""
    calls = []
    original = admission.admit_script

    def counted():
        calls.append(1)
        return original()
    monkeypatch.setattr(admission, "admit_script", counted)
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_busy_keys_requests_are_admitted_from_its_advance_held_in_redis_and_settled_exactly(key, monkeypatch):
    Budget.objects.create(team_id=key.team_id, key_id=key.id, tokens_per_month=100_000)

    async def scenario():
        first = [await admission.admit(key, body=dict(BODY), headers=[]) for _ in range(2)]
        await settled()  # the second request of the key took an advance
        taken = counters(key)
        calls = script_calls(monkeypatch)
        fast = [await admission.admit(key, body=dict(BODY), headers=[]) for _ in range(10)]
        during = counters(key)
        for answer in first + fast:
            await enforcement.count(key, 0, 60, reservation=answer.reservation)  # each used 60 of its tokens
        after = counters(key)
        await advances.give_back_all()
        return first, fast, taken, calls, during, after

    first, fast, taken, calls, during, after = run_coroutine(scenario())
    most = first[0].reservation.tokens  # the prompt's bound and max_tokens 100
    assert all(answer.reservation.pool is None for answer in first)  # the first two by the script
    assert calls == [] and all(answer.reservation.pool is not None for answer in fast)  # no Redis call
    assert all(answer.session_lookup is not None for answer in fast)  # their sessions after the first byte
    advance = 16 * most  # sixteen requests' worth, well under a tenth of what is left
    # Taken: sixteen requests in the window beside the first two, the budget's part held beside their holds
    assert taken["window"] == 2 + 16 and taken["held"][1] == 2 * most + advance
    assert during == taken  # ten requests admitted from it: Redis unchanged
    assert after["spent"][1] == 12 * 60  # counted exactly
    assert after["held"][1] == advance - 10 * 60  # the advance less what its requests spent; theirs back to it
    assert counters(key)["held"] == [0, 0] and counters(key)["window"] == 12  # given back: the twelve requests


@pytest.mark.django_db(transaction=True)
def test_no_advance_near_a_limit_and_one_under_other_limits_is_given_back(key, monkeypatch):
    budget = Budget.objects.create(team_id=key.team_id, key_id=key.id, tokens_per_month=1000)

    async def near():
        for _ in range(3):
            await admission.admit(key, body=dict(BODY), headers=[])
            await settled()
        return counters(key)

    most = run_coroutine(near())["held"][1] // 3
    assert most > 1000 // 10 and advances._advances == {}  # a tenth of what is left covers no request: none taken
    assert counters(key)["window"] == 3

    budget.tokens_per_month = 1_000_000
    budget.save()

    async def changed():
        for _ in range(2):  # the first by the script, which takes an advance; the second from the advance
            await admission.admit(key, body=dict(BODY), headers=[])
            await settled()
        with_advance, old = counters(key), next(iter(advances._advances.values()))
        calls = script_calls(monkeypatch)
        # The key's limit changed (its cache read it again): the advance taken under the old one is given back
        await admission.admit(replace(key, rpm_limit=300), body=dict(BODY), headers=[])
        await settled()
        return with_advance, old, calls, counters(key)

    with_advance, old, calls, after = run_coroutine(changed())
    assert with_advance["held"][1] == 4 * most + 16 * most and with_advance["window"] == 4 + 16
    assert calls == [1] and not old.live  # admitted by the script; the old advance given back
    new = next(iter(advances._advances.values()))
    assert new is not old and new.terms[0] == 300  # a new one taken under the new limit
    # Held: four requests by the script, one from the old advance (in flight: its hold stays), the fifth by the
    # script, and the new advance; the old advance's fifteen unused requests left the window
    assert after["held"][1] == 6 * most + 16 * most and after["window"] == 20 - 15 + 1 + 16


@pytest.mark.django_db(transaction=True)
def test_an_idle_advance_is_given_back(key, settings):
    settings.GATEWAY_ADVANCE_IDLE_SECONDS = 1
    key = replace(key, rpm_limit=None)
    Budget.objects.create(team_id=key.team_id, key_id=key.id, tokens_per_month=100_000)

    async def idle():
        answers = [await admission.admit(key, body=dict(BODY), headers=[]) for _ in range(2)]
        await settled()
        held = counters(key)["held"][1]
        for answer in answers:
            await enforcement.count(key, 0, 10, reservation=answer.reservation)
        await asyncio.sleep(2.5)  # the sweeper gives it back after a second unused
        await settled()
        return held, counters(key), advances._advances

    held, after, left = run_coroutine(idle())
    assert held > 2 * 100 and left == {}
    assert after["held"] == [0, 0] and after["spent"][1] == 20
