"""LoRA adapters loaded at run time outlive the engine that loaded them (serving/adapters.adapters_reload,
decision 0098): through a restart after a crash (a new engine, a new key) and a wake, the deployment's new engine
loads them again before it is ready and their routes come back; while it restarts their channels are off, while
it sleeps they stay on (a request wakes it); one the new engine refuses is dropped in words; a stop ends them
all. The engine is a fake that answers vLLM's load endpoint behind its key (tests/support/fake_engine.py);
tests/serving/test_lora_engine.py loads into a real one."""
from decimal import Decimal

import pytest

from panel.channels.models import Channel
from panel.core import crypto
from panel.jobs.services import job_transition
from panel.registry.models import LoraAdapter
from panel.serving import drain, sleep
from panel.serving.adapters import adapter_load
from panel.serving.models import Deployment, DeploymentState
from panel.serving.services import DeploymentHooks
from panel.serving.sleep import SleepHooks, deployment_fall_asleep, deployment_wake
from tests.support.dashboards import make_deployment
from tests.support.fake_engine import KEY, engine  # noqa: F401 (a fixture)


@pytest.fixture
def serving(team_setup, engine):
    """A ready deployment of a profile with LoRA on, and two adapters loaded into its engine at run time."""
    deployment = make_deployment(team_setup["team_a"], price=Decimal("3"), gpu_count=1)
    deployment.host.gpus = [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 143 * 1024 ** 3}]
    deployment.host.save()
    profile = deployment.profile
    profile.max_loras, profile.sleep_after_minutes = 2, 5
    profile.save()
    Deployment.objects.filter(pk=deployment.pk).update(port=engine.port, base_url=f"http://127.0.0.1:{engine.port}/v1",
                                                       engine_key_ciphertext=crypto.encrypt(KEY))
    deployment = Deployment.objects.select_related("profile", "host").get(pk=deployment.pk)
    adapters = [LoraAdapter.objects.create(team=deployment.team, base=profile.model, name=name, served_name=name,
                                           path=f"/adapters/{name}", rank=8, hidden_size=1, size_bytes=1)
                for name in ("tone", "terse")]
    for adapter in adapters:
        adapter_load(deployment=deployment, adapter=adapter)
    assert engine.loras == {"tone": "/adapters/tone", "terse": "/adapters/terse"}
    assert routed(deployment) == {"tone": True, "terse": True}
    return deployment


def routed(deployment):
    """Each adapter channel's model and whether it is on."""
    return dict(Channel.objects.filter(deployment=deployment, model_id__in=("tone", "terse"))
                .values_list("model_id", "enabled"))


def test_a_restarted_engine_loads_the_adapters_again_with_its_new_key_and_their_routes_come_back(serving, engine):
    deployment = serving
    assert job_transition(deployment, to=DeploymentState.PENDING, allowed_from=[DeploymentState.READY],
                          reason="crashed; restarting now")
    assert routed(deployment) == {"tone": False, "terse": False}  # no engine: off, their rows kept
    assert set(deployment.adapters.values_list("adapter__served_name", flat=True)) == {"tone", "terse"}

    engine.loras, engine.key = {}, "a-new-engine-key"  # a new engine: nothing loaded, its own key
    Deployment.objects.filter(pk=deployment.pk).update(engine_key_ciphertext=crypto.encrypt("a-new-engine-key"))
    deployment.refresh_from_db()
    assert job_transition(deployment, to=DeploymentState.STARTING, allowed_from=[DeploymentState.PENDING])
    DeploymentHooks(deployment).ready({})

    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY
    assert engine.loras == {"tone": "/adapters/tone", "terse": "/adapters/terse"}
    assert routed(deployment) == {"tone": True, "terse": True}
    channel = Channel.objects.get(deployment=deployment, model_id="tone")
    assert crypto.decrypt(channel.credential_ciphertext) == "a-new-engine-key"
    assert "LoRA adapters loaded again: terse, tone" in deployment.log_tail


def test_an_adapter_the_new_engine_refuses_is_dropped_in_words(serving, engine):
    deployment = serving
    assert job_transition(deployment, to=DeploymentState.STARTING, allowed_from=[DeploymentState.READY])
    engine.loras, engine.fail = {}, "/v1/load_lora_adapter"
    DeploymentHooks(deployment).ready({})
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY and not deployment.adapters.exists()
    assert routed(deployment) == {"tone": False, "terse": False}
    assert "LoRA adapters dropped: terse (the engine refused (500)" in deployment.log_tail


def test_an_engine_woken_in_place_keeps_its_adapters_and_their_routes_come_back(serving, engine):
    deployment = serving
    hooks = SleepHooks(deployment)
    hooks.engine_sleeps = True
    assert deployment_fall_asleep(deployment, minutes=5)
    assert routed(deployment) == {"tone": True, "terse": True}  # asleep: on, where a request wakes the engine
    hooks.asleep_since = sleep.time.monotonic() - drain.drain_seconds() - 1
    assert hooks.stop_engine(DeploymentState.ASLEEP) is False  # asleep in vLLM's sleep mode, its process kept
    assert deployment_wake(deployment, by="a request for tone")
    assert hooks.stop_engine(DeploymentState.WAKING) is False
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY
    assert routed(deployment) == {"tone": True, "terse": True}  # the engine held them ("already been loaded")
    assert [path for path in engine.paths("POST") if path == "/v1/load_lora_adapter"] == [
        "/v1/load_lora_adapter"] * 4  # two loads at first, two asked again after the wake


def test_a_stopped_deployment_ends_its_adapters(serving):
    deployment = serving
    assert job_transition(deployment, to=DeploymentState.STOPPING, allowed_from=[DeploymentState.READY])
    assert deployment.adapters.count() == 2  # stopping: still its own until stopped
    assert job_transition(deployment, to=DeploymentState.STOPPED, allowed_from=[DeploymentState.STOPPING])
    assert not deployment.adapters.exists() and routed(deployment) == {"tone": False, "terse": False}


def test_loads_and_unloads_from_the_page_and_the_api_are_audited_as_adapters(client, serving, engine, team_setup):
    from django.urls import reverse

    from panel.audit.models import AuditEvent
    from tests.support.api_helpers import call, token_for

    deployment, alice = serving, team_setup["alice"]
    tone = LoraAdapter.objects.get(served_name="tone")
    client.force_login(alice)
    assert client.post(reverse("deployment_adapter_unload", args=[deployment.pk, tone.pk])).status_code == 302
    assert "tone" not in engine.loras
    owner = token_for(alice, deployment.team)
    assert call(client, "post", f"/deployments/{deployment.pk}/adapters/{tone.pk}/load", owner).status_code == 200
    assert engine.loras["tone"] == "/adapters/tone" and routed(deployment)["tone"]
    audited = list(AuditEvent.objects.filter(action__startswith="adapter_").order_by("pk")
                   .values_list("action", "target"))
    where = f"on {deployment.profile.name} #{deployment.pk}"
    assert audited == [("adapter_unloaded", f"adapter tone {where}"), ("adapter_loaded", f"adapter tone {where}")]
    assert not AuditEvent.objects.filter(action__startswith="deployment_").exists()
