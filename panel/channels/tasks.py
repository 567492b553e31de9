"""Celery tasks of panel.channels: the canary guard, on beat."""
from celery import shared_task

from panel.channels.canary import canaries_check


@shared_task(soft_time_limit=30, time_limit=60)
def check_canaries():
    """Roll back what trips its guards, promote what the automatic schedule allows."""
    return canaries_check()
