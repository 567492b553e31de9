from decimal import Decimal

from django import forms
from django.core.exceptions import ValidationError

from panel.accounts.models import TeamKey
from panel.channels import settings_json
from panel.channels.models import (
    Channel,
    ChannelApis,
    ChannelKind,
    CredentialKind,
    RouteBalance,
    RouteStrategy,
    RuleApi,
    RuleTools,
    WhileWaking,
)
from panel.channels.rules import sample_parse
from panel.channels.services import CHANNEL_FIELDS

HELP = {
    "name": "Letters, digits, '-', '_' or '.'; how routes and the usage records name it.",
    "kind": "Local: a vLLM server of this team (tried first by local_first routes). Remote: a cloud provider. vLLM "
            "pool: vLLM engines the panel did not start (an llm-d gateway, a production-stack router, a KServe "
            "service, a plain vLLM), called like a remote provider, their /metrics read like a deployment's.",
    "deployment": "For a local channel: the deployment it serves (kept in step automatically).",
    "base_url": "The API root, ending in /v1: http://127.0.0.1:8000/v1, https://taotoken.net/api/v1. The client "
                "appends /chat/completions and /models.",
    "model_id": "The model name sent upstream, as GET /models lists it.",
    "apis": "The APIs the server speaks (a local vLLM speaks all three). A request in one it does not speak is "
            "translated (Anthropic Messages to OpenAI chat completions, or back; the Responses API, which Codex "
            "speaks, to chat completions), and what changed is named in the x-tokenwise-adapted header; what cannot "
            "be is refused with a 400 naming it. Choose \"chat completions only\" for a provider that answers 404 "
            "to /v1/responses.",
    "credential_kind": "Where the key comes from. A local vLLM checks none (EMPTY).",
    "credential_env": "For \"Environment variable\": the variable the panel reads the key from, e.g. TAOTOKEN_API_KEY "
                      "(sent only to the addresses the operator binds it to).",
    "connect_timeout_seconds": "How long connecting to the server may take.",
    "first_byte_timeout_seconds": "How long an attempt may wait for the first token of a stream (for a non-streamed "
                                  "request: for the whole answer, which arrives at once) before the next channel is "
                                  "tried. Raise it for a channel that serves long non-streamed answers.",
    "idle_timeout_seconds": "How long a stream may pause between two chunks before it counts as stalled.",
    "timeout_seconds": "The most one attempt may take in all, a long stream included.",
    "max_retries": "Retries on this channel before falling back to the next one.",
    "retry_backoff": "Exponential backoff base in seconds between retries (1.5 → 1.5 s, 2.25 s, …).",
    "priority": "Lower first, among channels of equal position.",
    "weight": "Default share for weighted routes.",
    "price_input_per_million": "Price per million prompt tokens (USD).",
    "price_output_per_million": "Price per million completion tokens (USD).",
    "price_cached_per_million": "Cached prompt tokens are billed at this price instead of the input price; set it "
                                "to the input price if the provider gives no discount.",
    "price_cache_write_per_million": "For providers that charge for writing the prompt cache (Anthropic's cache "
                                     "creation tokens). Empty: cache writes are billed at the input price.",
    "price_tool_calls_per_thousand": "Tools the provider runs itself and bills per call (Anthropic's and OpenAI's web "
                                     "search, OpenAI's file search), per 1,000 calls: counted from what the answer "
                                     "reports.",
    "enabled": "Disabled channels are skipped by every route.",
    "scrape_urls": "For a vLLM pool: the /metrics URL of each of its engines, one a line (read every few seconds "
                   "for the dashboards and the ledger).",
    "scrape_token": "For a vLLM pool: the bearer token its /metrics want, if any. It is encrypted at rest and never "
                    "shown again; leave this empty to keep the stored one.",
    "gpu_count": "For a vLLM pool: the GPUs its engines run on.",
    "price_per_gpu_hour": "For a vLLM pool: what one of its GPUs costs an hour; × the GPUs, its GPU-time cost.",
    "batch_slots": "For a vLLM pool: the requests its engines run at once (the sum of their --max-num-seqs), for "
                   "the spill rule's expected wait. Empty: the spill rule passes the pool by.",
}
LABELS = {"model_id": "Model id", "base_url": "Base URL", "credential_kind": "Credential",
          "credential_env": "Environment variable", "timeout_seconds": "Total timeout (s)",
          "connect_timeout_seconds": "Connect timeout (s)", "first_byte_timeout_seconds": "First-byte timeout (s)",
          "idle_timeout_seconds": "Idle timeout (s)",
          "retry_backoff": "Retry backoff (s)",
          "price_input_per_million": "Input / 1M tokens", "price_output_per_million": "Output / 1M tokens",
          "price_cached_per_million": "Cached input / 1M tokens",
          "price_cache_write_per_million": "Cache write / 1M tokens",
          "price_tool_calls_per_thousand": "Tool calls / 1K", "apis": "APIs", "scrape_urls": "Scrape URLs",
          "scrape_token": "Scrape token", "gpu_count": "GPUs", "price_per_gpu_hour": "Price per GPU-hour",
          "batch_slots": "Batch slots"}
