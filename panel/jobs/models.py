"""The one lifecycle of every long-running thing: engine checks, quantization jobs, benchmark runs, ladders and
sweeps, and deployments (a supervised vLLM server is a job that runs until it is stopped).

A concrete kind subclasses `Job`. State changes go through `panel.jobs.services.job_transition` only: one
conditional UPDATE, so two workers (or a redelivered message) can never both move the same job. A kind with states
of its own (a deployment's starting/ready/stopping/stopped) names them in the class attributes below, and one with
consequences that must land with a state (a deployment's local channel) overrides `on_transition`."""
from django.conf import settings
from django.db import models

from panel.jobs.log_text import log_without_banners
from panel.notifications.models import EventKind


class JobState(models.TextChoices):
    """Every state of every kind of job. A job that runs to an end uses the first six; a deployment (a job that runs
    until it is stopped) is pending and fails like any job, and is otherwise starting, ready, stopping, stopped; one
    whose profile sleeps when idle is asleep (its engine stopped, its worker waiting) and waking (asked to start
    again by a request); a replica the scaler removes is draining (out of rotation, finishing what it runs)."""
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    ASLEEP = "asleep", "Asleep"
    WAKING = "waking", "Waking"
    DRAINING = "draining", "Draining"


def state_choices(states):
    """The `choices` of a kind's state field: its own states, in the order given."""
    return [(state.value, state.label) for state in states]


RUN_STATES = (JobState.PENDING, JobState.RUNNING, JobState.CANCELLING, JobState.SUCCEEDED, JobState.FAILED,
              JobState.CANCELLED)
ACTIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.CANCELLING)
LIVE_STATES = (JobState.RUNNING, JobState.CANCELLING)  # a worker owns the job and must heartbeat
FINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Job(models.Model):
    # The states of this kind of job: which are live (a worker owns the job and heartbeats it), active (pending
    # or live), final (finished_at is set); where a claim moves a pending job, where a stop request parks a live one
    # (its worker ends it at the next beat), where that stop ends and where a failure goes.
    LIVE_STATES = LIVE_STATES
    ACTIVE_STATES = ACTIVE_STATES
    FINAL_STATES = FINAL_STATES
    CLAIMED = JobState.RUNNING
    STOPPING = JobState.CANCELLING
    STOPPED = JobState.CANCELLED
    FAILED = JobState.FAILED
    FAILURE_EVENT = EventKind.JOB_FAILED  # what a team's webhooks hear when a job of this kind fails

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    state = models.CharField(max_length=12, choices=state_choices(RUN_STATES), default=JobState.PENDING,
                             db_index=True)
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
    def log_shown(self):
        """The log as a page shows it: third-party banners left out (log_tail keeps them)."""
        return log_without_banners(self.log_tail)

    @property
    def is_active(self):
        return self.state in self.ACTIVE_STATES

    @property
    def is_final(self):
        return self.state in self.FINAL_STATES

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

    def on_transition(self):
        """Called inside the transaction of every state change, after the row moved: what a reader of the new state
        must see with it. Nothing for most kinds."""


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
