"""The job/state helper every long-running thing reuses (quantization jobs, deployments, engine checks...).

A concrete job subclasses `Job`. State changes go through `panel.jobs.services.job_transition` only: one
conditional UPDATE, so two workers (or a redelivered message) can never both move the same job."""
from django.conf import settings
from django.db import models


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.CANCELLING)
LIVE_STATES = (JobState.RUNNING, JobState.CANCELLING)  # a worker owns the job and must heartbeat
FINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Job(models.Model):
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    progress = models.PositiveSmallIntegerField(default=0)  # 0-100
    phase = models.CharField(max_length=200, blank=True)
    log_tail = models.TextField(blank=True)
    failure_kind = models.CharField(max_length=40, blank=True)
    failure_reason = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=100, blank=True)
    worker = models.CharField(max_length=200, blank=True)  # the Celery node that claimed it
    pid = models.IntegerField(null=True, blank=True)  # process group of the runner, while it runs
    heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    @property
    def is_active(self):
        return self.state in ACTIVE_STATES

    @property
    def is_final(self):
        return self.state in FINAL_STATES

    @property
    def duration_seconds(self):
        if self.started_at is None:
            return None
        from django.utils import timezone

        end = self.finished_at or timezone.now()
        return (end - self.started_at).total_seconds()

    @classmethod
    def job_type(cls):
        return cls._meta.label_lower


class JobEvent(models.Model):
    """Who or what moved a job from one state to another, and why."""

    job_type = models.CharField(max_length=100)
    job_id = models.BigIntegerField()
    from_state = models.CharField(max_length=12)
    to_state = models.CharField(max_length=12)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    reason = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job_type", "job_id"])]

    def __str__(self):
        return f"{self.job_type}#{self.job_id}: {self.from_state} -> {self.to_state}"
