from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from panel.benchmarks import workload
from panel.benchmarks.ladder import sweep_values_parse
from panel.benchmarks.models import WORKLOAD_FIELDS, WorkloadKind
from panel.channels.models import listed_channels, listed_routes
from panel.registry.models import RegisteredModel
from panel.serving.configfile import ConfigFileError, validate_extra_args
from panel.serving.models import Deployment, DeploymentState, ServingProfile

MAX_SYNTHETIC_WORDS = 2_000_000  # a shared host's benchmark, not a load test of the whole installation


class WorkloadForm(forms.Form):
    workload = forms.ChoiceField(choices=WorkloadKind.choices, initial=WorkloadKind.BUILTIN)
    prompts_file = forms.FileField(required=False, label="Prompt file",
                                   help_text="JSONL ({\"prompt\": ...} or {\"messages\": [...]} per line) or plain "
                                             "text, one prompt per line. Used with “Uploaded file”.")
    input_tokens = forms.IntegerField(min_value=1, max_value=16384, initial=128, label="Input tokens",
                                      help_text="Synthetic prompts only: about this many tokens of text each. The "
                                                "engine counts more: the chat template wraps every message in role "
                                                "markers (tens of tokens with the demo model's template), and the "
                                                "count depends on the tokenizer. The result shows the prompt "
                                                "tokens the engine reported.")
    output_tokens = forms.IntegerField(min_value=1, max_value=8192, initial=64, label="Output tokens",
                                       help_text="max_tokens of every request (vLLM targets produce exactly this).")
    shared_system_prompt = forms.BooleanField(required=False, label="Share one system prompt (prefix caching)")
    requests = forms.IntegerField(min_value=1, max_value=5000, initial=50, label="Measured requests")
    warmup_requests = forms.IntegerField(min_value=0, max_value=100, initial=2, label="Warm-up requests",
                                         help_text="Sent first and not counted.")
    concurrency = forms.IntegerField(min_value=1, max_value=256, initial=4, label="Concurrency",
                                     help_text="Requests in flight at once (the cap when a rate is set).")
    request_rate = forms.FloatField(required=False, min_value=0.001, max_value=1000, label="Request rate (req/s)",
                                    help_text="Empty: closed loop at the concurrency. Set: Poisson arrivals.")

    slo_ttft_ms = forms.FloatField(required=False, min_value=0.001, max_value=3_600_000, label="TTFT SLO (ms)",
                                   help_text="Goodput counts the requests within every SLO set (vLLM's --goodput).")
    slo_tpot_ms = forms.FloatField(required=False, min_value=0.001, max_value=3_600_000, label="TPOT SLO (ms)")
    slo_e2el_ms = forms.FloatField(required=False, min_value=0.001, max_value=3_600_000, label="E2EL SLO (ms)",
                                   help_text="End-to-end latency. Empty SLOs are not checked.")

    def clean(self):
        data = super().clean()
        data["prompts"], data["prompts_name"] = [], ""
        total = ((data.get("requests") or 0) + (data.get("warmup_requests") or 0)) * (data.get("input_tokens") or 0)
        if data.get("workload") == WorkloadKind.SYNTHETIC and total > MAX_SYNTHETIC_WORDS:
            self.add_error("input_tokens", f"requests × input tokens is {total:,}: a benchmark sends at most "
                                           f"{MAX_SYNTHETIC_WORDS:,} synthetic words; send fewer or shorter prompts.")
        upload = data.get("prompts_file")
        if data.get("workload") == WorkloadKind.FILE:
            if not upload:
                self.add_error("prompts_file", "Upload a prompt file for this workload.")
            else:
                try:
                    data["prompts"] = workload.parse_prompt_file(
                        upload.read(settings.BENCHMARK_MAX_UPLOAD_BYTES + 1), name=upload.name,
                        max_bytes=settings.BENCHMARK_MAX_UPLOAD_BYTES)
                    data["prompts_name"] = upload.name[:255]
                except ValidationError as error:
                    self.add_error("prompts_file", error)
        return data

    def workload_values(self):
        return {name: self.cleaned_data[name] for name in WORKLOAD_FIELDS}


class ImportForm(forms.Form):
    result_file = forms.FileField(label="vLLM result file", help_text="The JSON that “vllm bench serve "
                                  "--save-result” wrote; it becomes a run you can compare with your own.")
    title = forms.CharField(max_length=200, required=False, label="Name", help_text="Optional.")


