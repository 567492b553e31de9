"""Celery tasks: thin. An id comes in, a service does the work, the job row holds the state."""
from celery import shared_task
from celery.utils.log import get_task_logger
from django.conf import settings

log = get_task_logger(__name__)


def _worker_name(task):
    return task.request.hostname or "unknown"


@shared_task(bind=True, name="workers.tasks.run_engine_check")
def run_engine_check(self, check_id):
    from panel.hosts.services import engine_check_execute

    engine_check_execute(check_id=check_id, worker=_worker_name(self))


@shared_task(name="workers.tasks.reap_stale_jobs")
def reap_stale_jobs():
    from panel.jobs.services import jobs_reap

    reaped = jobs_reap(stale_after_seconds=settings.JOB_STALE_AFTER_SECONDS)
    return len(reaped)


@shared_task(bind=True, name="workers.tasks.run_quantization")
def run_quantization(self, job_id):
    from panel.registry.services import quantization_execute

    quantization_execute(job_id=job_id, worker=_worker_name(self))
