"""Celery tasks of panel.benchmarks: thin wrappers over its service functions. All run on the default queue; a
ladder or sweep task lives as long as its steps (it waits for the GPU worker's deployments)."""
from celery import shared_task
from django.conf import settings

import workers  # noqa: F401  (loads the Celery app, so a task sent from the web process uses its broker)

JOB_LIMITS = {"soft_time_limit": settings.JOB_SOFT_TIME_LIMIT, "time_limit": settings.JOB_HARD_TIME_LIMIT}


@shared_task(bind=True, name="benchmarks.run_benchmark", **JOB_LIMITS)
def run_benchmark(self, run_id):
    from panel.benchmarks.services import benchmark_execute

    benchmark_execute(run_id=run_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, name="benchmarks.run_ladder", **JOB_LIMITS)
def run_ladder(self, ladder_id):
    from panel.benchmarks.ladder import ladder_execute

    ladder_execute(ladder_id=ladder_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, name="benchmarks.run_sweep", **JOB_LIMITS)
def run_sweep(self, sweep_id):
    from panel.benchmarks.ladder import sweep_execute

    sweep_execute(sweep_id=sweep_id, worker=self.request.hostname or "unknown")
