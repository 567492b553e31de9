import shlex
from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import models
from django.utils import timezone

from panel.channels.local_channels import adapter_channel_sync, local_channel_sync
from panel.core import crypto
from panel.jobs.models import Job, JobState, state_choices
from panel.notifications.models import EventKind
from panel.registry.models import LoraAdapter
from panel.serving.profile_fields import FIELDS_BY_NAME as F


def _choices(name):
    return list(F[name].choices)


class ServingProfile(models.Model):
    """vLLM's config.toml as a saved form: how one model is served by vLLM."""

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
    # not in config.toml
    served_model_name = models.CharField(max_length=200, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    tool_call_parser = models.CharField(max_length=20, blank=True, choices=_choices("tool_call_parser"),
                                        default=F["tool_call_parser"].default)
    extra_args = models.CharField(max_length=1000, blank=True)
    # not an engine flag: the panel stops an idle engine and starts it again on the next request (serving/sleep.py)
    sleep_after_minutes = models.FloatField(null=True, blank=True)
    # LoRA ([0098]): adapters of the model the engine loads at start (--lora-modules), and how many it runs in one
    # batch (--max-loras) up to which rank (--max-lora-rank); 0 adapters at once = LoRA off. More can be loaded at
    # run time (serving/adapters.py) up to the same rank.
    lora_adapters = models.ManyToManyField("registry.LoraAdapter", blank=True, related_name="serving_profiles")
    max_loras = models.PositiveSmallIntegerField(default=0)
    max_lora_rank = models.PositiveSmallIntegerField(default=16)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="profile_name_unique_per_team")]

    @property
    def serves_lora(self):
        return self.max_loras > 0

    def __str__(self):
        return self.name

    @property
    def served_name(self):
        return self.served_model_name or self.model.name

    def not_yours(self, doing):
        """The refusal a member hears who would `doing` ("change", "launch") a profile another made
        (accounts.roles.OTHERS): what its deployments serve on the team's routes is its maker's or an admin's call."""
        return (f"Only the member who created the profile {self.name} and the team's admins may {doing} it. "
                f"To {doing} one like it, import its config.toml as a profile of your own.")


DeploymentState = JobState  # a deployment's states are job states: pending, starting, ready, stopping, stopped, failed
DEPLOYMENT_STATES = (JobState.PENDING, JobState.STARTING, JobState.READY, JobState.STOPPING, JobState.STOPPED,
                     JobState.FAILED, JobState.ASLEEP, JobState.WAKING, JobState.DRAINING)
# Asleep and waking are live: the deployment's worker still owns it (it heartbeats and starts the engine on a wake).
# Draining too: a replica taken out of rotation by the scaler finishes its requests, then stops (serving/scaling.py).
LIVE_DEPLOYMENT_STATES = (DeploymentState.STARTING, DeploymentState.READY, DeploymentState.STOPPING,
                          DeploymentState.ASLEEP, DeploymentState.WAKING, DeploymentState.DRAINING)
# The states in which a deployment keeps its local channel on its route although its engine is not serving: the
# gateway wakes it (serving/sleep.py). A woken engine is starting with its channel still enabled; one started any
# other way has none enabled yet.
SLEEPING_STATES = (DeploymentState.ASLEEP, DeploymentState.WAKING, DeploymentState.STARTING)
ACTIVE_DEPLOYMENT_STATES = (DeploymentState.PENDING,) + LIVE_DEPLOYMENT_STATES