# Left empty, or left out by a client older than the field: the channel's current value, else the default.
WITH_DEFAULTS = ("connect_timeout_seconds", "first_byte_timeout_seconds", "idle_timeout_seconds",
                 "price_tool_calls_per_thousand")
PRICES = ("price_input_per_million", "price_output_per_million", "price_cached_per_million")
SECTIONS = [
    ("Upstream", ["name", "kind", "deployment", "base_url", "model_id", "apis", "enabled"]),
    ("Credential", ["credential_kind", "api_key", "credential_env"]),
    ("Timeouts and retries", ["connect_timeout_seconds", "first_byte_timeout_seconds", "idle_timeout_seconds",
                              "timeout_seconds", "max_retries", "retry_backoff", "priority", "weight"]),
    ("Prices", ["price_input_per_million", "price_output_per_million", "price_cached_per_million",
                "price_cache_write_per_million", "price_tool_calls_per_thousand"]),
    ("vLLM pool", ["scrape_urls", "scrape_token", "gpu_count", "price_per_gpu_hour", "batch_slots"]),
]
KIND_SECTIONS = {"vLLM pool": (ChannelKind.POOL,)}  # shown while the kind is one of these (all without JavaScript)


class ChannelForm(forms.ModelForm):
    api_key = forms.CharField(required=False, strip=True, label="API key",
                              widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))
    scrape_token = forms.CharField(required=False, strip=True, max_length=600,
                                   widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))

    class Meta:
        model = Channel
        fields = list(CHANNEL_FIELDS)
        widgets = {"base_url": forms.TextInput(attrs={"spellcheck": "false"}),
                   "model_id": forms.TextInput(attrs={"spellcheck": "false"}),
                   "scrape_urls": forms.Textarea(attrs={"rows": 3, "spellcheck": "false"})}

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.team = team
        deployments = Channel._meta.get_field("deployment").related_model.objects  # serving's, which builds on us
        self.fields["deployment"].queryset = deployments.filter(team=team).select_related("profile")
        self.fields["deployment"].required = False
        self.fields["deployment"].empty_label = "None"
        for name in WITH_DEFAULTS:  # left empty (or left out by an older client): the current value
            self.fields[name].required = False
        self.fields["apis"].required = False  # left out by an older client: the current value (new: chat)
        self.fields["gpu_count"].required = False  # left out: the current value (new: 0)
        for name, field in self.fields.items():
            field.help_text = HELP.get(name, field.help_text)
            field.label = LABELS.get(name, field.label)
        if self.instance.pk:  # 0.550000 -> 0.55, 120.0 -> 120
            for name in ("price_input_per_million", "price_output_per_million", "price_cached_per_million",
                         "price_tool_calls_per_thousand"):
                self.initial[name] = format(getattr(self.instance, name).normalize(), "f")
            if self.instance.price_cache_write_per_million is not None:
                self.initial["price_cache_write_per_million"] = format(
                    self.instance.price_cache_write_per_million.normalize(), "f")
            for name in ("connect_timeout_seconds", "first_byte_timeout_seconds", "idle_timeout_seconds",
                         "timeout_seconds", "retry_backoff"):
                value = getattr(self.instance, name)
                self.initial[name] = int(value) if float(value).is_integer() else value
        if self.instance.pk and self.instance.scrape_token_ciphertext:
            self.fields["scrape_token"].help_text = (f"A token is stored (••••{self.instance.scrape_token_last4}). "
                                                     "Leave this empty to keep it; type a new one to replace it.")
        if self.instance.pk and self.instance.credential_kind == CredentialKind.STORED:
            self.fields["api_key"].help_text = (f"A key is stored ({self.instance.credential_display}). Leave this "
                                                "empty to keep it; type a new one to replace it.")
        else:
            self.fields["api_key"].help_text = ("For \"Stored here, encrypted\": the key alone, without \"Bearer\". It "
                                                "is encrypted at rest and never shown again, only its last four "
                                                "characters.")

        if not self.instance.pk:  # a new channel's prices are asked for, not assumed to be 0
            for name in PRICES:
                self.initial[name] = ""
        for name in PRICES:
            self.fields[name].required = False
        self.notes = []

    def clean(self):
        cleaned = super().clean()
        kind = cleaned.get("credential_kind")
        if cleaned.get("api_key") and kind in (CredentialKind.ENV, CredentialKind.NONE):
            # A key typed into the form is kept, never dropped: the credential becomes the stored key.
            was = CredentialKind(kind).label
            cleaned["credential_kind"] = CredentialKind.STORED
            self.instance.credential_kind = CredentialKind.STORED
            self.notes.append(f"The credential was \"{was}\", but you typed an API key: it is stored here, "
                              "encrypted, and the credential is now \"Stored here, encrypted\".")
        for name in PRICES:
            if cleaned.get(name) is None and name not in self.errors:
                if cleaned.get("kind") == ChannelKind.REMOTE:
                    self.add_error(name, "Enter the provider's price per million tokens (from its price page): the "
                                         "Cost tab and budgets use it. Enter 0 if it is free.")
                else:
                    cleaned[name] = Decimal(0)  # a local channel's (or a pool's) cost is its GPU hours
        return cleaned

    def sections(self):
        """(title, bound fields, the kinds it is for: "" for every kind) per section of the form."""
        return [(title, [self[name] for name in names], " ".join(KIND_SECTIONS.get(title, ())))
                for title, names in SECTIONS]

    def channel_fields(self):
        fields = {name: self.cleaned_data[name] for name in CHANNEL_FIELDS}
        if not fields["apis"]:
            current = Channel.objects.filter(pk=self.instance.pk).values_list("apis", flat=True).first()
            fields["apis"] = current or (ChannelApis.BOTH if fields["kind"] == ChannelKind.LOCAL else ChannelApis.CHAT)
        for name in WITH_DEFAULTS + ("gpu_count",):
            if fields[name] is None:
                current = Channel.objects.filter(pk=self.instance.pk).values_list(name, flat=True).first()
                fields[name] = current if current is not None else Channel._meta.get_field(name).default
        fields["scrape_token"] = self.cleaned_data.get("scrape_token") or ""
        return fields


