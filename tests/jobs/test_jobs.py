"""The job/state helper: conditional transitions, claims, heartbeats, cancel and the reaper."""
from datetime import timedelta

import pytest
from django.utils import timezone

from panel.hosts.models import EngineCheck, WorkerHost
from panel.jobs.models import JobEvent, JobState
from panel.jobs.services import (
    append_log,
    job_cancel,
    job_cancelled,
    job_claim,
    job_fail,
    job_heartbeat,
    job_succeed,
    job_transition,
    jobs_reap,
)


@pytest.fixture
def job(team_setup):
    host = WorkerHost.objects.create(name="gpu@h1", host="h1", kind="gpu", queues=["gpu", "gpu.h1"])
    return EngineCheck.objects.create(team=team_setup["team_a"], created_by=team_setup["alice"], host=host)


def test_it_claims_a_job_once(job):
    assert job_claim(job, worker="gpu@h1") is True
    duplicate = EngineCheck.objects.get(pk=job.pk)
    assert job_claim(duplicate, worker="gpu@h2") is False
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.worker == "gpu@h1"
    assert JobEvent.objects.filter(job_id=job.pk, to_state=JobState.RUNNING).count() == 1


def test_it_refuses_a_transition_from_the_wrong_state(job):
    assert job_transition(job, to=JobState.SUCCEEDED, allowed_from=[JobState.RUNNING]) is False
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not JobEvent.objects.filter(job_id=job.pk).exists()


def test_it_records_who_and_why(job, team_setup):
    job_cancel(job, actor=team_setup["alice"])
    event = JobEvent.objects.get(job_id=job.pk)
    assert (event.from_state, event.to_state, event.actor) == ("pending", "cancelled", team_setup["alice"])
    assert "before it started" in event.reason
    job.refresh_from_db()
    assert job.finished_at is not None


def test_it_asks_a_running_job_to_stop_through_its_heartbeat(job):
    job_claim(job, worker="w")
    assert job_heartbeat(job, progress=30, phase="layer 1 of 4") == JobState.RUNNING
    job_cancel(job)
    assert job_heartbeat(job, progress=40) == JobState.CANCELLING
    job.refresh_from_db()
    assert (job.progress, job.phase) == (40, "layer 1 of 4")


def test_it_keeps_the_progress_in_range_and_the_log_short(job):
    job_claim(job, worker="w")
    job_heartbeat(job, progress=250, log_lines=[f"line {i}" for i in range(500)])
    job.refresh_from_db()
    assert job.progress == 100
    lines = job.log_tail.splitlines()
    assert len(lines) == 200 and lines[-1] == "line 499"
    assert append_log("a\nb", ["c"]) == "a\nb\nc"


@pytest.mark.parametrize("end", ["fail", "cancel", "reap"])
def test_an_ended_job_has_no_time_left(job, end):
    job_claim(job, worker="gpu@h1")
    job_heartbeat(job, progress=30, phase="calibrating layer 2 of 30, sample 5 of 32 · about 31 s left")
    if end == "fail":
        job_fail(job, kind="failed", reason="Cannot access accelerator device when none is available")
    elif end == "cancel":
        job_cancel(job)
        assert EngineCheck.objects.get(pk=job.pk).phase.endswith("about 31 s left")  # still running: still counts
        job_cancelled(job)
    else:
        EngineCheck.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        jobs_reap(stale_after_seconds=60)
    job.refresh_from_db()
    assert job.is_final and job.phase == "calibrating layer 2 of 30, sample 5 of 32"


def test_it_finishes_and_fails_only_active_jobs(job):
    job_claim(job, worker="w")
    assert job_succeed(job, result={"ok": 1}) is True
    assert job_fail(job, kind="oom", reason="late") is False
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.result == {"ok": 1} and job.progress == 100


def test_it_reaps_jobs_whose_heartbeat_stopped(job, team_setup):
    job_claim(job, worker="gpu@h1")
    fresh = EngineCheck.objects.create(team=team_setup["team_a"], host=job.host)
    job_claim(fresh, worker="gpu@h1")
    EngineCheck.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=120))
    reaped = jobs_reap(stale_after_seconds=60)
    assert [j.pk for j in reaped] == [job.pk]
    job.refresh_from_db()
    fresh.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure_kind == "worker_lost"
    assert "gpu@h1 stopped sending heartbeats" in job.failure_reason
    assert fresh.state == JobState.RUNNING
    assert jobs_reap(stale_after_seconds=60) == []


def test_it_ends_a_stale_cancelling_job_as_cancelled(job):
    job_claim(job, worker="w")
    job_cancel(job)
    EngineCheck.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=120))
    jobs_reap(stale_after_seconds=60)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_a_failed_jobs_cleanup_is_done_before_anyone_sees_it_failed(job):
    """The runner's cleanup (a half-written output removed) runs while the row still says running."""
    import sys

    from panel.jobs.runner import run_job

    seen = []
    argv = [sys.executable, "-c", "print('half way'); raise SystemExit(3)"]
    assert run_job(job, argv, worker="gpu@h1", classify=lambda tail, code: ("crashed", f"exit {code}"),
                   on_end=lambda ended: seen.append(EngineCheck.objects.get(pk=ended.pk).state))
    job.refresh_from_db()
    assert seen == [JobState.RUNNING]
    assert (job.state, job.failure_kind, job.failure_reason) == (JobState.FAILED, "crashed", "exit 3")


def test_a_cleanup_that_fails_still_leaves_the_job_in_its_final_state(job, caplog):
    import sys

    from panel.jobs.runner import run_job

    def broken_cleanup(ended):
        raise PermissionError("read-only file system")

    assert run_job(job, [sys.executable, "-c", "raise SystemExit(3)"], worker="gpu@h1",
                   classify=lambda tail, code: ("crashed", f"exit {code}"), on_end=broken_cleanup)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure_kind == "crashed"
    assert "cleaning up after" in caplog.text and "read-only file system" in caplog.text
