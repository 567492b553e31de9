"""Balancing a route's replicas: round-robin, least in flight, session affinity and prefix-aware placement with
bounded load, in-flight counts shared by every gateway process through Redis, a replica that fails skipped at once
for the next one, and what happens without Redis. Through the real gateway against fake upstreams, and on the
balancer itself with two clients standing in for two gateway processes."""
import asyncio
from collections import Counter
from types import SimpleNamespace

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from panel.accounts.keys import key_issue
from panel.channels.models import Route, RouteChannel
from panel.channels.routing import Target, routing_changed
from panel.gateway.balancing import (
    LOAD_FACTOR,
    LOAD_SLACK,
    Balancer,
    held_key,
    inflight_key,
    prefix_digest,
    prefix_text,
    rendezvous,
)
from panel.usage.models import RequestLog
from tests.support.environment import REDIS_URL
from tests.support.fake_upstream import FakeUpstream, closed_port
from tests.support.gateway import channel, gateway, records  # noqa: F401 (fixtures)
from tests.support.waiting import run_coroutine, wait_until

# A gateway process per test (tests/support/gateway.py): its tests stop the gateway and read its log
GATEWAY_PER_TEST = True


def target(ident, kind="local"):
    return Target(id=ident, name=f"replica-{ident}", base_url="", model_id="m", api_key=None, credential_error="",
                  timeout=5.0, max_retries=3, backoff=1.0, channel=SimpleNamespace(kind=kind))


def route(balance, route_id=7, header="x-session-id", canary=None):
    return SimpleNamespace(route_id=route_id, balance=balance, affinity_header=header, canary=canary)


def process():
    """A balancer with its own Redis connection, as one gateway process has."""
    return Balancer(client=aioredis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2))


def chat(system, user="hello", **extra):
    return {"model": "chat", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            **extra}


POOL = [target(11), target(12)]


async def place(balancer, policy, body, request_id, targets=POOL, headers=(), key_id=1, **route_options):
    ordered, lease = await balancer.place(route(policy, **route_options), targets, body=body, headers=headers,
                                          key_id=key_id, request_id=request_id)
    return ordered, lease


def test_round_robin_takes_turns_across_gateway_processes():
    async def scenario():
        a, b = process(), process()
        firsts = []
        for index in range(6):
            ordered, lease = await place((a, b)[index % 2], "round_robin", chat("s"), f"r{index}")
            firsts.append(ordered[0].id)
            await a.release(lease)
        assert firsts == [11, 12, 11, 12, 11, 12]  # one counter for the route, whichever process asks
    run_coroutine(scenario())


def test_least_in_flight_sees_the_requests_other_processes_hold():
    async def scenario():
        a, b = process(), process()
        _, held = await place(a, "least_in_flight", chat("s"), "held-1")
        _, held_too = await place(a, "least_in_flight", chat("s"), "held-2")
        assert {held.key, held_too.key} == {inflight_key(11), inflight_key(12)}  # one each
        await a.release(held_too)
        ordered, lease = await place(b, "least_in_flight", chat("s"), "next")  # the other process
        assert lease.key == held_too.key  # the replica with nothing in flight
        assert inflight_key(ordered[0].id) == held_too.key
        await a.release(held)
        await b.release(lease)
        plain = redis.Redis.from_url(REDIS_URL)
        assert plain.zcard(inflight_key(11)) == plain.zcard(inflight_key(12)) == 0  # released: nothing in flight
    run_coroutine(scenario())


def test_prefix_aware_keeps_a_system_prompt_on_one_replica_and_spreads_prompts():
    async def scenario():
        a = process()
        homes = {}
        for tenant in range(8):
            seen = set()
            for user in range(4):
                ordered, lease = await place(a, "prefix_aware", chat(f"tenant {tenant} " * 50, f"q{user}"),
                                             f"t{tenant}-{user}")
                seen.add(ordered[0].id)
                await a.release(lease)
            assert len(seen) == 1  # every user of a tenant meets the same replica (its cached system prompt)
            homes[tenant] = seen.pop()
        assert set(homes.values()) == {11, 12}  # and the tenants are spread over both
    run_coroutine(scenario())


def test_prefix_aware_splits_tenants_evenly_and_forgets_an_idle_one():
    async def scenario():
        a, b = Balancer(held_seconds=0.5, client=process().client()), process()
        homes = {}
        for tenant in range(8):  # a hash alone splits 8 tenants 4/4 only about a quarter of the time
            ordered, lease = await place((a, b)[tenant % 2], "prefix_aware", chat(f"tenant {tenant} " * 40), "t")
            homes[tenant] = ordered[0].id
            await a.release(lease)
        assert sorted(Counter(homes.values()).values()) == [4, 4]
        plain = redis.Redis.from_url(REDIS_URL)
        assert plain.zcard(held_key(11)) == plain.zcard(held_key(12)) == 4  # digests only, never the text
        assert all(len(member) == 32 for member in plain.zrange(held_key(11), 0, -1))
        await asyncio.sleep(0.6)  # idle past the held time: the next tenant finds no share taken
        ordered, lease = await place(a, "prefix_aware", chat("tenant 99 " * 40), "late")
        assert plain.zcard(held_key(11)) + plain.zcard(held_key(12)) == 1
        await a.release(lease)
    run_coroutine(scenario())


