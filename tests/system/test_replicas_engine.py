"""Replicas of the tiny demo model on the real CPU engine, on two simulated hosts: network namespaces with their own
addresses, each with its GPU worker and engines, the database and Redis on the main host between them
(tests/support/hosts.py). One replica launched with room to scale to two: a burst of requests through the gateway
keeps requests waiting, the scaler (reading what the scraper stores, as on beat) adds the second replica on the other
host, and every burst request is answered. The route balanced by the engines' own KV-cache events: a prompt the
second engine holds goes there; while that engine's events stop, requests are placed by the prefix rule, and by its
events again once it runs. Both on one prefix-aware route, each tenant's requests on one replica; one
replica SIGKILLed mid-traffic (every request still answered, by the other replica; the killed one restarted and back
on the route). Then its whole host is lost: requests go around it, the reaper fails its replica, and the scaler,
held at two, adds one on the host that is left. Quiet again, the scaler drains that replica while a long request runs
on it: the request finishes whole, then its engine stops. Stop ends the rest with no engine process left behind."""
import os
import signal
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import redis

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route
from panel.channels.routing import routing_changed
from panel.core import crypto
from panel.dashboards.scraper import deployments_scrape, engine_readings
from panel.gateway.balancing import held_key, prefix_digest, prefix_text, rendezvous
from panel.hosts.models import WorkerHost
from panel.jobs.models import JobEvent
from panel.jobs.services import jobs_reap
from panel.registry.demo_model import build_demo_model
from panel.registry.services import model_register
from panel.serving.models import Deployment, DeploymentState, ScalePolicy, ServingProfile
from panel.serving.scaling import deployments_scale
from panel.serving.services import deployment_launch, deployment_stop
from panel.usage.models import RequestLog
from tests.support.engine_processes import engine_processes
from tests.support.environment import REDIS_PORT
from tests.support.gateway import gateway  # noqa: F401 (fixture)
from tests.support.hosts import SimulatedHosts
from tests.support.waiting import wait_until

# A gateway process per test (tests/support/gateway.py): one long test
GATEWAY_PER_TEST = True

pytestmark = pytest.mark.engine  # the demo model and two real engines on gpu workers
S = DeploymentState
START_SECONDS = 300


def body(system, user):
    return {"model": "tiny-chat", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def ask(gateway, raw, system, user, **extra):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body(system, user) | extra, timeout=120,
                      headers={"Authorization": f"Bearer {raw}"})


def beat(until, seconds, message):
    """What the scraper's beat task does, once a second here: scrape the engines, then let the scaler decide on
    what was scraped; until `until()`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        deployments_scrape()
        deployments_scale(readings=engine_readings)
        if until():
            return
        time.sleep(1)
    raise AssertionError(f"no {message} after {seconds} s: {ScalePolicy.objects.get().last_decision}")


class Burst:
    """Clients sending requests back to back through the gateway (more than the engine batches), until stopped."""

    def __init__(self, gateway, raw, clients=8):
        self.stop, self.codes = threading.Event(), []
        self.threads = [threading.Thread(target=self._client, args=(gateway, raw, number)) for number in range(clients)]
        for thread in self.threads:
            thread.start()

    def _client(self, gateway, raw, number):
        while not self.stop.is_set():
            reply = ask(gateway, raw, f"You are burst client {number}.", "Count to a hundred.", max_tokens=512,
                        ignore_eos=True)
            self.codes.append(reply.status_code)

    def end(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)
        return self.codes


def replica_states(head):
    return [replica.state for replica in head.replicas()]


@pytest.fixture
def hosts():
    """Two hosts; requested before the workers, so they are removed after them."""
    with SimulatedHosts(["host-a", "host-b"], redis_port=REDIS_PORT) as simulated:
        yield simulated


def engine_answers_on_loopback(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code > 0
    except httpx.HTTPError:
        return False


def homed_on(pool, home, label):
    """A system prompt the prefix rule's hash sends to `home` (a channel id)."""
    for number in range(50):
        system = f"You are the {label} assistant number {number}. " * 30
        if pool[rendezvous(prefix_digest(prefix_text(body(system, ""))), pool)[0]].id == home:
            return system
    raise AssertionError("no prompt hashes there")


def served(reply):
    """The usage row of a request through the gateway (by its x-request-id), once the writer has written it."""
    assert reply.status_code == 200, reply.text[:300]
    request_id = reply.headers["x-request-id"]
    wait_until(lambda: RequestLog.objects.filter(request_id=request_id).exists(), seconds=10, message="its row")
    row = RequestLog.objects.get(request_id=request_id)
    return row, row.attempt_trail[0]


