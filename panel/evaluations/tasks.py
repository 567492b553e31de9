"""Celery tasks of panel.evaluations: an id in, a service call, the row holds the state."""
from celery import shared_task
from django.conf import settings

from panel.evaluations import canary_guard
from panel.evaluations.autopilot import autopilots_review
from panel.evaluations.runs import eval_run_execute


@shared_task(bind=True, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT, time_limit=settings.JOB_HARD_TIME_LIMIT)
def run_evaluation(self, run_id):
    eval_run_execute(run_id=run_id, worker=self.request.hostname or "unknown")
    canary_guard.after_run(run_id)  # a canary it guards steps up, or rolls back


@shared_task(soft_time_limit=120, time_limit=150, ignore_result=True)
def review_autopilots():
    return len(autopilots_review())
