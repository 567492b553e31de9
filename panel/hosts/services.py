"""Worker hosts announce themselves; engine checks run on the host they describe; jobs queued to a lost host fail."""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from panel.hosts.models import EngineCheck, WorkerHost
from panel.jobs import diagnosis, processes
from panel.jobs.models import JobState
from panel.jobs.runner import run_job
from panel.jobs.services import job_created, job_enqueue, job_fail, job_models


def host_heartbeat(*, name, host, kind, queues, cpu_count, memory_bytes, memory_available_bytes, gpus, pid,
                   started_at, slots=None):
    """Insert or refresh the row of worker `name`."""
    values = {
        "host": host, "kind": kind, "queues": list(queues), "cpu_count": cpu_count, "memory_bytes": memory_bytes,
        "memory_available_bytes": memory_available_bytes, "gpus": gpus, "pid": pid, "started_at": started_at,
        "slots": slots, "last_seen": timezone.now(),
    }
    worker, _ = WorkerHost.objects.update_or_create(name=name, defaults=values)
    return worker


def host_offline(*, name):
    """A worker that shuts down cleanly says so at once, instead of waiting to look stale."""
    WorkerHost.objects.filter(name=name).update(last_seen=None)


def host_price_set(*, host, gpu_price_per_hour, gpu_count):
    """Set (or clear, with None) the host's GPU price per hour and GPU count."""
    WorkerHost.objects.filter(pk=host.pk).update(gpu_price_per_hour=gpu_price_per_hour, gpu_count=gpu_count)
    host.gpu_price_per_hour, host.gpu_count = gpu_price_per_hour, gpu_count
    return host


def engine_check_launch(*, team, user, host):
    """Queue an engine check on `host`'s own queue. Returns the EngineCheck."""
    with transaction.atomic():
        check = EngineCheck.objects.create(team=team, created_by=user, host=host, queue=host.host_queue)
        job_created(check, actor=user, reason=f"engine check on {host.host} requested")
        job_enqueue(check, "panel.hosts.tasks.run_engine_check")
    return check


def engine_check_execute(*, check_id, worker):
    """Body of the engine-check task: run engine/engine_probe.py in the engine venv."""
    check = EngineCheck.objects.select_related("host").get(pk=check_id)
    argv = processes.engine_argv(settings.ENGINE_PYTHON, "engine_probe")
    return run_job(check, argv, worker=worker, classify=diagnosis.classify, time_limit=300)


def gpu_hosts_online():
    """The GPU worker hosts online now (a job queued on `gpu` lands on one of them)."""
    return [host for host in WorkerHost.objects.filter(kind="gpu").order_by("host") if host.is_online]


def jobs_of_lost_hosts_fail(*, stale_after_seconds):
    """Fail every job still pending on the queue of a host that stopped heartbeating more than `stale_after_seconds`
    ago (lost, or shut down for good): nobody would start it, and whoever waits on it (a user, the scaler) would
    wait forever. A worker of that host that comes back finds it failed and leaves it. Returns the failed jobs."""
    cutoff = timezone.now() - timedelta(seconds=stale_after_seconds)
    online = set(WorkerHost.objects.filter(last_seen__gte=cutoff).values_list("host", flat=True))
    lost = {f"gpu.{host}": host for host in WorkerHost.objects.filter(kind="gpu", last_seen__lt=cutoff)
            .values_list("host", flat=True) if host not in online}
    failed = []
    for model in job_models():
        for job in model.objects.filter(state=JobState.PENDING, queue__in=list(lost)):
            reason = (f"its host {lost[job.queue]} stopped sending heartbeats over {stale_after_seconds} s ago, "
                      "before a worker there started it: launch it again where a worker runs")
            if job_fail(job, kind="host_lost", reason=reason, event="reaper: " + reason):
                failed.append(job)
    return failed
