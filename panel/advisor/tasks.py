"""Celery tasks of panel.advisor: thin wrappers over its service functions."""
from celery import shared_task


@shared_task(name="panel.advisor.tasks.check_canaries", soft_time_limit=30, time_limit=60)
def check_canaries():
    """The beat's canary guard: roll back what trips, promote what the automatic schedule allows."""
    from panel.channels.canary import canaries_check

    return canaries_check()