class BenchmarkForm(WorkloadForm):
    name = forms.CharField(max_length=200, required=False, help_text="Optional, to find it when comparing.")
    target = forms.ChoiceField(label="Target", help_text="A ready deployment, a channel, or a route of this team.")

    field_order = ["name", "target"]

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        deployments = Deployment.objects.filter(team=team, state=DeploymentState.READY).select_related("profile")
        self.fields["target"].choices = [
            ("Deployments (ready)", [(f"deployment:{d.pk}", str(d)) for d in deployments]),
            ("Channels", [(f"channel:{c.pk}", c.name) for c in listed_channels(team).filter(enabled=True)]),
            ("Routes", [(f"route:{r.pk}", r.model_name) for r in listed_routes(team)]),
        ]

    def clean_target(self):
        kind, _, pk = self.cleaned_data["target"].partition(":")
        return kind, int(pk)


class LadderForm(WorkloadForm):
    model = forms.ModelChoiceField(queryset=RegisteredModel.objects.none(), help_text="An FP16/BF16 model; its AWQ "
                                   "child, if it has one, is used for the AWQ step.")
    small_max_num_seqs = forms.IntegerField(min_value=1, max_value=65536, initial=4, label="Small max_num_seqs",
                                            help_text="The baseline's batch.")
    large_max_num_seqs = forms.IntegerField(min_value=2, max_value=65536, initial=64, label="Large max_num_seqs",
                                            help_text="The last step's batch (256 is common on a large GPU).")
    max_model_len = forms.IntegerField(min_value=16, initial=2048, label="Max model length")
    extra_args = forms.CharField(required=False, max_length=1000, label="Extra engine arguments",
                                 help_text="Passed to every step, e.g. --enforce-eager.")
    gpu_price_per_hour = forms.DecimalField(required=False, min_value=0, max_digits=10, decimal_places=4,
                                            label="GPU price per hour",
                                            help_text="For the cost per million tokens. Empty: the host's price.")

    repeats = forms.IntegerField(required=False, min_value=1, max_value=10, initial=3, label="Repeats per step",
                                 help_text="Each step is measured this many times on the same engine, so its "
                                           "figure comes with a spread and a gain within it reads as noise.")

    field_order = ["model", "small_max_num_seqs", "large_max_num_seqs", "max_model_len", "extra_args",
                   "gpu_price_per_hour", "repeats"]

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].queryset = RegisteredModel.objects.filter(team=team, quantization={})
        # A workload that exercises what the steps change: one system prompt shared by every request (what the
        # prefix-caching step reuses) and more requests in flight than the small max_num_seqs (what the batching
        # step lifts), measured long enough to be more than a second or two.
        self.fields["workload"].initial = WorkloadKind.SYNTHETIC
        self.fields["shared_system_prompt"].initial = True
        self.fields["input_tokens"].initial = 256
        self.fields["requests"].initial = 48
        self.fields["concurrency"].initial = 16

    def clean(self):
        data = super().clean()
        small, concurrency = data.get("small_max_num_seqs"), data.get("concurrency")
        if small and concurrency and concurrency <= small:
            self.add_error("concurrency", f"Send more requests at once than the small max_num_seqs ({small}): "
                                          "at or below it, the batching step has nothing to lift.")
        return data

    def clean_extra_args(self):
        text = self.cleaned_data.get("extra_args") or ""
        try:
            validate_extra_args(text)
        except ConfigFileError as error:
            raise ValidationError(error.problems) from None
        return text


class SweepForm(WorkloadForm):
    profile = forms.ModelChoiceField(queryset=ServingProfile.objects.none(), label="Serving profile",
                                     help_text="Each value runs this profile with only max_num_seqs changed.")
    values = forms.CharField(initial="4, 16, 64", label="max_num_seqs values", help_text="2 to 8, comma-separated.")
    p99_target_ms = forms.IntegerField(min_value=1, max_value=3_600_000, initial=5000, label="P99 target (ms)",
                                       help_text="End-to-end P99 latency the best value must stay within.")

    repeats = forms.IntegerField(required=False, min_value=1, max_value=10, initial=1, label="Repeats per value",
                                 help_text="Measurements per value on the same engine.")

    field_order = ["profile", "values", "p99_target_ms", "repeats"]

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["profile"].queryset = ServingProfile.objects.filter(team=team, benchmark_step__isnull=True
                                                                        ).select_related("model")
        self.fields["concurrency"].initial = 16

    def clean_values(self):
        try:
            return sweep_values_parse(self.cleaned_data["values"])
        except ValidationError as error:
            raise ValidationError(error.message_dict["values"]) from None