def test_prefix_aware_spills_to_the_least_loaded_replica_above_the_load_bound():
    async def scenario():
        a = process()
        body = chat("one hot tenant " * 50)
        home = (await place(a, "prefix_aware", body, "probe"))[1]
        await a.release(home)
        leases = [(await place(a, "prefix_aware", body, f"hot-{index}"))[1] for index in range(8)]
        placed = Counter(lease.key for lease in leases)
        assert placed[home.key] < 8 and len(placed) == 2  # the hot tenant's share spilled over
        # Never more than LOAD_FACTOR x the mean in flight (counting the request being placed), plus the slack.
        assert placed[home.key] <= -(-LOAD_FACTOR * 8 // 2) + LOAD_SLACK
        for lease in leases:
            await a.release(lease)
    run_coroutine(scenario())


def test_session_affinity_follows_the_header_then_the_anthropic_user_then_the_key():
    async def scenario():
        a = process()

        async def first(body, headers=(), key_id=1):
            ordered, lease = await place(a, "session_affinity", body, "s", headers=headers, key_id=key_id)
            await a.release(lease)
            return ordered[0].id

        by_header = {await first(chat(f"prompt {n}"), headers=[(b"X-Session-Id", b"agent-42")]) for n in range(6)}
        assert len(by_header) == 1
        by_user = {await first(chat(f"p {n}", metadata={"user_id": "user-7"})) for n in range(6)}
        assert len(by_user) == 1
        by_key = {await first(chat(f"q {n}"), key_id=99) for n in range(6)}
        assert len(by_key) == 1
        spread = {await first(chat("same"), headers=[(b"x-session-id", f"s{n}".encode())]) for n in range(16)}
        assert spread == {11, 12}  # different sessions land on both replicas
    run_coroutine(scenario())


def test_only_the_leading_local_channels_are_balanced_and_each_replica_is_tried_once():
    async def scenario():
        cloud = target(99, kind="remote")
        ordered, lease = await place(process(), "round_robin", chat("s"), "x", targets=[target(11), target(12), cloud])
        assert ordered[-1] == cloud and ordered[-1].max_retries == 3  # the fallback keeps its retries
        assert [t.max_retries for t in ordered[:2]] == [0, 0]  # the next replica is the retry
        alone = [target(11), cloud]
        assert (await place(process(), "round_robin", chat("s"), "y", targets=alone)) == (alone, None)
        assert (await place(process(), "", chat("s"), "z")) == (POOL, None)  # in order: untouched, no Redis call
        candidate = target(50)  # a canary's local candidate in this request's arm stays first
        ordered, _ = await place(process(), "round_robin", chat("s"), "c", targets=[candidate, *POOL],
                                 canary=candidate)
        assert ordered[0] is candidate and sorted(t.id for t in ordered[1:]) == [11, 12]
    run_coroutine(scenario())


def test_without_redis_each_process_balances_on_its_own():
    async def scenario():
        dead = Balancer(client=aioredis.Redis.from_url(f"redis://127.0.0.1:{closed_port()}/0",
                                                       socket_timeout=1, socket_connect_timeout=1))
        firsts = []
        for index in range(4):
            ordered, lease = await place(dead, "round_robin", chat("s"), f"r{index}")
            assert lease is None and sorted(t.id for t in ordered) == [11, 12]
            firsts.append(ordered[0].id)
        assert firsts == [11, 12, 11, 12]
        await dead.release(None)
        hashed = {(await place(dead, "prefix_aware", chat("tenant"), "h"))[0][0].id for _ in range(3)}
        assert len(hashed) == 1
    run_coroutine(scenario())


def test_a_lost_release_leaves_the_count_after_the_stale_time():
    async def scenario():
        a = process()
        plain = redis.Redis.from_url(REDIS_URL)
        plain.zadd(inflight_key(11), {"from-a-crashed-process": 1})  # started in 1970: long stale
        plain.zadd(inflight_key(12), {"live-1": 10**13, "live-2": 10**13})  # far in the future: live
        ordered, lease = await place(a, "least_in_flight", chat("s"), "new")
        assert ordered[0].id == 11 and plain.zscore(inflight_key(11), "from-a-crashed-process") is None
        await a.release(lease)
    run_coroutine(scenario())


def test_rendezvous_moves_only_the_share_of_a_replica_that_goes():
    three = [target(1), target(2), target(3)]
    texts = [f"system prompt {n}" for n in range(300)]
    before = {text: three[rendezvous(prefix_digest(text), three)[0]].id for text in texts}
    after = {text: three[:2][rendezvous(prefix_digest(text), three[:2])[0]].id for text in texts}
    moved = [text for text in texts if before[text] != after[text]]
    assert moved and all(before[text] == 3 for text in moved)  # only replica 3's texts moved
    assert 60 < len(moved) < 140  # about a third


def test_the_prefix_is_the_tools_and_system_prompt_of_every_api():
    tools = [{"type": "function", "function": {"name": "read_file"}}]
    assert prefix_text(chat("be brief", "a")) == prefix_text(chat("be brief", "b"))
    assert prefix_text(chat("be brief", tools=tools)) != prefix_text(chat("be brief"))
    anthropic = {"system": [{"type": "text", "text": "be brief"}], "messages": [{"role": "user", "content": "a"}]}
    assert prefix_text(anthropic) == prefix_text({**anthropic, "messages": [{"role": "user", "content": "b"}]})
    assert prefix_text({"messages": [{"role": "user", "content": "no system"}]}) == "no system"
    assert prefix_text({"prompt": "x" * 10_000}) == "x" * 8192


# ----------------------------------------------------------------------------------- through the real gateway

@pytest.fixture
def replicas(team_setup):
    with FakeUpstream(models=("m",)) as one, FakeUpstream(models=("m",)) as two, \
            FakeUpstream(models=("cloud-m",)) as cloud_fake:
        team = team_setup["team_a"]
        locals_ = [channel(team, "local-tiny", one, "m", kind="local", retries=3),
                   channel(team, "local-tiny-r2", two, "m", kind="local", retries=3)]
        cloud = channel(team, "cloud", cloud_fake, "cloud-m")
        chat_route = Route.objects.create(team=team, model_name="chat", strategy="local_first",
                                          balance="round_robin")
        for position, linked in enumerate([*locals_, cloud]):
            RouteChannel.objects.create(route=chat_route, channel=linked, position=position)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="app")
        yield SimpleNamespace(fakes=(one, two), cloud=cloud_fake, channels=locals_, route=chat_route, raw=raw)