class Deployment(Job):
    """One vLLM server launched from a profile on a worker host: a job that runs until it is stopped, owned by that
    host's GPU worker (pending -> starting -> ready -> stopping -> stopped, or failed)."""

    LIVE_STATES = LIVE_DEPLOYMENT_STATES
    ACTIVE_STATES = ACTIVE_DEPLOYMENT_STATES
    FINAL_STATES = (DeploymentState.STOPPED, DeploymentState.FAILED)
    CLAIMED = DeploymentState.STARTING
    STOPPING = DeploymentState.STOPPING
    STOPPED = DeploymentState.STOPPED
    FAILED = DeploymentState.FAILED
    FAILURE_EVENT = EventKind.DEPLOYMENT_FAILED

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="deployments")
    state = models.CharField(max_length=10, choices=state_choices(DEPLOYMENT_STATES), default=JobState.PENDING,
                             db_index=True)
    profile = models.ForeignKey(ServingProfile, on_delete=models.PROTECT, related_name="deployments")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    port = models.PositiveIntegerField(null=True, blank=True)
    base_url = models.CharField(max_length=300, blank=True)  # how the gateway reaches it: http://host:port/v1
    gpu_indices = models.JSONField(default=list, blank=True)
    command = models.JSONField(default=list, blank=True)
    served_model_name = models.CharField(max_length=200, blank=True)
    restart_on_crash = models.BooleanField(default=False)
    max_restarts = models.PositiveSmallIntegerField(default=3)
    restarts = models.PositiveSmallIntegerField(default=0)
    verification = models.JSONField(default=dict, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)  # when it first became ready (a restart keeps it)
    # The engine's own key (vLLM's VLLM_API_KEY), random per start, encrypted like a channel's: only the
    # deployment's local channel (and the supervisor's readiness check) sends it.
    engine_key_ciphertext = models.TextField(blank=True)
    # An admin said at launch that its local channel may join the team's existing route of the same served name;
    # without it the channel is made but left off that route (no takeover of the team's traffic).
    attach_to_route = models.BooleanField(default=False)
    # Replicas: a deployment of N replicas is its first row (replica_of empty, replica_index 0) and N-1 rows that
    # point at it; each is one engine with its own job, host, port and local channel (docs/ARCHITECTURE.md).
    replica_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="other_replicas")
    replica_index = models.PositiveSmallIntegerField(default=0)

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"{self.profile.name} #{self.pk}"

    @property
    def head_id(self):
        """The id of the deployment this row is a replica of (its own for the first replica)."""
        return self.replica_of_id or self.pk

    @property
    def replica_number(self):
        return self.replica_index + 1

    def replicas(self):
        """Every replica of this row's deployment, the first one first."""
        return list(Deployment.objects.filter(models.Q(pk=self.head_id) | models.Q(replica_of_id=self.head_id))
                    .select_related("host").order_by("replica_index", "pk"))

    def replicas_final(self, replicas=None):
        """Every replica of the deployment has stopped or failed (a page of it stops polling)."""
        return all(replica.is_final for replica in (replicas or self.replicas()))

    def engine_figures(self):
        """This engine's last good scrape (the dashboards' engine samples, through their reverse relation): in
        flight, waiting, KV cache use and the prefix-cache hit rate since the engine started; None before one."""
        sample = self.engine_samples.filter(ok=True, period=0).order_by("-at").first()
        if sample is None:
            return None
        counters = (sample.cumulative or {}).get("counters", {})
        queries = counters.get("prefix_queries") or 0
        return {"at": sample.at, "running": sample.running, "waiting": sample.waiting,
                "kv_cache_usage": sample.kv_cache_usage,
                "prefix_hit_rate": (counters.get("prefix_hits") or 0) / queries if queries else None}

    def engine_key(self):
        """The engine's key in plain text ("" before its first start); CredentialError when it cannot be read."""
        return crypto.decrypt(self.engine_key_ciphertext) if self.engine_key_ciphertext else ""

    def on_transition(self):
        # Whoever sees a ready deployment sees its local channel, and a stopped one is no longer routed.
        local_channel_sync(self)
        self.adapters_follow()

    def adapters_follow(self):
        """Its LoRA adapters follow its state, in the transaction of the move. Ready: the adapters its engine was
        started with get their rows, and every adapter its local channel on the route. Asleep or waking: the
        channels stay on, where a request wakes the engine, as the deployment's own does. Otherwise (a restart,
        stopping) they are off. An adapter loaded at run time keeps its row until the deployment stops or fails:
        its next engine (after a crash or a wake) loads it again before the move to ready
        (serving/adapters.adapters_reload)."""
        ready = self.state == DeploymentState.READY
        if ready:
            # What the engine was started with (its command), not what the profile says now: it may have changed.
            started = [token.split("=", 2)[1] for token in self.command or [] if token.startswith("--lora-modules=")]
            gone = self.adapters.filter(at_start=True).exclude(adapter__served_name__in=started)
            for served in gone.values_list("adapter__served_name", flat=True):
                adapter_channel_sync(self, served_name=served, serving=False)
            gone.delete()
            for adapter in LoraAdapter.objects.filter(team_id=self.team_id, served_name__in=started):
                DeploymentAdapter.objects.get_or_create(deployment=self, adapter=adapter, defaults={"at_start": True})
        for served in self.adapters.values_list("adapter__served_name", flat=True):
            adapter_channel_sync(self, served_name=served, serving=ready or self.sleeping)
        if self.state in self.FINAL_STATES:
            self.adapters.all().delete()

    def nap_seconds(self, *, since, until):
        """Seconds asleep within [since, until] (epoch seconds): its GPU hours stop meanwhile."""
        total = 0.0
        for nap in self.naps.filter(began_at__lt=datetime.fromtimestamp(until, tz=dt_timezone.utc)).exclude(
                ended_at__lt=datetime.fromtimestamp(since, tz=dt_timezone.utc)):
            ended = nap.ended_at.timestamp() if nap.ended_at else until
            total += max(min(ended, until) - max(nap.began_at.timestamp(), since), 0)
        return total

    def hourly_price(self):
        """The host's GPU price per hour × the deployment's GPUs (its recorded GPU indices, else the host's GPU
        count, else 1); None when the host has no price."""
        host = self.host
        if host is None or host.gpu_price_per_hour is None:
            return None
        gpus = len(self.gpu_indices or []) or host.gpu_count or 1
        return float(host.gpu_price_per_hour) * gpus

    @property
    def routable(self):
        """The gateway may send requests to it (its local channel is enabled)."""
        return self.state == DeploymentState.READY

    @property
    def sleeping(self):
        """Asleep, or woken and not ready yet: a request to its (still enabled) local channel wakes it and waits or
        falls back (gateway/waking.py). Starting counts because only a woken deployment's channel is enabled while it
        starts: a first start has no channel yet, and a restart after a crash disabled it when it went pending."""
        return self.state in SLEEPING_STATES

    @property
    def uptime_seconds(self):
        if self.ready_at is None:
            return None
        return ((self.finished_at or timezone.now()) - self.ready_at).total_seconds()

    @property
    def command_line(self):
        return " ".join(shlex.quote(part) for part in self.command)


