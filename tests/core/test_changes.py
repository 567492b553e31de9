"""Changes announced through Redis (panel/core/changes.py, decision 0105): while a process's subscription is live,
its caches hold what they read and stop asking Redis whether something changed (no routing version read, no failure
count polled, round after round), an announced routing change or a channel's failure in another process reaches them
at once, and a subscription that is lost makes them ask again until a new one, with a new number, is live."""
import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import redis
import redis.asyncio as aioredis
from django.db import transaction

from panel.channels import routing
from panel.channels.models import Channel, Route, RouteChannel
from panel.core import changes, redis_client
from panel.gateway import cooldowns
from panel.gateway.cooldowns import COOLDOWN_AFTER_FAILURES, Cooldown
from tests.support.environment import REDIS_URL
from tests.support.waiting import run_coroutine, without_a_wait


async def live_token(seconds=10):
    """This loop's subscription number, once it is live."""
    deadline = time.monotonic() + seconds
    while (token := changes.token()) is None:
        assert time.monotonic() < deadline, "the subscription to changes never went live"
        await asyncio.sleep(0.02)
    return token


async def until(predicate, seconds=5, what="condition"):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_a_routing_version_is_held_while_live_and_an_announced_change_arrives_with_the_next_request(
        team_setup, settings, monkeypatch):
    settings.ROUTE_CACHE_SECONDS = 60  # the cache's own expiry plays no part here
    team = team_setup["team_a"]
    channel = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://127.0.0.1:9/v1",
                                     model_id="m", timeout_seconds=5, max_retries=0)
    route = Route.objects.create(team=team, model_name="chat", strategy="priority")
    RouteChannel.objects.create(route=route, channel=channel, position=0)
    reads = []
    read_versions = routing._read_versions
    monkeypatch.setattr(routing, "_read_versions", lambda team_ids: reads.append(team_ids) or read_versions(team_ids))

    def change():
        with transaction.atomic():
            Route.objects.filter(pk=route.pk).update(strategy="weighted")
            routing.routing_changed(team.pk)  # bumps the version and announces it, after the commit

    async def scenario():
        redis_client._client = None  # a client of this event loop
        routing._cache.clear()
        routing._versions.clear()
        await live_token()
        assert (await routing.route_for(team.pk, "chat")).strategy == "priority"
        await asyncio.sleep(0.5)  # the refresher's first rounds: a version read before the subscription is read again
        settled = len(reads)
        for _ in range(15):  # 1.5 s, three times the version check's time without a subscription
            await asyncio.sleep(0.1)
            assert without_a_wait(routing.route_for(team.pk, "chat")).strategy == "priority"
        assert len(reads) == settled  # held: not one read of the version meanwhile
        heard = routing._heard_count
        await asyncio.to_thread(change)
        await until(lambda: routing._heard_count > heard, what="the announcement")
        return (await routing.route_for(team.pk, "chat")).strategy

    assert run_coroutine(scenario()) == "weighted"


def test_a_set_of_channels_is_held_clean_without_polling_while_live_and_a_failure_elsewhere_arrives_at_once():
    flaky, steady = SimpleNamespace(id=301), SimpleNamespace(id=302)

    async def scenario():
        a, b = (Cooldown(30.0, client=aioredis.Redis.from_url(REDIS_URL, socket_timeout=2)) for _ in range(2))
        await a.client().delete(*[name for target in (flaky, steady) for name in cooldowns._keys(target.id)])
        await live_token()
        polls = []
        mget = b.client().mget
        b.client().mget = lambda keys: polls.append(keys) or mget(keys)
        assert [t.id for t in await b.order([flaky, steady])] == [301, 302]
        await asyncio.sleep(0.5)  # the refresher's first round holds a set read before the subscription
        settled = len(polls)
        for _ in range(15):  # 1.5 s, three times CLEAN_SECONDS: no round trip, no poll
            await asyncio.sleep(0.1)
            assert [t.id for t in without_a_wait(b.order([flaky, steady]))] == [301, 302]
        assert len(polls) == settled
        for _ in range(COOLDOWN_AFTER_FAILURES):
            await a.failed(flaky.id)
        await until(lambda: not b.clean_until, what="the failure's announcement")
        return [t.id for t in await b.order([flaky, steady])]

    assert run_coroutine(scenario()) == [302, 301]


def test_a_lost_subscription_is_told_and_a_new_one_has_a_new_number():
    async def scenario():
        first = await live_token()
        name = f"tw-changes-{__import__('os').getpid()}"
        killer = redis.Redis.from_url(REDIS_URL)
        ids = [entry["id"] for entry in killer.client_list(_type="pubsub") if entry.get("name") == name]
        assert ids, "the listener's connection is not named as it should be"
        for client_id in ids:
            killer.client_kill_filter(_id=client_id)
        await until(lambda: changes.token() is None, what="the loss to be told")
        second = await live_token()
        return first, second

    first, second = run_coroutine(scenario())
    assert second != first


def test_a_subscription_never_confirmed_is_tried_again(settings, monkeypatch):
    """A Redis that takes the connection and never answers the subscribe does not leave the process waiting on it
    for ever: after SUBSCRIBE_SECONDS the listener tries again, and meanwhile nothing counts as heard."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        while True:
            try:
                connection, _ = silent.accept()
            except OSError:
                return
            accepted.append(connection)  # kept open, never answered

    threading.Thread(target=accept, daemon=True).start()
    settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    monkeypatch.setattr(changes, "SUBSCRIBE_SECONDS", 0.2)
    monkeypatch.setattr(changes, "RETRY_SECONDS", (0.05,))

    async def scenario():
        tokens = [changes.token()]
        for _ in range(10):
            await asyncio.sleep(0.1)
            tokens.append(changes.token())
        return tokens

    try:
        tokens = run_coroutine(scenario())
    finally:
        silent.close()
        for connection in accepted:
            connection.close()
    assert set(tokens) == {None}
    assert len(accepted) >= 3  # one connection per attempt, each given up after 0.2 s
