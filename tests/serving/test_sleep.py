"""Sleep when idle, without an engine (serving/sleep.py): the idle watch, the states a sleeping deployment goes
through with their consequences in the same transaction (its local channel stays on the route, its nap), a stop
while asleep, the drain that a wake cuts short, the supervisor's wait, GPU hours less the naps (the Cost tab's
column and the deployment page's words), and the profile's field. The real engine's sleep and wake:
tests/serving/test_sleep_engine.py."""
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from panel.channels.models import Channel
from panel.channels.routing import routing_version, target_for
from panel.dashboards.cost import deployment_asleep_hours, deployment_up_hours
from panel.dashboards.pages import dashboard_page
from panel.dashboards.selectors import DashboardQuery
from panel.jobs.services import job_cancel
from panel.serving import drain, sleep
from panel.serving.forms import ServingProfileForm
from panel.serving.models import Deployment, DeploymentState, Nap
from panel.serving.sleep import IdleWatch, SleepHooks, deployment_fall_asleep, deployment_wake, wait_while_asleep
from tests.support.dashboards import NOW, make_deployment


def test_the_idle_watch_counts_from_the_last_sign_of_work():
    watch = IdleWatch(1, now=0)  # one minute
    assert not watch.observe((100.0, 0), now=10)
    assert not watch.observe((100.0, 0), now=50)
    assert watch.observe((100.0, 0), now=61)  # nothing taken in, nothing in flight for 61 s
    assert not watch.observe((140.0, 0), now=62)  # a request came and went between two looks
    assert not watch.observe((140.0, 1), now=130)  # one in flight
    assert not watch.observe((140.0, 0), now=180)
    assert watch.observe((140.0, 0), now=191)
    assert not watch.observe(None, now=200)  # no answer: not idle (busy, or restarting)
    assert watch.observe((140.0, 0), now=261)


@pytest.fixture
def ready(team_setup):
    deployment = make_deployment(team_setup["team_a"], price=Decimal("3"), gpu_count=1)
    deployment.profile.sleep_after_minutes = 5
    deployment.profile.save()
    Deployment.objects.filter(pk=deployment.pk).update(state="starting", ready_at=None)
    deployment.refresh_from_db()
    from panel.jobs.services import job_transition

    assert job_transition(deployment, to=DeploymentState.READY, allowed_from=[DeploymentState.STARTING],
                          ready_at=timezone.now())
    return Deployment.objects.select_related("profile", "host").get(pk=deployment.pk)


def test_asleep_keeps_its_channel_on_the_route_and_a_wake_ends_its_nap(ready, django_capture_on_commit_callbacks):
    channel = Channel.objects.get(deployment=ready)
    assert channel.enabled and target_for(channel).sleeping is None
    before = routing_version(ready.team_id)
    with django_capture_on_commit_callbacks(execute=True):
        assert deployment_fall_asleep(ready, minutes=5)
    assert routing_version(ready.team_id) != before  # the gateways re-read the route
    channel.refresh_from_db()
    assert channel.enabled and target_for(channel).sleeping == ready.pk
    [nap] = Nap.objects.filter(deployment=ready)
    assert nap.ended_at is None
    assert not deployment_fall_asleep(ready, minutes=5)  # only a ready one falls asleep

    assert deployment_wake(ready, by="alice")
    assert not deployment_wake(ready, by="bob")  # already waking: once
    nap.refresh_from_db()
    assert ready.state == DeploymentState.WAKING and nap.ended_at is not None and nap.woken_by == "alice"
    channel.refresh_from_db()
    assert channel.enabled and target_for(channel).sleeping == ready.pk  # still waking: requests wait or go on


def test_a_stop_while_asleep_disables_the_channel(ready):
    assert deployment_fall_asleep(ready, minutes=5)
    assert job_cancel(ready, reason="stop requested")
    assert ready.state == DeploymentState.STOPPING
    assert not Channel.objects.get(deployment=ready).enabled


def test_a_wake_during_the_drain_makes_it_ready_again_without_stopping_the_engine(ready, monkeypatch):
    hooks = SleepHooks(ready)
    monkeypatch.setattr(drain, "engine_activity", lambda port, key: (10.0, 0))
    hooks.watch = IdleWatch(5, now=0)
    monkeypatch.setattr(sleep.time, "monotonic", lambda: 301.0)
    hooks.after_beat(DeploymentState.READY)
    assert ready.state == DeploymentState.ASLEEP and hooks.asleep_since == 301.0
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False  # the drain: gateways still learn of the sleep
    assert deployment_wake(ready, by="a request for tiny-chat")
    assert hooks.stop_engine(DeploymentState.WAKING) is False
    ready.refresh_from_db()
    assert ready.state == DeploymentState.READY and Channel.objects.get(deployment=ready).enabled