class Nap(models.Model):
    """A stretch during which a deployment slept (its engine stopped after idle minutes): from falling asleep until
    a request woke it, or until it was stopped. Its GPU hours stop meanwhile (dashboards/cost.py)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="naps")
    began_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    woken_by = models.CharField(max_length=200, blank=True)  # "a request for tiny-chat", "alice", "stopped"

    class Meta:
        ordering = ["began_at"]
        indexes = [models.Index(fields=["deployment", "began_at"])]


class ScalePolicy(models.Model):
    """Scale on queue for one deployment (its first replica's row): between `min_replicas` and `max_replicas`
    engines; one more when requests keep waiting or the KV cache stays full for `up_after_seconds`, one fewer when
    nothing has waited and the KV cache stayed low for `down_after_seconds` (serving/scaling.py)."""

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="scale_policy")
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(default=2)
    up_waiting = models.FloatField(default=1.0)  # requests waiting per replica, on average, throughout the window
    up_kv_cache = models.FloatField(default=0.8)  # 0..1: KV cache use per replica, on average, throughout
    up_after_seconds = models.PositiveIntegerField(default=60)
    down_after_seconds = models.PositiveIntegerField(default=300)
    changed_at = models.DateTimeField(null=True, blank=True)  # the last replica added or drained
    last_decision = models.CharField(max_length=500, blank=True)  # what the scaler last did or could not do, in words
    last_decision_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.min_replicas}-{self.max_replicas} replicas"


class DeploymentAdapter(models.Model):
    """A LoRA adapter a running engine serves: loaded at start (its profile's) or at run time through vLLM's load
    endpoint. Its local channel sends `model` = the adapter's served name to the deployment's engine
    (channels.local_channels.adapter_channel_sync); the row goes when the adapter is unloaded or the engine stops."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="adapters")
    adapter = models.ForeignKey("registry.LoraAdapter", on_delete=models.CASCADE, related_name="deployments")
    at_start = models.BooleanField(default=False)
    loaded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["adapter__name"]
        constraints = [models.UniqueConstraint(fields=["deployment", "adapter"], name="adapter_once_per_deployment")]
