"""Celery tasks of panel.serving.

A deployment's task acks at once and has no time limit: it lives as long as its engine, and if its worker dies the
reaper fails the deployment instead of Redis handing it to a second worker. The scaler's pass runs on beat."""
from celery import shared_task

from panel.serving.scaling import deployments_scale
from panel.serving.services import deployment_execute


@shared_task(bind=True, acks_late=False)
def run_deployment(self, deployment_id):
    deployment_execute(deployment_id=deployment_id, worker=self.request.hostname or "unknown")


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def scale_deployments():
    """The scaler's pass (on beat, queue default)."""
    return deployments_scale()