class RouteForm(forms.Form):
    model_name = forms.CharField(max_length=200, label="Model name",
                                 help_text="What clients send as \"model\", e.g. qwen2.5-14b-instruct.")
    strategy = forms.ChoiceField(choices=RouteStrategy.choices, initial=RouteStrategy.LOCAL_FIRST,
                                 help_text="local_first: local channels first, then the rest in order. priority: in "
                                           "order. weighted: one pick by weight, the rest in order as fallbacks.")
    fallback_on_error = forms.BooleanField(required=False, initial=True,
                                           label="Fall back to the next channel on errors")
    deadline_seconds = forms.FloatField(required=False, min_value=1, max_value=3600, initial=45, label="Deadline (s)",
                                        help_text="The most every attempt, retry and fallback together may take "
                                                  "before the answer starts; keep it below your clients' timeout.")
    while_waking = forms.ChoiceField(choices=WhileWaking.choices, initial=WhileWaking.FALL_BACK, required=False,
                                     label="While a local engine wakes",
                                     help_text="For a deployment whose profile sleeps when idle: the request that "
                                               "wakes it goes to the next channel, or waits for the engine up to the "
                                               "deadline (a route with no next channel always waits).")
    spill_wait_ms = forms.IntegerField(required=False, min_value=0, max_value=600_000, initial=0,
                                       label="Spill to the cloud past (ms)",
                                       help_text="When the local engine would keep a request waiting longer than "
                                                 "this (its queue × its measured time per request), the request "
                                                 "goes to the route's cloud channels first. 0: never.")
    balance = forms.ChoiceField(choices=RouteBalance.choices, required=False, initial=RouteBalance.IN_ORDER,
                                label="Balance replicas",
                                help_text="Over the local channels tried first (a deployment's replicas). "
                                          "Prefix-aware sends requests that share a system prompt and tools to "
                                          "the replica that has them cached, spilling over when it is busy.")
    affinity_header = forms.CharField(max_length=100, required=False, initial="x-session-id",
                                      label="Session header",
                                      help_text="For session affinity: this header, else the Anthropic "
                                                "metadata.user_id, else the key keeps a session on one replica.")
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args, team, route=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.team = team
        self.channels = list(Channel.objects.filter(team=team).order_by("name"))
        current = {entry.channel_id: entry for entry in route.entries()} if route else {}
        if route is not None:
            self.initial.update(model_name=route.model_name, strategy=route.strategy,
                                fallback_on_error=route.fallback_on_error, enabled=route.enabled,
                                deadline_seconds=route.deadline_seconds, balance=route.balance,
                                affinity_header=route.affinity_header, while_waking=route.while_waking,
                                spill_wait_ms=route.spill_wait_ms)
        for index, channel in enumerate(self.channels):
            entry = current.get(channel.pk)
            self.fields[f"use_{channel.pk}"] = forms.BooleanField(required=False, initial=entry is not None,
                                                                  label=channel.name)
            self.fields[f"position_{channel.pk}"] = forms.IntegerField(
                min_value=0, max_value=10_000, initial=entry.position if entry else len(current) + index,
                label="Position")
            self.fields[f"weight_{channel.pk}"] = forms.IntegerField(
                min_value=0, max_value=1000, initial=entry.weight if entry else channel.weight, label="Weight")

    def rows(self):
        return [(channel, self[f"use_{channel.pk}"], self[f"position_{channel.pk}"], self[f"weight_{channel.pk}"])
                for channel in self.channels]

    def entries(self):
        """[(channel, position, weight)] of the ticked channels, by position."""
        chosen = [(channel, self.cleaned_data[f"position_{channel.pk}"], self.cleaned_data[f"weight_{channel.pk}"])
                  for channel in self.channels if self.cleaned_data.get(f"use_{channel.pk}")]
        return sorted(chosen, key=lambda item: item[1])

    def clean(self):
        cleaned = super().clean()
        if not self.errors and not any(cleaned.get(f"use_{channel.pk}") for channel in self.channels):
            raise ValidationError("Pick at least one channel.")
        return cleaned


