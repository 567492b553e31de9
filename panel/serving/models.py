from django.conf import settings
from django.db import models

from panel.serving.profile_fields import FIELDS_BY_NAME as F


def _choices(name):
    return list(F[name].choices)


class ServingProfile(models.Model):
    """The seeds' config.toml as a saved form: how one model is served by vLLM."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="serving_profiles")
    name = models.CharField(max_length=100)
    model = models.ForeignKey("registry.RegisteredModel", on_delete=models.PROTECT, related_name="serving_profiles")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # [model]
    dtype = models.CharField(max_length=10, choices=_choices("dtype"), default=F["dtype"].default)
    quantization = models.CharField(max_length=20, choices=_choices("quantization"),
                                    default=F["quantization"].default)
    quantization_bits = models.PositiveSmallIntegerField(null=True, blank=True, choices=_choices("quantization_bits"))
    max_model_len = models.PositiveIntegerField(default=F["max_model_len"].default)
    # [kv_cache]
    enable_prefix_caching = models.BooleanField(default=F["enable_prefix_caching"].default)
    block_size = models.PositiveIntegerField(choices=_choices("block_size"), default=F["block_size"].default)
    gpu_memory_utilization = models.FloatField(default=F["gpu_memory_utilization"].default)
    swap_space = models.PositiveIntegerField(default=F["swap_space"].default)
    # [batching]
    max_num_seqs = models.PositiveIntegerField(default=F["max_num_seqs"].default)
    max_num_batched_tokens = models.PositiveIntegerField(default=F["max_num_batched_tokens"].default)
    enable_chunked_prefill = models.BooleanField(default=F["enable_chunked_prefill"].default)
    # [parallel]
    tensor_parallel_size = models.PositiveIntegerField(default=F["tensor_parallel_size"].default)
    pipeline_parallel_size = models.PositiveIntegerField(default=F["pipeline_parallel_size"].default)
    # not in the seeds' file
    served_model_name = models.CharField(max_length=200, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    extra_args = models.CharField(max_length=1000, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="profile_name_unique_per_team")]

    def __str__(self):
        return self.name

    @property
    def served_name(self):
        return self.served_model_name or self.model.name


class DeploymentState(models.TextChoices):
    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"


LIVE_DEPLOYMENT_STATES = (DeploymentState.STARTING, DeploymentState.READY, DeploymentState.STOPPING)
ACTIVE_DEPLOYMENT_STATES = (DeploymentState.PENDING,) + LIVE_DEPLOYMENT_STATES


class Deployment(models.Model):
    """One vLLM server launched from a profile on a worker host, owned by that host's GPU worker."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="deployments")
    profile = models.ForeignKey(ServingProfile, on_delete=models.PROTECT, related_name="deployments")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    state = models.CharField(max_length=10, choices=DeploymentState.choices, default=DeploymentState.PENDING,
                             db_index=True)
    queue = models.CharField(max_length=100, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    base_url = models.CharField(max_length=300, blank=True)  # how the gateway reaches it: http://host:port/v1
    pid = models.IntegerField(null=True, blank=True)
    gpu_indices = models.JSONField(default=list, blank=True)
    command = models.JSONField(default=list, blank=True)
    served_model_name = models.CharField(max_length=200, blank=True)
    restart_on_crash = models.BooleanField(default=False)
    max_restarts = models.PositiveSmallIntegerField(default=3)
    restarts = models.PositiveSmallIntegerField(default=0)
    verification = models.JSONField(default=dict, blank=True)
    failure_kind = models.CharField(max_length=40, blank=True)
    failure_reason = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.profile.name} #{self.pk}"

    @classmethod
    def job_type(cls):
        return cls._meta.label_lower

    @property
    def is_active(self):
        return self.state in ACTIVE_DEPLOYMENT_STATES

    @property
    def is_final(self):
        return self.state in (DeploymentState.STOPPED, DeploymentState.FAILED)

    @property
    def uptime_seconds(self):
        if self.ready_at is None:
            return None
        from django.utils import timezone

        return ((self.finished_at or timezone.now()) - self.ready_at).total_seconds()

    @property
    def command_line(self):
        import shlex

        return " ".join(shlex.quote(part) for part in self.command)
