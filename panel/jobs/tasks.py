"""Celery tasks of panel.jobs: the reaper, on beat."""
from celery import shared_task
from django.conf import settings

from panel.jobs.services import jobs_reap


@shared_task(soft_time_limit=60, time_limit=90)
def reap_stale_jobs():
    from panel.serving.services import deployments_reap  # until a deployment is a job like the others

    stale = settings.JOB_STALE_AFTER_SECONDS
    return len(jobs_reap(stale_after_seconds=stale)) + len(deployments_reap(stale_after_seconds=stale))
