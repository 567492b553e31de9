"""Celery tasks of panel.notifications: one delivery attempt, and beat's sweep of what is due."""
from celery import shared_task

from panel.notifications.delivery import delivery_attempt
from panel.notifications.services import deliveries_due, delivery_send


@shared_task(soft_time_limit=90, time_limit=120, ignore_result=True)
def deliver(delivery_id):
    return delivery_attempt(delivery_id)


@shared_task(soft_time_limit=30, time_limit=60, ignore_result=True)
def deliver_due():
    """Send every delivery whose retry time has come (and any a lost worker held), so none waits on a lost message."""
    due = deliveries_due()
    for delivery_id in due:
        delivery_send(delivery_id)
    return len(due)
