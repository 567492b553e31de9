"""Channels (OpenAI-compatible upstreams) and routes (a model name clients send -> an ordered list of channels).

The gateway codes against these names: `Channel.api_key()`, `Channel.cost()`, `Route.ordered_channels()`."""
import os
import random
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

from panel.channels.credential_env import env_binding_refusal
from panel.core import crypto
from panel.core.crypto import CredentialError  # noqa: F401  (the gateway imports it from here)
from panel.env import EnvError

MILLION = Decimal(1_000_000)
EMPTY_KEY = "EMPTY"  # the usual placeholder for a local vLLM, which checks no key


class ChannelKind(models.TextChoices):
    LOCAL = "local", "Local vLLM"
    REMOTE = "remote", "Remote provider"
    # Engines the panel did not start (an llm-d gateway, a production-stack router, a KServe service, a plain vLLM):
    # called like a remote channel, their /metrics scraped like a deployment's (channels/pools.py).
    POOL = "pool", "vLLM pool"


class ChannelApis(models.TextChoices):
    """The APIs a channel's upstream speaks. A request in an API the channel does not speak is translated
    (panel/gateway/translation.py, responses_translation.py). "chat" is the OpenAI API as most providers and vLLM
    serve it, the Responses API included; "chat_only" is for a provider without /responses, where a Responses
    request (Codex) is translated to chat completions (docs/decisions/0093-responses-translation.md)."""

    CHAT = "chat", "OpenAI chat completions and Responses"
    CHAT_ONLY = "chat_only", "OpenAI chat completions only (Responses translated)"
    MESSAGES = "messages", "Anthropic Messages"
    BOTH = "both", "OpenAI and Anthropic Messages (a local vLLM)"


# What each choice of Channel.apis speaks without translation: "chat", "responses", "messages".
SPOKEN = {ChannelApis.CHAT: ("chat", "responses"), ChannelApis.CHAT_ONLY: ("chat",),
          ChannelApis.MESSAGES: ("messages",), ChannelApis.BOTH: ("chat", "responses", "messages")}


class CredentialKind(models.TextChoices):
    NONE = "none", "None (EMPTY, for a local vLLM)"
    STORED = "stored", "Stored here, encrypted"
    ENV = "env", "Environment variable"


class CanaryState(models.TextChoices):
    NONE = "", "No canary"
    RUNNING = "running", "Running"
    ROLLED_BACK = "rolled_back", "Rolled back"
    COMPLETED = "completed", "Promoted to 100%"
    STOPPED = "stopped", "Stopped"


CANARY_STEPS = (5, 25, 50, 100)  # a gradual rollout: 5% first, then up


class WhileWaking(models.TextChoices):
    """What a request does when the route's local engine is asleep (its profile sleeps when idle): the request wakes
    it either way. Fall back: the route's next channel answers it meanwhile (a route with no next channel waits).
    Wait: it waits for the engine, up to the route's deadline."""

    FALL_BACK = "fallback", "Go to the next channel while it wakes"
    WAIT = "wait", "Wait for it (up to the deadline)"


class RouteBalance(models.TextChoices):
    """How a route spreads requests over its interchangeable local channels (a deployment's replicas): the leading
    local channels of the strategy's order (panel/gateway/balancing.py). In order: the strategy's order alone."""

    IN_ORDER = "", "In order (no balancing)"
    ROUND_ROBIN = "round_robin", "Round-robin"
    LEAST_IN_FLIGHT = "least_in_flight", "Least in flight"
    SESSION_AFFINITY = "session_affinity", "Session affinity"
    PREFIX_AWARE = "prefix_aware", "Prefix-aware (system prompt and tools)"
    KV_EVENTS = "kv_events", "By the engines' KV-cache events (longest cached prefix; else prefix-aware)"


class RouteStrategy(models.TextChoices):
    LOCAL_FIRST = "local_first", "Local first"
    PRIORITY = "priority", "Priority (in order)"
    WEIGHTED = "weighted", "Weighted"


def _price():
    return models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))