def kv_events_place_and_fall_back(gateway, raw, team, first, second):
    """The route balanced by the engines' own KV-cache events: a prompt whose prefix the second replica's engine
    holds (it was sent to that engine directly, not through the gateway) goes there, though the prefix rule's hash
    sends it to the first; while that engine's events stop (the engine paused: no batch and no answer on its replay
    socket), requests are placed by the prefix rule, said in their trail; once it runs again, by its events."""
    route = Route.objects.get(team=team, model_name="tiny-chat")
    channels = {channel.deployment_id: channel for channel in Channel.objects.filter(deployment__in=[first, second])}
    near, far = channels[first.pk].pk, channels[second.pk].pk
    pool = [SimpleNamespace(id=link.channel_id) for link in route.routechannel_set.order_by("position")]
    route.balance = "kv_events"
    route.save(update_fields=["balance"])
    routing_changed(team.pk)
    time.sleep(1.5)  # past the gateway's routing version check
    started = time.monotonic()
    # The first request subscribes the gateway to both engines' events: heard from within a heartbeat or two.
    _, step = served(ask(gateway, raw, homed_on(pool, near, "opening"), "hello"))
    assert step["outcome"] == "kv_fallback" and "not heard from yet" in step["note"], step
    time.sleep(2.5)
    cached = homed_on(pool, near, "cached")
    engine_key = crypto.decrypt(second.engine_key_ciphertext)
    warm = httpx.post(f"{second.base_url}/chat/completions", json=body(cached, "warm up"), timeout=60,
                      headers={"Authorization": f"Bearer {engine_key}"})
    assert warm.status_code == 200, warm.text[:300]
    time.sleep(1)
    row, step = served(ask(gateway, raw, cached, "through the gateway"))
    assert row.channel_id == far, step  # where the engine holds it, not where the hash points
    assert step["outcome"] == "kv_placed" and step["channel_id"] == far, step
    blocks = dict(zip([link.id for link in pool], step["blocks"]))
    assert blocks[far] >= 5 and blocks[near] == 0, blocks  # its system prompt's blocks, on the second engine only

    # The second engine paused: its events stop. Past the stale time a request is placed by the prefix rule.
    os.killpg(second.pid, signal.SIGSTOP)
    try:
        time.sleep(12)  # past the stale time (10 s)
        row, step = served(ask(gateway, raw, homed_on(pool, near, "paused"), "while paused"))
        assert row.channel_id == near and step["outcome"] == "kv_fallback", step
        assert "silent for" in step["note"] and channels[second.pk].name in step["note"], step
    finally:
        os.killpg(second.pid, signal.SIGCONT)
    # Running again: the gateway rebuilds its index from what the engine buffered, and places by it again.
    time.sleep(5)
    row, step = served(ask(gateway, raw, cached, "after the pause"))
    assert row.channel_id == far and step["outcome"] == "kv_placed", step
    print(f"KV-event placement segment: {time.monotonic() - started:.1f} s")
    # Back to the prefix rule for the rest, with no prefix homes left from here.
    route.balance = "prefix_aware"
    route.save(update_fields=["balance"])
    routing_changed(team.pk)
    redis.Redis(port=REDIS_PORT).delete(*(held_key(channel_id) for channel_id in (near, far)))
    time.sleep(1.5)


