"""Celery tasks of panel.hosts: an id in, a service call, the row holds the state."""
from celery import shared_task
from django.conf import settings

from panel.hosts.services import engine_check_execute, jobs_of_lost_hosts_fail


@shared_task(bind=True, soft_time_limit=600, time_limit=660)
def run_engine_check(self, check_id):
    engine_check_execute(check_id=check_id, worker=self.request.hostname or "unknown")


@shared_task
def fail_jobs_of_lost_hosts():
    return len(jobs_of_lost_hosts_fail(stale_after_seconds=settings.JOB_STALE_AFTER_SECONDS))
