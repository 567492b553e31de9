"""Dashboard data: per-minute and per-hour rollups of the gateway's usage records, and engine metric samples
scraped from each ready deployment's /metrics. The pages read these tables only, never RequestLog."""
from django.conf import settings
from django.db import models

from panel.jobs.models import Job

# Upper bounds (ms) of the fixed histogram buckets for TTFT and end-to-end latency; the last bucket is open.
# Percentiles come from these buckets, so a rollup row answers them without the raw records.
BUCKET_BOUNDS_MS = (25, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 20000, 60000)
BUCKETS = len(BUCKET_BOUNDS_MS) + 1

MINUTE = 60
HOUR = 3600
DAY = 86400  # UTC days


class RollupPeriod(models.Model):
    """What a rollup row is of: one period (a minute, an hour or a UTC day) of one team's records for one channel /
    key / model. `start` is the period's start in epoch seconds, so pages group by any coarser step with integer
    division on both databases."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    period = models.PositiveIntegerField()  # MINUTE, HOUR or DAY
    start = models.BigIntegerField()
    channel = models.ForeignKey("channels.Channel", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+", db_constraint=False)
    deployment = models.ForeignKey("serving.Deployment", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", db_constraint=False)
    key = models.ForeignKey("accounts.TeamKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            db_constraint=False)
    model = models.CharField(max_length=200)

    class Meta:
        abstract = True


class UsageRollup(RollupPeriod):
    """The usage records of one period for one team / channel / key / model (RollupPeriod)."""

    local = models.BooleanField(default=False)  # served by a deployment (a vLLM pool is not: cost.py tells it by kind)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    # The part of `errors` that the clients caused (4xx: an unknown model, a bad key, a spent budget, a bad
    # request): shown apart from the error rate. Nullable: adding it is an ALTER TABLE, not a copy of the table.
    refused = models.PositiveIntegerField(null=True, blank=True)
    fallbacks = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)  # prompt tokens written to the provider's cache
    # Completion tokens spent reasoning (part of completion_tokens), where upstreams report them. Nullable, as refused.
    reasoning_tokens = models.BigIntegerField(null=True, blank=True)
    server_tool_calls = models.BigIntegerField(null=True, blank=True)  # provider tool calls billed per call
    cost = models.FloatField(default=0)
    # Requests a busy local engine spilled to a remote channel (gateway/spill.py), and what they cost there.
    # Nullable, as refused.
    spilled = models.PositiveIntegerField(null=True, blank=True)
    spilled_cost = models.FloatField(null=True, blank=True)
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_sum_ms = models.FloatField(default=0)
    latency_sum_ms = models.FloatField(default=0)

    class Meta:
        indexes = [models.Index(fields=["team", "period", "start"], name="usage_rollup_team_start")]


# One integer column per bucket (ttft_b0.., latency_b0..): SQL sums them in the same GROUP BY as the counts.
TTFT_COLUMNS = tuple(f"ttft_b{i}" for i in range(BUCKETS))
LATENCY_COLUMNS = tuple(f"latency_b{i}" for i in range(BUCKETS))
for _name in TTFT_COLUMNS + LATENCY_COLUMNS:
    UsageRollup.add_to_class(_name, models.PositiveIntegerField(default=0))


class TagRollup(RollupPeriod):
    """The usage records of one period carrying one tag (panel/usage/tags.py), per channel / key / model: the Cost
    tab's table by tag. A record with two tags counts in both tags' rows, so these rows do not add up to the team's
    total; UsageRollup does. Written with UsageRollup, in the same transaction (panel/dashboards/tag_rollup.py)."""

    tag = models.CharField(max_length=64)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    cost = models.FloatField(default=0)

    class Meta:
        indexes = [models.Index(fields=["team", "period", "start"], name="tag_rollup_team_start")]


class ProviderStatement(models.Model):
    """A provider's usage export for one cloud channel, compared day by day with the usage rows when it was imported
    (panel/dashboards/statements.py). `lines`: one per UTC day, the provider's and the gateway's figures and the
    differences, in words too."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey("channels.Channel", null=True, on_delete=models.SET_NULL, related_name="+")
    channel_name = models.CharField(max_length=100)  # kept when the channel is deleted
    file_name = models.CharField(max_length=200)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    reading = models.TextField()  # how the file's columns were read
    left_out = models.PositiveIntegerField(default=0)  # lines of other models
    first_day = models.DateField()
    last_day = models.DateField()
    differing_days = models.PositiveIntegerField(default=0)
    lines = models.JSONField(default=list)

    class Meta:
        ordering = ["-created_at", "-pk"]