def test_replicas_on_two_hosts_scale_balance_survive_a_kill_and_a_lost_host_and_drain_without_cutting(
        hosts, start_worker, team_setup, tmp_path, gateway, settings):  # noqa: F811
    team = team_setup["team_a"]
    path = tmp_path / "tiny"
    build_demo_model(path)
    model = model_register(team=team, user=None, source=str(path), name="tiny")
    profile = ServingProfile.objects.create(team=team, model=model, name="tiny-cpu", served_model_name="tiny-chat",
                                            max_model_len=2048, block_size=32, max_num_seqs=2,
                                            max_num_batched_tokens=2048, enable_prefix_caching=True,
                                            extra_args="--enforce-eager")
    for name in ("host-a", "host-b"):
        start_worker("gpu", argv_prefix=hosts[name].argv_prefix, **hosts.worker_env(name))
    wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).count() == 2,
               message="both GPU workers")

    settings.DASHBOARDS_SCRAPE_EVERY_SECONDS = 2  # beat() below scrapes every second or two, as loaded
    head = deployment_launch(team=team, user=None, profile=profile, replicas=1, max_replicas=2)
    ScalePolicy.objects.filter(deployment=head).update(up_after_seconds=10, down_after_seconds=30)
    wait_until(lambda: Deployment.objects.get(pk=head.pk).state in (S.READY, S.FAILED), seconds=START_SECONDS,
               interval=1, message="the first replica")
    head.refresh_from_db()
    assert head.state == S.READY, head.failure_reason
    # Its engine listens on its host's address, where the gateway reaches it, and not on the main host.
    assert head.base_url == f"http://{hosts[head.host.host].address}:{head.port}/v1"
    assert hosts.reachable(head.host.host, head.port) and not engine_answers_on_loopback(head.port)
    _, raw = key_issue(team=team, user=team_setup["alice"], name="app")
    # A queue of long answers: the defaults (15 s without a byte once vLLM has sent its headers, which it does at
    # once, 10 s to the first byte, 45 s in all) would answer some of the burst with 504 "stalled" while it waits in
    # the engine's queue, as on any engine this loaded; its admin raises them.
    Channel.objects.filter(deployment=head).update(first_byte_timeout_seconds=120, idle_timeout_seconds=120)
    Route.objects.filter(team=team, model_name="tiny-chat").update(deadline_seconds=120)

    # A burst: eight clients, back to back, on an engine that batches two. The scaler adds a replica on the other
    # host.
    # The burst ends there: on this machine's two cores it would starve the new engine's start, which on two real
    # hosts does not compete with it.
    burst = Burst(gateway, raw)
    try:
        beat(lambda: len(head.replicas()) == 2, 120, "second replica")
    finally:
        codes = burst.end()
    assert codes and set(codes) == {200}, codes  # every burst request answered
    second = head.replicas()[1]
    other = {"host-a": "host-b", "host-b": "host-a"}[head.host.host]  # the host without a replica yet
    assert second.host.host == other and second.replica_index == 1
    assert f"added on {other}: " in ScalePolicy.objects.get().last_decision
    wait_until(lambda: Deployment.objects.get(pk=second.pk).state in (S.READY, S.FAILED), seconds=START_SECONDS,
               interval=1, message="the added replica")
    Channel.objects.filter(deployment=second).update(first_byte_timeout_seconds=120, idle_timeout_seconds=120)
    first, second = head.replicas()
    assert (first.state, second.state) == (S.READY, S.READY), (first.failure_reason, second.failure_reason)
    kv_events_place_and_fall_back(gateway, raw, team, first, second)
    RequestLog.objects.all().delete()  # the burst's rows; the tenants' requests are counted below

    route = Route.objects.get(team=team, model_name="tiny-chat")
    channels = {channel.deployment_id: channel for channel in Channel.objects.filter(deployment__in=[first, second])}
    assert route.balance == "prefix_aware" and route.routechannel_set.count() == 2

    # Two tenants whose system prompts hash to different replicas (as the gateway orders the route's channels).
    pool = [SimpleNamespace(id=link.channel_id) for link in route.routechannel_set.order_by("position")]
    tenants = {}
    for number in range(50):
        system = f"You are the assistant of tenant {number}. " * 30
        home = pool[rendezvous(prefix_digest(prefix_text(body(system, ""))), pool)[0]].id
        tenants.setdefault(home, system)
        if len(tenants) == 2:
            break
    for user in range(3):
        for system in tenants.values():
            assert ask(gateway, raw, system, f"question {user}").status_code == 200
    wait_until(lambda: RequestLog.objects.count() >= 6, seconds=10, message="six usage rows")
    homes = list(tenants)  # the requests alternated between the two tenants
    served = list(RequestLog.objects.order_by("created_at").values_list("channel_id", flat=True))
    assert served == [homes[index % 2] for index in range(6)]  # each tenant on its replica, both replicas used
    assert not RequestLog.objects.filter(fell_back=True).exists()

    # SIGKILL the second replica's engine; its tenant is answered by the first meanwhile.
    killed_pid = second.pid
    os.killpg(killed_pid, signal.SIGKILL)
    answered = [ask(gateway, raw, tenants[channels[second.pk].pk], f"after the kill {n}").status_code
                for n in range(4)]
    assert answered == [200] * 4
    wait_until(lambda: Deployment.objects.get(pk=second.pk).restarts == 1, seconds=30, message="a restart")
    wait_until(lambda: Deployment.objects.get(pk=second.pk).state == S.READY, seconds=START_SECONDS, interval=1,
               message="the killed replica back")
    second.refresh_from_db()
    assert second.pid != killed_pid and Channel.objects.get(pk=channels[second.pk].pk).enabled
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [row.outcome for row in rows] == ["ok"] * 10
    assert {row.channel_id for row in rows[6:]} == {channels[first.pk].pk}  # the killed replica's share moved

    # The second replica's host is lost: its link goes down, then everything on it dies. The scaler is held at two
    # replicas. Requests of the tenant homed there go around it (the first waits out the lost engine's first byte,
    # 5 s here; after it the channel cools down), its worker stops heartbeating, the reaper fails the replica (its
    # channel leaves the route), and the scaler adds one on the host that is left, in the freed slot.
    lost, kept = second.host.host, first.host.host
    ScalePolicy.objects.filter(deployment=head).update(min_replicas=2)
    Channel.objects.filter(deployment=second).update(first_byte_timeout_seconds=5, idle_timeout_seconds=5)
    RequestLog.objects.all().delete()
    hosts.cut(lost)
    answered = [ask(gateway, raw, tenants[channels[second.pk].pk], f"the host is lost {n}").status_code
                for n in range(3)]
    assert answered == [200] * 3
    wait_until(lambda: RequestLog.objects.count() >= 3, seconds=10, message="three usage rows")
    assert set(RequestLog.objects.values_list("channel_id", flat=True)) == {channels[first.pk].pk}
    # Past a supervisor's heartbeat (every 5 s), so that only what the lost host ran is stale.
    settings.HOST_OFFLINE_AFTER_SECONDS = 12
    wait_until(lambda: not WorkerHost.objects.get(kind="gpu", host=lost).is_online, seconds=40, message="offline")
    reaped = []
    wait_until(lambda: reaped.extend(jobs_reap(stale_after_seconds=12)) or reaped, seconds=30, interval=1,
               message="the lost replica reaped")
    assert [job.pk for job in reaped] == [second.pk]
    second.refresh_from_db()
    assert second.state == S.FAILED and not Channel.objects.get(pk=channels[second.pk].pk).enabled
    beat(lambda: len([r for r in head.replicas() if r.state in Deployment.ACTIVE_STATES]) == 2, 30, "a replacement")
    third = [replica for replica in head.replicas() if replica.state in Deployment.ACTIVE_STATES][1]
    assert third.host.host == kept and third.replica_index == 1
    assert ScalePolicy.objects.get().last_decision.startswith(f"replica 2 added on {kept}: 1 replica running, "
                                                               "under the minimum of 2")
    wait_until(lambda: Deployment.objects.get(pk=third.pk).state in (S.READY, S.FAILED), seconds=START_SECONDS,
               interval=1, message="the replacement")
    third.refresh_from_db()
    assert third.state == S.READY, third.failure_reason
    assert Channel.objects.get(deployment=third).pk == channels[second.pk].pk  # the slot's channel, back on
    Channel.objects.filter(deployment=third).update(first_byte_timeout_seconds=120, idle_timeout_seconds=120)
    ScalePolicy.objects.filter(deployment=head).update(min_replicas=1)

    # Quiet: the scraper watches both replicas through the scaler's quiet window (30 s here); then a long request
    # starts on the replacement, and the scaler drains it while the request runs.
    RequestLog.objects.all().delete()
    deadline = time.monotonic() + 32
    while time.monotonic() < deadline:
        deployments_scrape()
        time.sleep(1)
    replies = {}
    long = threading.Thread(target=lambda: replies.setdefault("long", ask(
        gateway, raw, tenants[channels[second.pk].pk], "Tell a long story.", max_tokens=1500, ignore_eos=True)))
    long.start()
    wait_until(lambda: [sample.running for sample in deployments_scrape() if sample.deployment_id == third.pk
                        and sample.running] != [], seconds=20, interval=0.5, message="the long request running")
    beat(lambda: Deployment.objects.get(pk=third.pk).state != S.READY, 20, "drain")
    assert long.is_alive() and Deployment.objects.get(pk=third.pk).state == S.DRAINING  # mid-request
    assert ScalePolicy.objects.get().last_decision.startswith("replica 2 drains and stops: no request waited")
    long.join(timeout=300)
    reply = replies["long"]
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 1500, reply.text[:300]
    wait_until(lambda: Deployment.objects.get(pk=third.pk).state == S.STOPPED, seconds=60, message="drained")
    stopped = JobEvent.objects.filter(job_type=Deployment.job_type(), job_id=third.pk, to_state=S.STOPPED).get()
    assert stopped.reason == "drained and stopped"
    assert RequestLog.objects.get(channel=channels[second.pk]).outcome == "ok"
    assert not Channel.objects.get(pk=channels[second.pk].pk).enabled
    assert ask(gateway, raw, tenants[channels[second.pk].pk], "after the drain").status_code == 200  # on the first

    assert deployment_stop(deployment=head) is True
    wait_until(lambda: set(replica_states(head)) - {S.FAILED} == {S.STOPPED}, seconds=60, message="all stopped")
    wait_until(lambda: engine_processes(path) == [], seconds=30, message="no engine left")
    assert not Channel.objects.filter(deployment__in=[first, second, third], enabled=True).exists()
