"""Benchmark runs, config ladders and max_num_seqs sweeps. All three are jobs on the default queue."""
from decimal import Decimal

from django.db import models

from panel.jobs.models import Job


class WorkloadKind(models.TextChoices):
    BUILTIN = "builtin", "Built-in prompt set"
    FILE = "file", "Uploaded file"
    SYNTHETIC = "synthetic", "Synthetic prompts of a given length"


class Workload(models.Model):
    """The load: which prompts, how many, how hard. Shared by runs, ladders and sweeps so every step of a ladder
    or sweep sends exactly the same thing."""

    workload = models.CharField(max_length=10, choices=WorkloadKind.choices, default=WorkloadKind.BUILTIN)
    prompts = models.JSONField(default=list, blank=True)  # an uploaded file's prompts (lists of messages)
    prompts_name = models.CharField(max_length=255, blank=True)
    input_tokens = models.PositiveIntegerField(default=128)  # synthetic only
    output_tokens = models.PositiveIntegerField(default=64)  # max_tokens of every request
    shared_system_prompt = models.BooleanField(default=False)  # synthetic only: exercises prefix caching
    requests = models.PositiveIntegerField(default=50)
    warmup_requests = models.PositiveIntegerField(default=2)
    concurrency = models.PositiveIntegerField(default=4)
    request_rate = models.FloatField(null=True, blank=True)  # requests/s; empty = closed loop at `concurrency`
    # Service-level objectives for goodput (vLLM's --goodput ttft:.. tpot:.. e2el:..), in ms; empty = not set.
    slo_ttft_ms = models.FloatField(null=True, blank=True)
    slo_tpot_ms = models.FloatField(null=True, blank=True)
    slo_e2el_ms = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def workload_summary(self):
        if self.workload == WorkloadKind.SYNTHETIC:
            what = f"synthetic {self.input_tokens} → {self.output_tokens} tokens"
            if self.shared_system_prompt:
                what += ", shared system prompt"
        elif self.workload == WorkloadKind.FILE:
            what = (f"{self.prompts_name or 'uploaded file'} ({len(self.prompts)} prompts), "
                    f"≤ {self.output_tokens} tokens out")
        else:
            what = f"built-in prompts, ≤ {self.output_tokens} tokens out"
        load = (f"{self.request_rate:g} req/s (≤ {self.concurrency} in flight)" if self.request_rate
                else f"concurrency {self.concurrency}")
        slo = self.goodput_slo
        goodput = (" · goodput SLO " + ", ".join(f"{key.upper()} ≤ {value:g} ms" for key, value in slo.items())
                   if slo else "")
        return f"{self.requests} requests ({self.warmup_requests} warm-up) · {what} · {load}{goodput}"

    @property
    def goodput_slo(self):
        """{"ttft": ms, "tpot": ms, "e2el": ms} for the SLOs that are set."""
        return {key: getattr(self, f"slo_{key}_ms") for key in ("ttft", "tpot", "e2el")
                if getattr(self, f"slo_{key}_ms")}

    def workload_fields(self):
        """The workload as keyword arguments, to give a ladder's or sweep's steps the same one."""
        return {name: getattr(self, name) for name in WORKLOAD_FIELDS}


WORKLOAD_FIELDS = ("workload", "prompts", "prompts_name", "input_tokens", "output_tokens", "shared_system_prompt",
                   "requests", "warmup_requests", "concurrency", "request_rate", "slo_ttft_ms", "slo_tpot_ms",
                   "slo_e2el_ms")


class TargetKind(models.TextChoices):
    DEPLOYMENT = "deployment", "Deployment"
    CHANNEL = "channel", "Channel"
    ROUTE = "route", "Route"
    IMPORTED = "imported", "Imported result"


class Ladder(Job, Workload):
    """The usual order of tuning work for one model, measured: FP16 baseline → + AWQ → + prefix caching → + larger
    max_num_seqs and chunked prefill. `result["steps"]` holds each step's outcome (run id or skip reason)."""

    model = models.ForeignKey("registry.RegisteredModel", on_delete=models.CASCADE, related_name="ladders")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    small_max_num_seqs = models.PositiveIntegerField(default=8)
    large_max_num_seqs = models.PositiveIntegerField(default=64)
    max_model_len = models.PositiveIntegerField(default=2048)
    extra_args = models.CharField(max_length=1000, blank=True)
    gpu_price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal(0))
    repeats = models.PositiveSmallIntegerField(default=3)  # measurements per step, for a spread

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"Ladder #{self.pk} for {self.model.name}"


class Sweep(Job, Workload):
    """The same load at several max_num_seqs values of one profile; the best throughput within a P99 target."""

    profile = models.ForeignKey("serving.ServingProfile", on_delete=models.CASCADE, related_name="sweeps")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    values = models.JSONField(default=list)  # max_num_seqs values, ascending
    p99_target_ms = models.PositiveIntegerField(default=5000)  # end-to-end P99 latency
    repeats = models.PositiveSmallIntegerField(default=1)  # measurements per value

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"Sweep #{self.pk} of {self.profile.name}"


class BenchmarkRun(Job, Workload):
    """One measured load against a deployment, a channel or a route, or a result imported from `vllm bench serve
    --save-result`. `result` holds the figures in vLLM's terms (metrics.summarize)."""

    name = models.CharField(max_length=200, blank=True)
    target_kind = models.CharField(max_length=12, choices=TargetKind.choices)
    deployment = models.ForeignKey("serving.Deployment", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="benchmark_runs")
    channel = models.ForeignKey("channels.Channel", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="benchmark_runs")
    route = models.ForeignKey("channels.Route", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="benchmark_runs")
    target_label = models.CharField(max_length=300)  # kept when the target is deleted
    ladder = models.ForeignKey(Ladder, null=True, blank=True, on_delete=models.CASCADE, related_name="runs")
    sweep = models.ForeignKey(Sweep, null=True, blank=True, on_delete=models.CASCADE, related_name="runs")
    step = models.CharField(max_length=100, blank=True)  # the ladder step or sweep value it measured

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return self.title

    @property
    def title(self):
        return self.name or f"Run #{self.pk} · {self.target_label}"


class StepProfile(models.Model):
    """A serving profile a ladder or sweep step made for itself. Its deployment's local channel and route are the
    job's own: hidden from the Channels page and the benchmark targets, and removed with the job."""

    profile = models.OneToOneField("serving.ServingProfile", on_delete=models.CASCADE, related_name="benchmark_step")
    ladder = models.ForeignKey(Ladder, null=True, blank=True, on_delete=models.CASCADE, related_name="step_profiles")
    sweep = models.ForeignKey(Sweep, null=True, blank=True, on_delete=models.CASCADE, related_name="step_profiles")
