"""The caches on the gateway's hot path kept fresh by refreshers (panel/core/refresher.py): a key, its team's budgets
and its route in use are answered from memory past their expiry, with no wait at all, while a revoked key, a changed
budget and a changed route still arrive within their cache's time; and a refresher runs only while it is used."""
import asyncio
import logging
import time

import pytest
from django.utils import timezone

from panel.accounts.keys import key_issue
from panel.accounts.models import TeamKey
from panel.budgets import enforcement
from panel.budgets.models import Budget
from panel.channels import routing
from panel.channels.models import Channel, Route, RouteChannel
from panel.core import redis_client, refresher
from panel.core.refresher import Refresher
from panel.gateway import keys
from tests.support.waiting import run_coroutine, without_a_wait


def test_a_refresher_runs_while_used_goes_on_after_a_failed_round_and_stops_when_unused(monkeypatch, caplog):
    monkeypatch.setattr(refresher, "ACTIVE_SECONDS", 0.3)
    rounds = []

    async def refresh():
        rounds.append(time.monotonic())
        if len(rounds) == 2:
            raise ConnectionError("Redis went away")

    used = Refresher("test cache", refresh, lambda: 0.05)
    idle = Refresher("off", refresh, lambda: 0)

    async def scenario():
        used.touch()
        used.touch()
        idle.touch()
        names = [task.get_name() for task in asyncio.all_tasks()]
        assert names.count("refresher: test cache") == 1 and "refresher: off" not in names
        await asyncio.sleep(0.7)  # rounds every 0.05 s until 0.3 s after the last touch, then the task ends
        after_use = len(rounds)
        assert "refresher: test cache" not in [task.get_name() for task in asyncio.all_tasks()]
        await asyncio.sleep(0.2)
        assert len(rounds) == after_use  # unused: no more rounds
        used.touch()  # the next request starts it again
        await asyncio.sleep(0.2)
        return after_use

    with caplog.at_level(logging.WARNING, logger="panel.core.refresher"):
        after_use = run_coroutine(scenario())
    assert 3 <= after_use <= 8  # about 0.3 s / 0.05 s, and the failed second round did not stop it
    assert len(rounds) > after_use
    assert ["test cache: refresh failed (ConnectionError); trying again in 0.05 s"] == [
        record.getMessage() for record in caplog.records]


@pytest.mark.django_db(transaction=True)
def test_a_key_its_budgets_and_its_route_in_use_are_read_from_memory_and_changes_still_arrive(team_setup, settings):
    settings.KEY_CACHE_SECONDS = settings.BUDGET_CACHE_SECONDS = settings.ROUTE_CACHE_SECONDS = 1
    team = team_setup["team_a"]
    channel = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://127.0.0.1:9/v1",
                                     model_id="m", timeout_seconds=5, max_retries=0)
    route = Route.objects.create(team=team, model_name="chat", strategy="priority")
    RouteChannel.objects.create(route=route, channel=channel, position=0)
    key, raw = key_issue(team=team, user=team_setup["alice"], name="app")
    Budget.objects.create(team=team, tokens_per_month=1000)

    async def scenario():
        redis_client._client = None  # a client of this event loop
        for cache in (routing._cache, routing._versions, enforcement._cache):
            cache.clear()
        keys.CACHE = keys.KeyCache()
        assert (await keys.key_lookup(raw)).id == key.pk
        assert (await enforcement.budgets_for(team.pk)).team.tokens == 1000
        assert (await routing.route_for(team.pk, "chat")).strategy == "priority"
        for _ in range(12):  # 3 s: three times each cache's time, a request every 0.25 s
            await asyncio.sleep(0.25)
            assert without_a_wait(keys.key_lookup(raw)).revoked is False
            assert without_a_wait(enforcement.budgets_for(team.pk)).team.tokens == 1000
            assert without_a_wait(routing.route_for(team.pk, "chat")).strategy == "priority"
        await asyncio.to_thread(lambda: (TeamKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now()),
                                         Budget.objects.filter(team=team).update(tokens_per_month=500),
                                         Route.objects.filter(pk=route.pk).update(strategy="weighted")))
        changed = time.monotonic()  # the route's change bumps no routing version: its cache's time applies
        arrived = {}
        while len(arrived) < 3 and time.monotonic() - changed < 3:
            await asyncio.sleep(0.05)
            seen = {"key": without_a_wait(keys.key_lookup(raw)).revoked,
                    "budget": without_a_wait(enforcement.budgets_for(team.pk)).team.tokens == 500,
                    "route": without_a_wait(routing.route_for(team.pk, "chat")).strategy == "weighted"}
            arrived.update({name: time.monotonic() - changed for name, new in seen.items()
                            if new and name not in arrived})
        return arrived

    arrived = run_coroutine(scenario())
    assert set(arrived) == {"key", "budget", "route"}
    assert max(arrived.values()) <= 1.0 + 0.3  # within the cache's time (and a round of its refresher)
