"""The usage record: one row per gateway request (Compare's and benchmarks' too), whatever happened. Written in
batches by `panel.usage.writer`; read by budgets, canaries, the advisor and the dashboards' rollups."""
from django.db import models
from django.utils import timezone

# Steps of an attempt trail that say how the request was placed, not attempts: by KV events (gateway/kv_placement.py),
# or past a busy local engine to the cloud (gateway/spill.py): no call was made, so nothing failed.
PLACEMENT_STEPS = frozenset({"kv_placed", "kv_missed", "kv_fallback", "spilled"})


class RequestLog(models.Model):
    """Exactly one row per gateway request, whatever happened (a request refused before its key was known has no
    team). Never a prompt or a key."""

    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    key = models.ForeignKey("accounts.TeamKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    route = models.ForeignKey("channels.Route", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    channel = models.ForeignKey("channels.Channel", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    endpoint = models.CharField(max_length=40)
    model = models.CharField(max_length=200)
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()
    # ok, error, client_closed, upstream_stalled (no first byte / a stream gap past the channel's timeouts),
    # upstream_cut (the stream broke after the first byte)
    outcome = models.CharField(max_length=20)
    request_id = models.CharField(max_length=32, blank=True, default="")  # the x-request-id header of the answer
    error_kind = models.CharField(max_length=40, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Upstream 429 answers met on the way, retried ones included (the advisor's evidence). Nullable so that adding
    # it to a large table is an ALTER TABLE on SQLite too, not a copy; rows from before it was added have None.
    rate_limited_attempts = models.PositiveSmallIntegerField(null=True, blank=True)
    fell_back = models.BooleanField(default=False)  # the answer did not come from the route's first choice
    # Every upstream attempt in order: [{"channel", "channel_id", "outcome", "ms", "status"}] (empty: none made).
    attempt_trail = models.JSONField(default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    # Prompt tokens written to the provider's prompt cache (Anthropic's cache_creation_input_tokens), part of
    # prompt_tokens like cached_tokens. Nullable: adding it is an ALTER TABLE, not a copy of the table.
    cache_write_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Which token figures are estimated, not reported by the upstream: "prompt", "completion", "prompt+completion"
    # (a client that left before the usage chunk, a channel that reports none: panel/gateway/exchange.py). None:
    # every figure is the upstream's own. Nullable: adding it is an ALTER TABLE, not a copy of the table.
    tokens_estimated = models.CharField(max_length=20, null=True, blank=True)
    # Completion tokens the model spent reasoning before its answer, where the upstream reports them (OpenAI's
    # completion_tokens_details / output_tokens_details); part of completion_tokens and priced with them. Nullable.
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Tool calls the provider ran itself and bills per call (Anthropic's web searches, a Responses answer's web and
    # file searches), priced at the channel's price per thousand calls and part of `cost`. None: none reported.
    server_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField()
    cost = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    # A local request's share of its deployment's GPU cost in its minute, already part of `cost`
    # (panel/dashboards/local_cost.py). None: not allocated (a remote channel, an unpriced host, a minute not yet
    # allocated). Nullable: adding it is an ALTER TABLE, not a copy of the table.
    gpu_cost = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    json_requested = models.BooleanField(default=False)
    json_valid = models.BooleanField(null=True, blank=True)
    # Keyed hashes of the system prompt as sent and with its dynamic-looking spans masked (gateway/fingerprint.py):
    # many raw hashes under one masked hash = a prompt that defeats the prefix cache. Never the prompt itself.
    system_prompt_hash = models.CharField(max_length=16, blank=True, default="")
    system_prompt_shape_hash = models.CharField(max_length=16, blank=True, default="")
    # A keyed hash of the prompt's first 1,024 characters as the model reads them (tools, system prompt, messages):
    # requests that open alike, by a system prompt or by a document starting the user turn (the Cache tab).
    prompt_head_hash = models.CharField(max_length=16, blank=True, default="")
    # True: the route's local engine was expected to keep this request waiting longer than the route's spill wait,
    # so it went to a remote channel first (panel/gateway/spill.py). None: not spilled. Nullable: an ALTER TABLE.
    spilled = models.BooleanField(null=True, blank=True)
    # The canary arm this request was assigned to (None: the route had no running canary).
    canary = models.BooleanField(null=True, blank=True)
    # The route's rule that chose the channels (None: the route's own list, or no route).
    route_rule = models.ForeignKey("channels.RouteRule", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # The agent session the request belongs to (panel/gateway/sessions.py): its id, this request's turn in it and
    # the share of this request's prompt that repeats the previous turn's prompt (from keyed prefix-block hashes).
    session_id = models.CharField(max_length=64, blank=True, default="")
    session_turn = models.PositiveIntegerField(null=True, blank=True)
    repeated_share = models.FloatField(null=True, blank=True)
    # The request's tags as "|a|b|" (panel/usage/tags.py), None for none: budgets and the Cost tab per tag.
    tags = models.CharField(max_length=600, null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "created_at"], name="gateway_req_team_id_333225_idx"),
                   # the API's usage export walks a team's rows by id (keyset pagination)
                   models.Index(fields=["team", "id"], name="usage_team_id_keyset_idx"),
                   # the Agents dashboard reads a team's sessions
                   models.Index(fields=["team", "session_id"], name="usage_team_session_idx")]
        db_table = "gateway_requestlog"  # created by the gateway app, which held the model first


class TrafficSample(models.Model):
    """One request of a route that keeps samples (opted in per route, panel/usage/samples.py): the conversation in
    chat messages and the answer the client got, redacted and then encrypted together in `payload`. Deleted after
    the route's retention; never shown to anyone outside the team."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    route = models.ForeignKey("channels.Route", on_delete=models.CASCADE, related_name="samples")
    channel = models.ForeignKey("channels.Channel", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    request_id = models.CharField(max_length=32, blank=True, default="")  # its usage record's
    endpoint = models.CharField(max_length=40)
    model = models.CharField(max_length=200)
    redacted = models.PositiveIntegerField(default=0)  # how many matches the redaction replaced
    payload = models.TextField()  # encrypted JSON: {"messages": [...], "answer": "...", "json_requested": bool}

    class Meta:
        ordering = ["-created_at", "-pk"]
