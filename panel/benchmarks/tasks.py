"""Celery tasks of panel.benchmarks: thin wrappers over its service functions. All run on the default queue; a
ladder or sweep task lives as long as its steps (it waits for the GPU worker's deployments)."""
from celery import shared_task
from django.conf import settings

from panel.benchmarks.ladder import ladder_execute, sweep_execute
from panel.benchmarks.services import benchmark_execute

JOB_LIMITS = {"soft_time_limit": settings.JOB_SOFT_TIME_LIMIT, "time_limit": settings.JOB_HARD_TIME_LIMIT}


@shared_task(bind=True, **JOB_LIMITS)
def run_benchmark(self, run_id):
    benchmark_execute(run_id=run_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, **JOB_LIMITS)
def run_ladder(self, ladder_id):
    ladder_execute(ladder_id=ladder_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, **JOB_LIMITS)
def run_sweep(self, sweep_id):
    sweep_execute(sweep_id=sweep_id, worker=self.request.hostname or "unknown")
