"""Channel cooldowns shared by every gateway process (Redis): a channel that failed in one process rests in all of
them, one request across all of them probes it when the rest is over (success clears it, failure rests it again),
and when Redis is down each process keeps its own cooldowns and the gateway still answers."""
import asyncio
import logging
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from panel.gateway import cooldowns
from panel.gateway.cooldowns import CLEAN_SECONDS, COOLDOWN_AFTER_FAILURES, Cooldown
from tests.support.environment import REDIS_URL
from tests.support.fake_upstream import closed_port
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)
from tests.support.waiting import run_coroutine, without_a_wait

# A gateway process per test (tests/support/gateway.py): its tests stop the gateway and read its log
GATEWAY_PER_TEST = True

FLAKY, STEADY = SimpleNamespace(id=101), SimpleNamespace(id=102)


def two_processes(seconds=30.0, url=REDIS_URL):
    """Two cooldown clients with their own Redis connections, as two gateway processes have."""
    return (Cooldown(seconds, client=aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)),
            Cooldown(seconds, client=aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)))


async def rest(process):
    return [await process.failed(FLAKY.id) for _ in range(COOLDOWN_AFTER_FAILURES)]


def ids(ordered):
    return [target.id for target in ordered]


def test_a_channel_that_failed_in_one_process_rests_in_every_other():
    async def scenario():
        a, b = two_processes()
        assert ids(await b.order([FLAKY, STEADY])) == [101, 102]
        assert await rest(a) == [(1, False), (2, False), (3, True)]  # the third failure starts the rest, once
        await asyncio.sleep(CLEAN_SECONDS)  # b took the pair as clean for this long without asking Redis
        assert ids(await b.order([FLAKY, STEADY])) == [102, 101]
        assert ids(await a.order([FLAKY, STEADY])) == [102, 101]
        assert await b.failed(FLAKY.id) == (4, False)  # tried last and failing again: the rest goes on, not announced
    run_coroutine(scenario())


def test_channels_in_use_are_taken_as_clean_without_a_round_trip_and_a_failure_elsewhere_still_shows():
    flaky, steady = SimpleNamespace(id=201), SimpleNamespace(id=202)

    async def scenario():
        a, b = two_processes()
        await a.client().delete(*[name for target in (flaky, steady) for name in cooldowns._keys(target.id)])
        assert ids(await b.order([flaky, steady])) == [201, 202]
        for _ in range(8):  # 1.2 s, more than twice CLEAN_SECONDS: b's refresher renewed the pair
            await asyncio.sleep(0.15)
            assert ids(without_a_wait(b.order([flaky, steady]))) == [201, 202]
        for _ in range(COOLDOWN_AFTER_FAILURES):
            await a.failed(flaky.id)
        await asyncio.sleep(CLEAN_SECONDS)  # a's failures reach b within this
        assert ids(await b.order([flaky, steady])) == [202, 201]
    run_coroutine(scenario())


def test_after_the_rest_one_request_across_all_processes_probes_the_channel_and_its_success_clears_it():
    async def scenario():
        a, b = two_processes(seconds=0.3)
        await rest(a)
        await asyncio.sleep(0.4)
        orders = await asyncio.gather(*[process.order([FLAKY, STEADY]) for process in (a, b) * 10])
        probes = [index for index, ordered in enumerate(orders) if ids(ordered)[0] == 101]
        assert len(probes) == 1, orders  # the others still see it resting
        prober = (a, b)[probes[0] % 2]
        await prober.succeeded(FLAKY.id)
        for process in (a, b, a, b):
            assert ids(await process.order([FLAKY, STEADY])) == [101, 102]
        assert await b.failed(FLAKY.id) == (1, False)  # the count starts over
    run_coroutine(scenario())


def test_a_failed_probe_rests_the_channel_again_in_every_process():
    async def scenario():
        a, b = two_processes(seconds=0.3)
        await rest(a)
        await asyncio.sleep(0.4)
        assert ids(await b.order([FLAKY, STEADY])) == [101, 102]  # b probes
        assert ids(await a.order([FLAKY, STEADY])) == [102, 101]
        assert await b.failed(FLAKY.id) == (4, True)  # the probe failed: a new rest
        assert ids(await a.order([FLAKY, STEADY])) == [102, 101]
        assert ids(await b.order([FLAKY, STEADY])) == [102, 101]
        await asyncio.sleep(0.4)
        assert ids(await a.order([FLAKY, STEADY])) == [101, 102]  # after that rest, another single probe
        assert ids(await b.order([FLAKY, STEADY])) == [102, 101]
    run_coroutine(scenario())


def test_with_redis_down_each_process_keeps_its_own_cooldowns_and_raises_nothing(caplog, monkeypatch):
    async def scenario():
        a, b = two_processes(url=f"redis://127.0.0.1:{closed_port()}/0")
        assert await rest(a) == [(1, False), (2, False), (3, True)]
        assert ids(await a.order([FLAKY, STEADY])) == [102, 101]
        assert ids(await b.order([FLAKY, STEADY])) == [101, 102]  # not shared while Redis is down
        await a.succeeded(FLAKY.id)
        assert ids(await a.order([FLAKY, STEADY])) == [101, 102]
        return a

    calls = []
    original = Cooldown.scripts
    monkeypatch.setattr(Cooldown, "scripts", lambda self: calls.append(1) or original(self))
    with caplog.at_level(logging.WARNING, logger="panel.gateway.cooldowns"):
        a = run_coroutine(scenario())
    assert a.redis_down_until > 0
    assert len(calls) == 2  # one failed call per process; then Redis is left alone for REDIS_RETRY_SECONDS
    assert [r.message for r in caplog.records].count(
        "channel cooldowns unreadable in Redis (ConnectionError); this process keeps its own for 5 s") == 2


@pytest.fixture
def second_gateway(transactional_db):
    from django.db import connection

    from tests.support.gateway_server import GatewayServer

    server = GatewayServer(connection.settings_dict["NAME"])
    yield server
    server.stop()


def test_a_channel_cooled_through_one_gateway_process_is_tried_last_by_another(gateway, second_gateway, setup,
                                                                              primary, fallback):
    primary.behave("status_500")
    for _ in range(COOLDOWN_AFTER_FAILURES):  # each request: the local channel fails (twice), the cloud answers
        assert post(gateway, setup["raw"], CHAT).status_code == 200
    records(COOLDOWN_AFTER_FAILURES)
    asked = len(primary.requests)
    response = post(second_gateway, setup["raw"], CHAT)
    assert response.status_code == 200
    row = [r for r in records(COOLDOWN_AFTER_FAILURES + 1) if r.request_id == response.headers["x-request-id"]][0]
    assert [(s["channel"], s["outcome"]) for s in row.attempt_trail] == [("cloud", "ok")]
    assert row.fell_back is True and len(primary.requests) == asked  # the resting channel was not asked

