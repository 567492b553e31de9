"""Celery tasks of panel.registry: an id in, a service call, the row holds the state."""
from celery import shared_task
from django.conf import settings

from panel.registry.gguf_import import gguf_import_execute
from panel.registry.model_check import model_check_execute
from panel.registry.quality import evaluation_execute
from panel.registry.services import quantization_execute


@shared_task(bind=True, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT, time_limit=settings.JOB_HARD_TIME_LIMIT)
def run_quantization(self, job_id):
    quantization_execute(job_id=job_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT, time_limit=settings.JOB_HARD_TIME_LIMIT)
def run_evaluation(self, job_id):
    evaluation_execute(job_id=job_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT, time_limit=settings.JOB_HARD_TIME_LIMIT)
def run_gguf_import(self, job_id):
    gguf_import_execute(job_id=job_id, worker=self.request.hostname or "unknown")


@shared_task(bind=True, soft_time_limit=settings.JOB_SOFT_TIME_LIMIT, time_limit=settings.JOB_HARD_TIME_LIMIT)
def run_model_check(self, job_id):
    model_check_execute(job_id=job_id, worker=self.request.hostname or "unknown")
