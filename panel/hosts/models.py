from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from panel.jobs.models import Job


class WorkerHost(models.Model):
    """A Celery worker process that announced itself. `name` is its Celery node name (kind@host); GPU workers
    listen on `gpu` and `gpu.<host>`, so jobs can be placed on one host."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, db_index=True)
    kind = models.CharField(max_length=20, default="default")  # "default" or "gpu"
    queues = models.JSONField(default=list)
    cpu_count = models.PositiveIntegerField(default=0)
    memory_bytes = models.BigIntegerField(default=0)
    memory_available_bytes = models.BigIntegerField(default=0)
    gpus = models.JSONField(default=list)  # [{"index", "name", "memory_bytes", "memory_free_bytes"}]
    # Jobs the worker runs at once (its Celery concurrency); a deployment holds one for as long as it runs.
    slots = models.PositiveSmallIntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    # What an hour of one GPU costs on this host (the dashboards' local cost), and how many GPUs a deployment
    # here is billed for when it records none (a CPU host: 1, the price being the whole machine's).
    gpu_price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["host", "name"]

    def __str__(self):
        return self.name

    @property
    def is_online(self):
        if self.last_seen is None:
            return False
        return timezone.now() - self.last_seen < timedelta(seconds=settings.HOST_OFFLINE_AFTER_SECONDS)

    @property
    def host_queue(self):
        """The queue that reaches this host alone."""
        return f"gpu.{self.host}" if self.kind == "gpu" else "default"

    @property
    def gpu_memory_bytes(self):
        return sum(gpu.get("memory_bytes", 0) for gpu in self.gpus)

    def latest_engine_check(self):
        return self.engine_checks.filter(state="succeeded").order_by("-finished_at").first()


class EngineCheck(Job):
    """What the engine venv on a host can do: versions, CPU extensions, CUDA devices."""

    host = models.ForeignKey(WorkerHost, on_delete=models.CASCADE, related_name="engine_checks")

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"engine check #{self.pk} on {self.host.host}"
