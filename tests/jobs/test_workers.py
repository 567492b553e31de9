"""Real Redis, real Celery worker processes, the real engine venv: jobs through the broker, duplicate
delivery, a worker killed mid-job, and the reaper on beat."""
import time

import psutil
import pytest

from panel.hosts import tasks
from panel.hosts.models import EngineCheck, WorkerHost
from panel.hosts.services import engine_check_launch
from panel.jobs.models import JobEvent, JobState
from tests.support.waiting import wait_until


def online_gpu_host():
    return wait_until(lambda: WorkerHost.objects.filter(name="gpu@testhost", last_seen__isnull=False).first(),
                      seconds=30, message="the GPU worker to announce itself")


@pytest.mark.engine  # a gpu worker and the engine check
def test_it_runs_a_job_through_the_broker_on_a_real_worker(start_worker, team_setup):
    start_worker("gpu")
    host = online_gpu_host()
    assert host.is_online and host.kind == "gpu"
    assert sorted(host.queues) == ["gpu", "gpu.testhost"]
    assert host.cpu_count >= 1 and host.memory_bytes > 0
    assert host.slots == 3  # workers/start.py's default for a GPU worker (TOKENWISE_GPU_CONCURRENCY)
    # The engine check's int8 probe: a CPU host's W8A8 kernel, exact or saturating (decision 0053).

    check = engine_check_launch(team=team_setup["team_a"], user=team_setup["alice"], host=host)
    assert check.queue == "gpu.testhost"
    wait_until(lambda: EngineCheck.objects.get(pk=check.pk).is_final, seconds=120, message="the check to finish")
    check.refresh_from_db()
    assert check.state == JobState.SUCCEEDED, (check.failure_kind, check.failure_reason, check.log_tail)
    assert check.result["packages"]["vllm"] == "0.32.0"
    assert check.result["packages"]["awq"] == "0.2.9"
    assert check.result["cuda_devices"] == []
    # vLLM's own server options, read from its parser: a profile's extra flag must be one of them.
    assert {"--chat-template", "--seed", "--enforce-eager"} <= set(check.result["engine_flags"])
    assert "--max-num-partial-prefills" not in check.result["engine_flags"]
    assert check.result["int8_exact"] is (check.result["int8_error"] < 1e-3)
    assert check.progress == 100 and "importing vllm" in check.log_tail
    assert check.worker == "gpu@testhost" and check.pid is None


@pytest.mark.engine  # a gpu worker
def test_it_runs_a_redelivered_message_once(start_worker, team_setup):
    worker = start_worker("gpu")
    host = online_gpu_host()
    check = EngineCheck.objects.create(team=team_setup["team_a"], host=host, queue="gpu.testhost")
    # The same message delivered twice, as Redis does after a visibility timeout or a lost ack.
    for _ in range(2):
        tasks.run_engine_check.apply_async(args=[check.pk], queue="gpu.testhost", task_id=f"check-{check.pk}")
    wait_until(lambda: worker.log().count("succeeded in") >= 2, seconds=120, message="both deliveries")
    check.refresh_from_db()
    assert check.state == JobState.SUCCEEDED
    claims = JobEvent.objects.filter(job_type="hosts.enginecheck", job_id=check.pk, to_state=JobState.RUNNING)
    assert claims.count() == 1
    assert "duplicate delivery ignored" in worker.log()


@pytest.mark.engine  # a gpu worker and the engine check
def test_it_fails_the_job_of_a_killed_worker_and_leaves_no_orphan(start_worker, team_setup):
    worker = start_worker("gpu")
    host = online_gpu_host()
    check = engine_check_launch(team=team_setup["team_a"], user=team_setup["alice"], host=host)
    running = wait_until(lambda: EngineCheck.objects.filter(pk=check.pk, state=JobState.RUNNING,
                                                            pid__isnull=False).first(),
                         seconds=30, message="the check to start")
    runner_pid = running.pid
    assert psutil.pid_exists(runner_pid)
    worker.kill()  # SIGKILL, main process and pool: what a lost host looks like
    wait_until(lambda: not psutil.pid_exists(runner_pid) or psutil.Process(runner_pid).status() == "zombie",
               seconds=10, message="the runner to die with its worker")

    # The reaper runs on beat through the default worker and fails what stopped beating.
    start_worker("default", TOKENWISE_JOB_STALE_AFTER_SECONDS="3")
    start_worker("beat", TOKENWISE_REAPER_EVERY_SECONDS="1", TOKENWISE_JOB_STALE_AFTER_SECONDS="3")
    started = time.monotonic()
    wait_until(lambda: EngineCheck.objects.get(pk=check.pk).state == JobState.FAILED, seconds=30,
               message="the reaper to fail the job")
    assert time.monotonic() - started < 30
    check.refresh_from_db()
    assert check.failure_kind == "worker_lost"
    assert "gpu@testhost stopped sending heartbeats" in check.failure_reason


@pytest.mark.parametrize("kind", ["default"])
def test_it_marks_a_stopped_worker_offline(start_worker, kind):
    worker = start_worker(kind)
    wait_until(lambda: WorkerHost.objects.filter(name=f"{kind}@testhost", last_seen__isnull=False).exists(),
               message="the worker to announce itself")
    worker.stop()
    assert not WorkerHost.objects.get(name=f"{kind}@testhost").is_online
