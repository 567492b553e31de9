"""Celery tasks of panel.jobs: the reaper, on beat."""
from celery import shared_task
from django.conf import settings

from panel.jobs.services import jobs_reap


@shared_task(soft_time_limit=60, time_limit=90)
def reap_stale_jobs():
    return len(jobs_reap(stale_after_seconds=settings.JOB_STALE_AFTER_SECONDS))