class ImportForm(forms.Form):
    text = forms.CharField(required=False, strip=False, label="settings.json",
                           widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
                           help_text="Paste the file (format A or B), or upload it below.")
    file = forms.FileField(required=False, label="…or upload settings.json")
    replace = forms.BooleanField(required=False, label="Replace channels and the route that have the same names")

    def clean(self):
        cleaned = super().clean()
        upload = cleaned.get("file")
        payload = cleaned.get("text") or ""
        if upload:
            payload = upload.read(settings_json.MAX_BYTES + 1)
            if len(payload) > settings_json.MAX_BYTES:
                raise ValidationError(f"settings.json is larger than {settings_json.MAX_BYTES // 1024} KB: that is "
                                      "not a settings file.")
        if not payload or (isinstance(payload, str) and not payload.strip()):
            raise ValidationError("Paste a settings.json or upload one.")
        cleaned["payload"] = payload
        return cleaned



class CanaryForm(forms.Form):
    """Start a canary: a candidate channel the route does not use yet, its first share, and the schedule."""

    channel = forms.ModelChoiceField(queryset=Channel.objects.none(), label="Candidate channel",
                                     help_text="For example the AWQ deployment's local channel.")
    percent = forms.TypedChoiceField(choices=[(5, "5%"), (25, "25%"), (50, "50%")], coerce=int, initial=5,
                                     label="First share")
    auto = forms.BooleanField(required=False, label="Promote automatically (5 → 25 → 50 → 100%) after each clean "
                                                    "step")

    def __init__(self, *args, route, **kwargs):
        super().__init__(*args, **kwargs)
        used = route.routechannel_set.values_list("channel_id", flat=True)
        self.fields["channel"].queryset = Channel.objects.filter(team=route.team_id, enabled=True).exclude(
            pk__in=list(used))


class ShadowForm(forms.Form):
    """Start a shadow test: a candidate channel the route does not use yet, the share mirrored, the money it may
    spend, and how close its answers must be to the client's."""

    channel = forms.ModelChoiceField(queryset=Channel.objects.none(), label="Candidate channel",
                                     help_text="It answers copies of the route's requests; clients never see them.")
    percent = forms.IntegerField(min_value=1, max_value=100, initial=10, label="Share mirrored (%)")
    budget = forms.DecimalField(min_value=Decimal("0.0001"), max_value=Decimal("100000"), decimal_places=4,
                                initial=Decimal("5"), label="Budget",
                                help_text="What the copies may cost in all; the test stops when it is spent.")
    min_similarity = forms.FloatField(min_value=0.01, max_value=1, initial=0.5, label="Agreement needed",
                                      help_text="Word overlap (F1) with the answer the client got, 0 to 1.")

    def __init__(self, *args, route, **kwargs):
        # Its own prefix: the route page holds the canary's form too, whose fields have the same names.
        super().__init__(*args, prefix="shadow", **kwargs)
        used = route.routechannel_set.values_list("channel_id", flat=True)
        self.fields["channel"].queryset = Channel.objects.filter(team=route.team_id, enabled=True).exclude(
            pk__in=list(used))


