"""A request for a route whose local engine is asleep (its profile sleeps when idle): it wakes the deployment, then
goes to the route's next channel meanwhile or waits for the engine, as the route says; with nowhere else to go it
waits; it waits no longer than the route's deadline. The usage row's attempt trail says which. The supervisor's
part (starting the engine again) is played here by the test, with the real state writer; the real engine's is in
tests/serving/test_sleep_engine.py."""
import threading
import time

from panel.channels.models import Channel, Route, RouteChannel
from panel.jobs.models import JobEvent
from panel.jobs.services import job_transition
from panel.serving.models import Deployment, DeploymentState, Nap
from panel.serving.sleep import deployment_fall_asleep
from tests.support.channels import make_deployment
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)
from tests.support.waiting import wait_until

# A gateway process per test (tests/support/gateway.py): requests wait for a waking engine past a test
GATEWAY_PER_TEST = True


def asleep(setup, primary, *, while_waking, only_local=False, deadline=45):
    """The route's local channel belongs to a deployment that has just fallen asleep (through the real writer)."""
    deployment = make_deployment(setup["team"], setup["alice"], "sleepy", served="up-model", state="ready",
                                 port=primary.port)
    Deployment.objects.filter(pk=deployment.pk).update(base_url=primary.base_url)
    Channel.objects.filter(pk=setup["local"].pk).update(deployment=deployment, base_url=primary.base_url)
    Route.objects.filter(pk=setup["route"].pk).update(while_waking=while_waking, deadline_seconds=deadline)
    if only_local:
        RouteChannel.objects.filter(route=setup["route"], channel=setup["cloud"]).delete()
    deployment.refresh_from_db()
    assert deployment_fall_asleep(deployment, minutes=5)
    return deployment


def supervisor_starts_it(deployment, after=1.0):
    """What the deployment's worker does when woken: start the engine (here: the fake behind the channel is already
    up) and say ready once it answers."""
    def run():
        wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == DeploymentState.WAKING, seconds=20,
                   interval=0.05, message="the wake")
        time.sleep(after)
        row = Deployment.objects.get(pk=deployment.pk)
        assert job_transition(row, to=DeploymentState.STARTING, allowed_from=[DeploymentState.WAKING])
        assert job_transition(row, to=DeploymentState.READY, allowed_from=[DeploymentState.STARTING])

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def trail(row):
    return [(step["channel"], step["outcome"]) for step in row.attempt_trail]


def test_a_request_wakes_the_engine_and_goes_to_the_next_channel_meanwhile(gateway, setup, primary, fallback):
    deployment = asleep(setup, primary, while_waking="fallback")
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 200, (response.text, gateway.log()[-3000:])
    [row] = records()
    assert trail(row) == [("local", "waking"), ("cloud", "ok")] and row.fell_back and row.channel == setup["cloud"]
    assert not primary.requests  # the sleeping engine was not called
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.WAKING
    [nap] = Nap.objects.filter(deployment=deployment)
    assert nap.ended_at is not None and nap.woken_by == "a request for chat"


def test_a_request_waits_for_the_engine_when_the_route_says_wait(gateway, setup, primary, fallback):
    deployment = asleep(setup, primary, while_waking="wait")
    thread = supervisor_starts_it(deployment, after=1.0)
    started = time.monotonic()
    response = post(gateway, setup["raw"], CHAT)
    waited = time.monotonic() - started
    thread.join(timeout=30)
    assert response.status_code == 200, response.text
    assert waited > 1.0
    [row] = records()
    assert trail(row) == [("local", "woke"), ("local", "ok")] and not row.fell_back
    assert row.channel == setup["local"] and len(primary.requests) == 1 and not fallback.requests
    assert row.attempt_trail[0]["ms"] >= 1000  # the wait, in the trail
    assert Deployment.objects.get(pk=deployment.pk).state == DeploymentState.READY


def test_with_nowhere_else_to_go_a_request_waits_even_when_the_route_says_fall_back(gateway, setup, primary):
    deployment = asleep(setup, primary, while_waking="fallback", only_local=True)
    thread = supervisor_starts_it(deployment, after=0.5)
    response = post(gateway, setup["raw"], CHAT)
    thread.join(timeout=30)
    assert response.status_code == 200, response.text
    [row] = records()
    assert trail(row) == [("local", "woke"), ("local", "ok")]


def test_a_wait_ends_at_the_routes_deadline_with_a_clear_error(gateway, setup, primary):
    deployment = asleep(setup, primary, while_waking="wait", only_local=True, deadline=2)
    started = time.monotonic()
    response = post(gateway, setup["raw"], CHAT)
    assert time.monotonic() - started < 4
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "waking" and "waking from sleep" in error["message"]
    [row] = records()
    assert trail(row) == [("local", "waking")] and row.outcome == "error"
    assert Deployment.objects.get(pk=deployment.pk).state == DeploymentState.WAKING  # it goes on waking


def test_many_requests_wake_it_once(gateway, setup, primary, fallback):
    deployment = asleep(setup, primary, while_waking="fallback")
    results = []
    threads = [threading.Thread(target=lambda: results.append(post(gateway, setup["raw"], CHAT).status_code))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [200] * 6
    records(6)
    woken = JobEvent.objects.filter(job_id=deployment.pk, to_state=DeploymentState.WAKING)
    assert woken.count() == 1 and woken.get().reason == "woken by a request for chat"
