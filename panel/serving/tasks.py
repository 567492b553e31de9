"""Celery tasks of panel.serving.

A deployment's task acks at once and has no time limit: it lives as long as its engine, and if its worker dies the
reaper fails the deployment instead of Redis handing it to a second worker."""
from celery import shared_task

from panel.serving.services import deployment_execute


@shared_task(bind=True, acks_late=False)
def run_deployment(self, deployment_id):
    deployment_execute(deployment_id=deployment_id, worker=self.request.hostname or "unknown")