class Channel(models.Model):
    """One OpenAI-compatible upstream: a local vLLM deployment or a remote provider such as TaoToken."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=ChannelKind.choices, default=ChannelKind.REMOTE)
    deployment = models.ForeignKey("serving.Deployment", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="channels")
    base_url = models.CharField(max_length=300)
    model_id = models.CharField(max_length=200)
    apis = models.CharField(max_length=10, choices=ChannelApis.choices, default=ChannelApis.CHAT)
    credential_kind = models.CharField(max_length=10, choices=CredentialKind.choices, default=CredentialKind.NONE)
    credential_ciphertext = models.TextField(blank=True)
    credential_last4 = models.CharField(max_length=4, blank=True)
    credential_env = models.CharField(max_length=100, blank=True)
    # Time budgets of one attempt (docs/ARCHITECTURE.md, "Time budgets"): connecting, the first content token (for a
    # non-streamed request: the answer's headers), the gap between two stream chunks, and the whole attempt.
    connect_timeout_seconds = models.FloatField(default=5)
    first_byte_timeout_seconds = models.FloatField(default=10)
    idle_timeout_seconds = models.FloatField(default=15)
    timeout_seconds = models.FloatField(default=600)  # the total of one attempt, a long stream included
    max_retries = models.PositiveSmallIntegerField(default=3)
    retry_backoff = models.FloatField(default=1.5)
    priority = models.IntegerField(default=100)
    weight = models.PositiveIntegerField(default=1)
    price_input_per_million = _price()
    price_output_per_million = _price()
    price_cached_per_million = _price()
    # Input tokens written to a provider's prompt cache (Anthropic's cache_creation_input_tokens); empty: billed at
    # the input price, for providers that charge nothing extra.
    price_cache_write_per_million = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Tool calls the provider runs itself and bills per call (web searches, file searches), per thousand calls.
    price_tool_calls_per_thousand = _price()
    # A vLLM pool's engines (kind "pool"; panel/channels/pools.py): their /metrics, one URL a line, read with the
    # bearer token (encrypted like a stored key); the GPUs they run on and the price of one GPU-hour, for the GPU-time
    # cost; the requests they run at once (the sum of their max_num_seqs), for the spill rule.
    scrape_urls = models.TextField(blank=True)
    scrape_token_ciphertext = models.TextField(blank=True)
    scrape_token_last4 = models.CharField(max_length=4, blank=True)
    gpu_count = models.PositiveIntegerField(default=0)
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    batch_slots = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    misconfigured = models.TextField(blank=True)  # why the gateway must not call it; blank = ok
    last_test = models.JSONField(default=dict, blank=True)
    last_tested_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="channel_name_unique_per_team")]

    def __str__(self):
        return self.name

    @property
    def is_local(self):
        return self.kind == ChannelKind.LOCAL

    @property
    def is_pool(self):
        return self.kind == ChannelKind.POOL

    def scrape_url_list(self):
        """A pool's scrape URLs, in the order given."""
        return [line.strip() for line in (self.scrape_urls or "").splitlines() if line.strip()]

    def gpu_hourly_price(self):
        """A pool's GPU cost per hour (its GPUs × the price of one GPU-hour); None without both."""
        if not self.is_pool or self.price_per_gpu_hour is None or not self.gpu_count:
            return None
        return float(self.price_per_gpu_hour) * self.gpu_count

    @property
    def is_engine_channel(self):
        """A local channel at its own deployment's address: the only kind the panel calls on this machine."""
        deployment = self.deployment if self.deployment_id else None
        return (self.kind == ChannelKind.LOCAL and deployment is not None and bool(deployment.base_url)
                and deployment.team_id == self.team_id
                and deployment.base_url.rstrip("/") == (self.base_url or "").rstrip("/"))

    def api_key(self):
        """The plaintext key to send upstream: "EMPTY" for none, the variable's value for env, the decrypted key for
        stored. CredentialError (with the reason in words) when it cannot be produced; never the ciphertext."""
        if self.credential_kind == CredentialKind.NONE:
            return EMPTY_KEY
        if self.credential_kind == CredentialKind.ENV:
            if not self.credential_env:
                raise CredentialError("the channel reads its key from an environment variable but names none")
            refusal = env_binding_refusal(self)
            if refusal:  # a channel saved before the rule, or a variable or address the operator no longer allows
                raise CredentialError(refusal[1])
            value = os.environ.get(self.credential_env, "").strip()
            if not value:
                raise CredentialError(f"the environment variable {self.credential_env} is not set (or empty) in the "
                                      "panel's environment: set it where the panel runs and restart it")
            if value.lower().startswith("bearer"):
                raise CredentialError(f"the value of {self.credential_env} starts with \"Bearer\": the client adds "
                                      "\"Bearer \" itself, so set the variable to the key alone")
            if any(char.isspace() or not 32 < ord(char) < 127 for char in value):
                raise CredentialError(f"the value of {self.credential_env} has spaces, line breaks or non-ASCII "
                                      "characters: a key has none (copy it again)")
            return value
        if self.credential_kind == CredentialKind.STORED:
            if not self.credential_ciphertext:
                raise CredentialError("no key is stored for this channel: enter one")
            try:
                return crypto.decrypt(self.credential_ciphertext)
            except EnvError as error:
                raise CredentialError(str(error)) from None
        raise CredentialError(f"unknown credential kind {self.credential_kind!r}")

    def credential_problem(self):
        """Why api_key() fails, or "" when it works."""
        try:
            self.api_key()
        except CredentialError as error:
            return str(error)
        return ""

    @property
    def problem(self):
        """Why the gateway does not call this channel, for the pages: the reason stored when it was saved or tested,
        or the operator's bindings, which may have changed since; "" when none."""
        if self.misconfigured or self.credential_kind != CredentialKind.ENV or not self.credential_env:
            return self.misconfigured
        refusal = env_binding_refusal(self)
        return refusal[1] if refusal else ""

    @property
    def credential_display(self):
        """What the pages show: never the key, only its last four characters."""
        if self.credential_kind == CredentialKind.STORED:
            return f"••••{self.credential_last4}"
        if self.credential_kind == CredentialKind.ENV:
            return f"${{{self.credential_env}}}"
        return EMPTY_KEY

    def speaks(self, api):
        """Whether the upstream speaks `api` ("chat", "responses" or "messages") itself, without translation."""
        return api in SPOKEN.get(self.apis, ())

    def cost(self, prompt_tokens, completion_tokens, cached_tokens=0, cache_write_tokens=0, tool_calls=0):
        """The price of one request in the panel's currency. Cached tokens (reads) and cache writes are part of the
        prompt tokens and are billed at the cached and cache-write prices instead of the input price (writes at
        the input price when the channel has no cache-write price); the provider's own tool calls (`tool_calls`,
        web searches and the like) at the price per thousand calls."""
        prompt = max(int(prompt_tokens or 0), 0)
        cached = min(max(int(cached_tokens or 0), 0), prompt)
        written = min(max(int(cache_write_tokens or 0), 0), prompt - cached)
        completion = max(int(completion_tokens or 0), 0)
        write_price = self.price_input_per_million if self.price_cache_write_per_million is None else (
            self.price_cache_write_per_million)
        total = (Decimal(prompt - cached - written) * self.price_input_per_million
                 + Decimal(cached) * self.price_cached_per_million
                 + Decimal(written) * write_price
                 + Decimal(completion) * self.price_output_per_million)
        calls = max(int(tool_calls or 0), 0)
        return total / MILLION + (Decimal(calls) * self.price_tool_calls_per_thousand / 1000 if calls else 0)

    @property
    def prices_display(self):
        def plain(value):
            return format(value.normalize(), "f") if value else "0"

        text = (f"input {plain(self.price_input_per_million)} · output {plain(self.price_output_per_million)} · "
                f"cached input {plain(self.price_cached_per_million)}")
        if self.price_cache_write_per_million is not None:
            text += f" · cache write {plain(self.price_cache_write_per_million)}"
        if self.price_tool_calls_per_thousand:
            text += f" · tool calls {plain(self.price_tool_calls_per_thousand)} per 1K"
        return text

    @property
    def test_ok(self):
        return bool(self.last_test) and bool(self.last_test.get("ok"))

    @property
    def test_failure(self):
        """"its last Test failed: <diagnosis>" when the channel was tested and failed; "" otherwise."""
        if not self.last_test or self.last_test.get("ok"):
            return ""
        return "its last Test failed: " + (self.last_test.get("diagnosis") or self.last_test.get("kind")
                                           or "no answer")


