"""Celery tasks of panel.usage: thin wrappers over its service functions (on beat, queue default)."""
from celery import shared_task

from panel.usage.samples import samples_expire


@shared_task(soft_time_limit=120, time_limit=150, ignore_result=True)
def expire_samples():
    return samples_expire()
