"""Celery tasks: thin. An id comes in, a service does the work, the row holds the state.

Job tasks carry the job time limits; a deployment's task acks at once and has no time limit (it lives as long
as its engine), and if its worker dies the reaper fails the deployment instead of Redis redelivering it."""
from celery import shared_task
from celery.utils.log import get_task_logger
from django.conf import settings

log = get_task_logger(__name__)

JOB_LIMITS = {"soft_time_limit": settings.JOB_SOFT_TIME_LIMIT, "time_limit": settings.JOB_HARD_TIME_LIMIT}


def _worker_name(task):
    return task.request.hostname or "unknown"


@shared_task(bind=True, name="workers.tasks.run_engine_check", soft_time_limit=600, time_limit=660)
def run_engine_check(self, check_id):
    from panel.hosts.services import engine_check_execute

    engine_check_execute(check_id=check_id, worker=_worker_name(self))


@shared_task(bind=True, name="workers.tasks.run_quantization", **JOB_LIMITS)
def run_quantization(self, job_id):
    from panel.registry.services import quantization_execute

    quantization_execute(job_id=job_id, worker=_worker_name(self))


@shared_task(bind=True, name="workers.tasks.run_deployment", acks_late=False)
def run_deployment(self, deployment_id):
    from panel.serving.services import deployment_execute

    deployment_execute(deployment_id=deployment_id, worker=_worker_name(self))


@shared_task(name="workers.tasks.reap_stale_jobs", soft_time_limit=60, time_limit=90)
def reap_stale_jobs():
    from panel.jobs.services import jobs_reap
    from panel.serving.services import deployments_reap

    stale = settings.JOB_STALE_AFTER_SECONDS
    return len(jobs_reap(stale_after_seconds=stale)) + len(deployments_reap(stale_after_seconds=stale))