class Route(models.Model):
    """What clients send as `model`, mapped to channels tried in the order the strategy gives."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="routes")
    model_name = models.CharField(max_length=200)
    strategy = models.CharField(max_length=20, choices=RouteStrategy.choices, default=RouteStrategy.LOCAL_FIRST)
    fallback_on_error = models.BooleanField(default=True)
    # Bounds every attempt, retry, backoff and fallback until the answer starts (below a client's usual 60 s).
    deadline_seconds = models.FloatField(default=45)
    while_waking = models.CharField(max_length=10, choices=WhileWaking.choices, default=WhileWaking.FALL_BACK)
    # Spill to the cloud on overload (panel/gateway/spill.py): a request whose local engine's expected wait exceeds
    # this many milliseconds goes to the route's remote channels first instead of queueing. 0: off.
    spill_wait_ms = models.PositiveIntegerField(default=0)
    # Over the leading local channels (a deployment's replicas): panel/gateway/balancing.py.
    balance = models.CharField(max_length=20, choices=RouteBalance.choices, default=RouteBalance.IN_ORDER,
                               blank=True)
    # Session affinity's key: this header, else the Anthropic metadata.user_id, else the key.
    affinity_header = models.CharField(max_length=100, default="x-session-id", blank=True)
    enabled = models.BooleanField(default=True)
    channels = models.ManyToManyField(Channel, through="RouteChannel", related_name="routes")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Canary rollout (panel/channels/canary.py): `canary_percent` of the requests go to the candidate channel first,
    # the rest to the route's own channels, which never include the candidate.
    canary_channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    canary_state = models.CharField(max_length=12, choices=CanaryState.choices, default=CanaryState.NONE,
                                    blank=True)
    canary_percent = models.PositiveSmallIntegerField(default=0)
    canary_auto = models.BooleanField(default=False)  # promoted by the schedule when each step stays clean
    canary_started_at = models.DateTimeField(null=True, blank=True)
    canary_step_at = models.DateTimeField(null=True, blank=True)  # when the current share began: the window
    canary_reason = models.TextField(blank=True)  # why it was rolled back, in words
    canary_evidence = models.JSONField(default=dict, blank=True)  # the last guard check's numbers
    canary_checked_at = models.DateTimeField(null=True, blank=True)
    # Why the canary may not step up yet, set by the part of the panel that guards it beyond the gateway's numbers
    # (the autopilot: its evaluation set has not passed on the candidate since the canary started). "": no hold.
    canary_hold = models.CharField(max_length=500, blank=True, default="")
    # Samples of this route's traffic kept as evaluation material (panel/usage/samples.py): off at 0.
    samples_per_day = models.PositiveIntegerField(default=0)
    sample_retention_days = models.PositiveSmallIntegerField(default=14)
    sample_redactions = models.TextField(blank=True)  # the team's regular expressions, one per line

    class Meta:
        ordering = ["model_name"]
        constraints = [models.UniqueConstraint(fields=["team", "model_name"], name="route_model_unique_per_team")]

    def __str__(self):
        return self.model_name

    def entries(self):
        """RouteChannel rows with their channels, by position."""
        return list(self.routechannel_set.select_related("channel").order_by("position", "pk"))

    @property
    def canary_active(self):
        """The candidate gets traffic: a running canary, or one promoted to 100%."""
        return (self.canary_channel_id is not None and self.canary_percent > 0
                and self.canary_state in (CanaryState.RUNNING, CanaryState.COMPLETED))

    def ordered_channels(self, rng=random):
        """The enabled channels in the order to try them for one request (see `order_channels`)."""
        return order_channels(self.strategy, self.entries(), rng=rng)


class RouteChannel(models.Model):
    # Default reverse names (route.routechannel_set, channel.routechannel_set): the gateway reads them.
    route = models.ForeignKey(Route, on_delete=models.CASCADE)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE)
    position = models.PositiveIntegerField(default=0)
    weight = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["position", "pk"]
        constraints = [models.UniqueConstraint(fields=["route", "channel"], name="channel_once_per_route")]

    def __str__(self):
        return f"{self.route} → {self.channel} (#{self.position})"


def order_channels(strategy, entries, *, rng=random):
    """Order a route's channels for one request. `entries` are RouteChannel rows (or anything with .channel,
    .position and .weight), so the gateway can call this on a cached list without a query.

    local_first: local channels first, then the rest, each by position. priority: by position. weighted: one
    weighted-random pick first (by the entry's weight; weight 0 is never picked first), then the rest by position
    as fallbacks. Disabled channels are left out."""
    usable = sorted((entry for entry in entries if entry.channel.enabled), key=lambda entry: entry.position)
    if strategy == RouteStrategy.LOCAL_FIRST:
        usable.sort(key=lambda entry: 0 if entry.channel.kind == ChannelKind.LOCAL else 1)
    elif strategy == RouteStrategy.WEIGHTED and usable:
        weights = [max(entry.weight, 0) for entry in usable]
        if sum(weights) > 0:
            first = rng.choices(usable, weights=weights, k=1)[0]
            usable.remove(first)
            usable.insert(0, first)
    return [entry.channel for entry in usable]


# A config ladder's or sweep's steps bring up deployments whose local channel and route are the job's own
# (panel/benchmarks/ownership.py marks the step's serving profile): the team's lists leave them out. By lookup
# names only, so this layer imports nothing above it.
STEP_CHANNEL = {"deployment__profile__benchmark_step__isnull": False}


def listed_channels(team):
    """The team's channels as its lists show them: without those of ladder and sweep steps."""
    return Channel.objects.filter(team=team).exclude(**STEP_CHANNEL)


def listed_routes(team):
    """The team's routes as its lists show them: without those a ladder or sweep step brought up."""
    step_models = Channel.objects.filter(team=team, **STEP_CHANNEL).values("model_id")
    return Route.objects.filter(team=team).exclude(model_name__in=step_models)


class RuleApi(models.TextChoices):
    CHAT = "chat", "Chat completions"
    COMPLETIONS = "completions", "Completions"
    MESSAGES = "messages", "Anthropic Messages"
    RESPONSES = "responses", "Responses"
    EMBEDDINGS = "embeddings", "Embeddings"


class RuleTools(models.TextChoices):
    ANY = "", "Either"
    WITH = "with", "Has tools"
    WITHOUT = "without", "Has no tools"


class RouteRule(models.Model):
    """A condition on a request, tried in `position` order before the route's own channels: the first rule whose
    every set condition holds sends the request to its own ordered channels (panel/channels/rules.py)."""

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=100)
    # Conditions: a blank one does not count; every set one must hold.
    tokens_under = models.PositiveIntegerField(null=True, blank=True)  # the input-token estimate is below this
    tokens_over = models.PositiveIntegerField(null=True, blank=True)  # the input-token estimate is above this
    tools = models.CharField(max_length=10, choices=RuleTools.choices, default=RuleTools.ANY, blank=True)
    header_name = models.CharField(max_length=100, blank=True)  # lower case; the request carries it ...
    header_value = models.CharField(max_length=300, blank=True)  # ... with exactly this value
    key = models.ForeignKey("accounts.TeamKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    api = models.CharField(max_length=20, choices=RuleApi.choices, blank=True)
    channels = models.ManyToManyField(Channel, through="RouteRuleChannel", related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self):
        return f"{self.route} rule {self.name}"

    @property
    def conditions_text(self):
        """The rule's conditions in words, for the pages and the audit log."""
        parts = []
        if self.api:
            parts.append(f"API is {RuleApi(self.api).label}")
        if self.tools:
            parts.append("has tools" if self.tools == RuleTools.WITH else "has no tools")
        if self.tokens_over is not None:
            parts.append(f"over {self.tokens_over:,} input tokens")
        if self.tokens_under is not None:
            parts.append(f"under {self.tokens_under:,} input tokens")
        if self.header_name:
            parts.append(f"header {self.header_name} = {self.header_value!r}")
        if self.key_id is not None:
            parts.append(f"key {self.key.name}")
        return " and ".join(parts)

    def channel_list(self):
        """The rule's channels, in the order they are tried."""
        return [link.channel for link in self.routerulechannel_set.select_related("channel").order_by("position",
                                                                                                       "pk")]


class RouteRuleChannel(models.Model):
    rule = models.ForeignKey(RouteRule, on_delete=models.CASCADE)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "pk"]
        constraints = [models.UniqueConstraint(fields=["rule", "channel"], name="channel_once_per_rule")]