def test_after_the_drain_the_engine_stops_once_it_runs_nothing(ready, monkeypatch):
    hooks = SleepHooks(ready)
    clock = {"now": 1000.0}
    monkeypatch.setattr(sleep.time, "monotonic", lambda: clock["now"])
    busy = {"value": 1}
    monkeypatch.setattr(drain, "engine_activity", lambda port, key: (10.0, busy["value"]))
    assert deployment_fall_asleep(ready, minutes=5)
    hooks.asleep_since = 1000.0
    clock["now"] += drain.drain_seconds() + 0.1
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False  # a request still running
    busy["value"] = 0
    assert hooks.stop_engine(DeploymentState.ASLEEP) is True
    busy["value"] = 1
    clock["now"] = 1000.0 + drain.DRAIN_DEADLINE_SECONDS
    assert hooks.stop_engine(DeploymentState.ASLEEP) is True  # the drain's deadline


def test_the_supervisor_waits_asleep_until_woken_or_stopped(ready, transactional_db):
    assert deployment_fall_asleep(ready, minutes=5)
    found = {}
    thread = threading.Thread(target=lambda: found.setdefault("woken", wait_while_asleep(ready, poll_every=0.05)))
    thread.start()
    deployment_wake(Deployment.objects.get(pk=ready.pk), by="alice")
    thread.join(timeout=10)
    assert found == {"woken": True}

    Deployment.objects.filter(pk=ready.pk).update(state=DeploymentState.ASLEEP)
    Nap.objects.create(deployment=ready, began_at=timezone.now())
    job_cancel(Deployment.objects.get(pk=ready.pk))
    assert wait_while_asleep(ready, poll_every=0.05) is False
    assert not Nap.objects.filter(deployment=ready, ended_at__isnull=True).exists()
    assert Nap.objects.filter(deployment=ready).last().woken_by == "stopped"


def test_gpu_hours_stop_while_asleep(team_setup):
    deployment = make_deployment(team_setup["team_a"], price=Decimal("2"), gpu_count=1, ready_hours=6)
    hour = timedelta(hours=1)
    start = NOW - 6 * hour
    Nap.objects.create(deployment=deployment, began_at=start + hour, ended_at=start + 3 * hour)
    Nap.objects.create(deployment=deployment, began_at=start + 5 * hour)  # asleep now
    since, until = start.timestamp(), NOW.timestamp()
    assert deployment_up_hours(deployment, since=since, until=until) == pytest.approx(3.0)
    assert deployment_asleep_hours(deployment, since=since, until=until) == pytest.approx(3.0)
    # A window inside the first nap and the awake stretch after it.
    assert deployment_up_hours(deployment, since=(start + 2 * hour).timestamp(),
                               until=(start + 4 * hour).timestamp()) == pytest.approx(1.0)
    # The Cost tab: 3 GPU hours at 2.00 on the idle line, 3 hours asleep beside them.
    page = dashboard_page(tab="cost", query=DashboardQuery(team=team_setup["team_a"], range="24h",
                                                           now=NOW.timestamp()))
    table = next(table for table in page.tables if table.name == "cost")
    [line] = table.rows
    columns = dict(zip(table.columns, line))
    assert (columns["GPU hours"], columns["hours asleep"]) == (3.0, 3.0)
    assert columns["cost"] == 6.0
    assert "hours asleep" in table.note


@pytest.mark.parametrize("value, ok", [("0.1", True), ("15", True), ("0", False), ("0.05", False),
                                       ("20000", False), ("", True)])
def test_the_profile_says_when_it_sleeps(team_setup, value, ok):
    deployment = make_deployment(team_setup["team_a"])
    profile = deployment.profile
    data = {name: getattr(profile, name) for name in ("name", "dtype", "quantization", "max_model_len",
                                                      "block_size", "gpu_memory_utilization", "swap_space",
                                                      "max_num_seqs", "max_num_batched_tokens",
                                                      "tensor_parallel_size", "pipeline_parallel_size")}
    data.update(model=profile.model_id, max_model_len=1, enable_prefix_caching=True, enable_chunked_prefill=True,
                sleep_after_minutes=value, quantization_bits="", port="", served_model_name="", extra_args="",
                tool_call_parser="")
    form = ServingProfileForm(data, team=team_setup["team_a"], instance=profile)
    assert form.is_valid() is ok, form.errors
    if not ok:
        assert list(form.errors) == ["sleep_after_minutes"]