RULE_CHANNEL_SLOTS = 4


class RuleForm(forms.Form):
    """A routing rule: its conditions (blank ones do not count) and up to four channels, tried in order."""

    name = forms.CharField(max_length=100, help_text="How the route page and the usage records name it.")
    api = forms.ChoiceField(choices=[("", "Any")] + RuleApi.choices, required=False, label="API")
    tools = forms.ChoiceField(choices=RuleTools.choices, required=False, label="Tools")
    tokens_over = forms.IntegerField(required=False, min_value=1, label="Over (input tokens)")
    tokens_under = forms.IntegerField(required=False, min_value=1, label="Under (input tokens)")
    header_name = forms.CharField(required=False, max_length=100, label="Header",
                                  help_text="e.g. x-workload; the request must carry it with the value beside.")
    header_value = forms.CharField(required=False, max_length=300, label="Header value")
    key = forms.ModelChoiceField(queryset=TeamKey.objects.none(), required=False, label="Key", empty_label="Any")

    def __init__(self, *args, route, rule=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.route = route
        self.fields["key"].queryset = TeamKey.objects.filter(team=route.team_id, revoked_at=None).order_by("name")
        channels = Channel.objects.filter(team=route.team_id).order_by("name")
        chosen = rule.channel_list() if rule else []
        for slot in range(RULE_CHANNEL_SLOTS):
            self.fields[f"channel_{slot}"] = forms.ModelChoiceField(
                queryset=channels, required=slot == 0, empty_label="—",
                label="First channel" if slot == 0 else "Then", initial=chosen[slot].pk if slot < len(chosen) else None)
        if rule is not None:
            self.initial.update(name=rule.name, api=rule.api, tools=rule.tools, tokens_over=rule.tokens_over,
                                tokens_under=rule.tokens_under, header_name=rule.header_name,
                                header_value=rule.header_value, key=rule.key)

    def channel_fields(self):
        return [self[f"channel_{slot}"] for slot in range(RULE_CHANNEL_SLOTS)]

    def rule_fields(self):
        """The keyword arguments of rule_save from what parsed (a field that did not parse counts as blank)."""
        data = getattr(self, "cleaned_data", {})
        channels = [data.get(f"channel_{slot}") for slot in range(RULE_CHANNEL_SLOTS)]
        return {"name": data.get("name", self.data.get("name", "")), "api": data.get("api") or "",
                "tools": data.get("tools") or "", "tokens_over": data.get("tokens_over"),
                "tokens_under": data.get("tokens_under"), "header_name": data.get("header_name") or "",
                "header_value": data.get("header_value") or "", "key": data.get("key"),
                "channels": [channel for channel in channels if channel is not None]}


SAMPLE_EXAMPLE = ('{"model": "chat", "messages": [{"role": "user", "content": "Summarise this ticket..."}],\n'
                  ' "tools": [{"type": "function", "function": {"name": "search"}}]}')


class RuleSampleForm(forms.Form):
    """A sample request to try a rule on before saving it: nothing of it is stored."""

    sample = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false",
                                                          "placeholder": SAMPLE_EXAMPLE}),
                             label="Request body (JSON)", help_text="As a client would send it; never stored.")
    sample_headers = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false",
                                                                  "placeholder": "x-workload: batch"}),
                                     required=False, label="Headers", help_text="One per line: name: value.")
    sample_api = forms.ChoiceField(choices=RuleApi.choices, initial=RuleApi.CHAT, label="Sent to")
    sample_key = forms.ModelChoiceField(queryset=TeamKey.objects.none(), required=False, label="With the key",
                                        empty_label="Any other key")

    def __init__(self, *args, route, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["sample_key"].queryset = TeamKey.objects.filter(team=route.team_id, revoked_at=None) \
            .order_by("name")

    def clean(self):
        cleaned = super().clean()
        if "sample" in cleaned:
            try:
                cleaned["body"], cleaned["headers"] = sample_parse(body_text=cleaned["sample"],
                                                                   headers_text=cleaned.get("sample_headers", ""))
            except ValidationError as error:
                for field, problems in error.message_dict.items():
                    self.add_error(field, problems)
        return cleaned