class ShadowState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    BUDGET_SPENT = "budget_spent", "Budget spent"
    FAILED = "failed", "Candidate failing"


class ShadowTest(models.Model):
    """A share of a route's answered requests sent again to a candidate channel, never to the client
    (panel/channels/shadow.py, panel/gateway/shadow.py): what the candidate would have answered, its cost and speed,
    against the answer the client got. At most one runs per route; it stops itself when its budget is spent or the
    candidate keeps failing."""

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="shadow_tests")
    candidate = models.ForeignKey(Channel, null=True, on_delete=models.SET_NULL, related_name="+")
    percent = models.PositiveSmallIntegerField()
    budget = models.DecimalField(max_digits=12, decimal_places=4)  # in the panel's currency
    min_similarity = models.FloatField(default=0.5)  # an answer agrees with the client's at this word F1 or more
    state = models.CharField(max_length=20, choices=ShadowState.choices, default=ShadowState.RUNNING)
    stop_reason = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    started_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-pk"]
        constraints = [models.UniqueConstraint(fields=["route"], condition=models.Q(state="running"),
                                               name="one_running_shadow_per_route")]


class ShadowResult(models.Model):
    """One mirrored request: the candidate's answer judged against the answer the client got (texts not kept)."""

    shadow = models.ForeignKey(ShadowTest, on_delete=models.CASCADE, related_name="results")
    created_at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField()  # the candidate answered
    error = models.CharField(max_length=200, blank=True)
    latency_ms = models.FloatField(null=True)
    client_latency_ms = models.FloatField(null=True)  # what the route's own channel took for the same request
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    client_cost = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    similarity = models.FloatField(null=True)
    json_valid = models.BooleanField(null=True)  # None: the request asked for no JSON
    passed = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-pk"]