def send(gateway, raw, body, **headers):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {raw}", **headers})


def test_the_gateway_takes_turns_over_the_replicas_and_releases_every_request(gateway, replicas):
    for index in range(6):
        assert send(gateway, replicas.raw, chat("s", f"q{index}", max_tokens=5)).status_code == 200
    assert [len(fake.requests) for fake in replicas.fakes] == [3, 3] and not replicas.cloud.requests
    rows = records(6)
    assert {row.channel_id for row in rows} == {c.pk for c in replicas.channels}
    assert not any(row.fell_back for row in rows)
    plain = redis.Redis.from_url(REDIS_URL)
    wait_until(lambda: all(plain.zcard(inflight_key(c.pk)) == 0 for c in replicas.channels), seconds=5,
               message="every request released")


def test_the_gateway_keeps_each_tenant_on_its_replica(gateway, replicas):
    Route.objects.filter(pk=replicas.route.pk).update(balance="prefix_aware")
    routing_changed(replicas.route.team_id)  # every gateway process drops its cached route
    for tenant in range(4):
        for user in range(3):
            body = chat(f"tenant {tenant} " * 40, f"u{user}", max_tokens=5)
            assert send(gateway, replicas.raw, body).status_code == 200
    homes = {}
    for index, fake in enumerate(replicas.fakes):
        for request in fake.requests:
            system = request.json["messages"][0]["content"]
            homes.setdefault(system, set()).add(index)
    assert len(homes) == 4 and all(len(where) == 1 for where in homes.values())


def test_a_dead_replica_is_skipped_at_once_for_the_other_replica_not_the_cloud(gateway, replicas):
    dead, alive = replicas.channels
    dead.base_url = f"http://127.0.0.1:{closed_port()}/v1"
    dead.save()
    routing_changed(dead.team_id)
    statuses = [send(gateway, replicas.raw, chat("s", f"q{n}", max_tokens=5)).status_code for n in range(4)]
    assert statuses == [200] * 4
    assert len(replicas.fakes[1].requests) == 4 and not replicas.cloud.requests
    rows = records(4)
    assert {row.channel_id for row in rows} == {alive.pk}
    tried_dead = [row for row in rows if row.attempts == 2]
    assert tried_dead and all(row.fell_back for row in tried_dead)  # the dead one was tried once, not retried
    assert all(row.attempts <= 2 for row in rows)
    assert all([step["outcome"] for step in row.attempt_trail][-1] == "ok" for row in rows)
    assert RequestLog.objects.filter(outcome="ok").count() == 4