class StatementImport(Job):
    """A provider's usage export waiting to be read, or read (a `Job` on the default queue: the web process only
    checks the file as a whole; the task reads every cell and compares, panel/dashboards/statements.py). `payload`
    is the file's text until the import ends; `statement` what it saved."""

    channel = models.ForeignKey("channels.Channel", null=True, on_delete=models.SET_NULL, related_name="+")
    channel_name = models.CharField(max_length=100)
    file_name = models.CharField(max_length=200)
    payload = models.TextField(blank=True)
    statement = models.OneToOneField(ProviderStatement, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")

    class Meta(Job.Meta):
        verbose_name = "statement import"


class RollupWatermark(models.Model):
    """The last RequestLog id the rollup has read (one row)."""

    last_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)


class LocalCostWatermark(models.Model):
    """How far a deployment's (or a vLLM pool's) GPU cost has been allocated to its requests
    (panel/dashboards/local_cost.py): every minute from `allocated_since` to before `allocated_until` (epoch
    seconds); `checked_id` is the highest RequestLog id seen when it last looked, from which it looks for rows
    written late into an allocated minute. Exactly one of `deployment` and `channel` (the pool's) is set."""

    deployment = models.OneToOneField("serving.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                      related_name="+")
    channel = models.OneToOneField("channels.Channel", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="+")
    allocated_since = models.BigIntegerField()  # the first minute allocated: nothing before it is ever rewritten
    allocated_until = models.BigIntegerField()
    checked_id = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(
            condition=models.Q(deployment__isnull=True) ^ models.Q(channel__isnull=True), name="watermark_one_source")]


class EngineSample(models.Model):
    """One scrape of a deployment's /metrics, or of a vLLM pool's (its engines' /metrics summed; the channel is the
    source then, channels/pools.py): what changed since the previous good scrape (deltas of counters and
    histograms), the gauges as read, and the cumulative values the next scrape subtracts. A failed scrape is a gap:
    ok=False with the warning in words."""

    deployment = models.ForeignKey("serving.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="engine_samples")
    channel = models.ForeignKey("channels.Channel", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="+")  # a vLLM pool's samples
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(db_index=True)
    ok = models.BooleanField(default=True)  # False: a gap (the scrape failed); a compacted row: any scrape worked
    gaps = models.PositiveIntegerField(default=0)  # failed scrapes this row stands for
    period = models.PositiveIntegerField(default=0)  # 0: one scrape; a minute, hour or day: compacted (compaction.py)
    warning = models.TextField(blank=True)
    restarted = models.BooleanField(default=False)  # a counter went down: the engine restarted
    seconds = models.FloatField(default=0)  # since the previous good scrape; 0 for the first
    prefix_queries = models.FloatField(default=0)
    prefix_hits = models.FloatField(default=0)
    prompt_tokens = models.FloatField(default=0)
    generation_tokens = models.FloatField(default=0)
    preemptions = models.FloatField(default=0)  # requests the engine preempted (KV cache full)
    kv_cache_usage = models.FloatField(null=True, blank=True)  # 0..1
    running = models.FloatField(null=True, blank=True)
    waiting = models.FloatField(null=True, blank=True)
    ttft = models.JSONField(default=dict, blank=True)  # {"le": {bound: delta count}, "count": n, "sum": s}
    itl = models.JSONField(default=dict, blank=True)
    cumulative = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["team", "at"], name="engine_sample_team_at"),
                   models.Index(fields=["period", "at"], name="engine_sample_period_at")]
        constraints = [models.CheckConstraint(
            condition=models.Q(deployment__isnull=True) ^ models.Q(channel__isnull=True), name="engine_sample_source")]
