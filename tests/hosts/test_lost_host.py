"""A job queued to a host that stopped heartbeating fails instead of waiting forever (a replica the scaler queued
there, a launch, an engine check); a job on a host that still beats, or on the shared queue, stays pending. On beat
beside the reaper."""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from panel.hosts.models import EngineCheck, WorkerHost
from panel.hosts.services import jobs_of_lost_hosts_fail
from panel.jobs.models import JobEvent
from tests.support.dashboards import make_deployment


def test_jobs_pending_on_a_lost_host_fail_with_the_reason(team_setup):
    team = team_setup["team_a"]
    now = timezone.now()
    lost = WorkerHost.objects.create(name="gpu@lost", host="lost", kind="gpu", last_seen=now - timedelta(seconds=200))
    alive = WorkerHost.objects.create(name="gpu@alive", host="alive", kind="gpu", last_seen=now)
    stopped = WorkerHost.objects.create(name="gpu@stopped", host="stopped", kind="gpu", last_seen=None)
    replica = make_deployment(team)
    replica.state, replica.host, replica.queue = "pending", lost, "gpu.lost"
    replica.save()
    check = EngineCheck.objects.create(team=team, host=lost, queue="gpu.lost")
    kept = [EngineCheck.objects.create(team=team, host=alive, queue="gpu.alive"),
            EngineCheck.objects.create(team=team, host=stopped, queue="gpu.stopped"),  # shut down cleanly: no time
            EngineCheck.objects.create(team=team, host=lost, queue="gpu")]  # any GPU worker takes it

    failed = jobs_of_lost_hosts_fail(stale_after_seconds=90)
    assert {(type(job).__name__, job.pk) for job in failed} == {("Deployment", replica.pk), ("EngineCheck", check.pk)}
    replica.refresh_from_db()
    assert replica.state == "failed" and replica.failure_kind == "host_lost"
    assert "its host lost stopped sending heartbeats over 90 s ago" in replica.failure_reason
    event = JobEvent.objects.filter(job_type=replica.job_type(), job_id=replica.pk, to_state="failed").get()
    assert event.reason.startswith("reaper: its host")
    assert [EngineCheck.objects.get(pk=job.pk).state for job in kept] == ["pending"] * 3
    assert jobs_of_lost_hosts_fail(stale_after_seconds=90) == []  # once

    WorkerHost.objects.create(name="gpu2@lost", host="lost", kind="gpu", last_seen=now)  # a worker of it is back
    again = EngineCheck.objects.create(team=team, host=lost, queue="gpu.lost")
    assert jobs_of_lost_hosts_fail(stale_after_seconds=90) == [] and again.state == "pending"


def test_beat_runs_it_beside_the_reaper():
    entry = settings.CELERY_BEAT_SCHEDULE["fail-jobs-of-lost-hosts"]
    assert entry["task"] == "panel.hosts.tasks.fail_jobs_of_lost_hosts"
    assert entry["schedule"] == settings.CELERY_BEAT_SCHEDULE["reap-stale-jobs"]["schedule"]
