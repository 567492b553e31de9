from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator

from panel.hosts.models import WorkerHost
from panel.registry.adapters import VLLM_MAX_RANKS, adapters_of
from panel.registry.models import LoraAdapter, RegisteredModel
from panel.registry.starter_model import default_model
from panel.serving import configfile, rules
from panel.serving.models import ServingProfile
from panel.serving.placement import MAX_REPLICAS
from panel.serving.profile_fields import FIELDS_BY_NAME
from panel.serving.services import profile_values

DEFAULT_MAX_MODEL_LEN = FIELDS_BY_NAME["max_model_len"].default


def model_default_length(model):
    """A new profile's max model length: the model's own positions, up to the usual 8,192."""
    return min(model.max_position_embeddings or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)


PROFILE_FIELDS = ["name", "model", "served_model_name", "dtype", "quantization", "quantization_bits", "max_model_len",
                  "enable_prefix_caching", "block_size", "gpu_memory_utilization", "swap_space", "max_num_seqs",
                  "max_num_batched_tokens", "enable_chunked_prefill", "tensor_parallel_size",
                  "pipeline_parallel_size", "port", "tool_call_parser", "extra_args", "sleep_after_minutes"]
SECTIONS = [
    ("Model", ["name", "model", "served_model_name", "dtype", "quantization", "quantization_bits", "max_model_len"]),
    ("KV cache", ["enable_prefix_caching", "block_size", "gpu_memory_utilization", "swap_space"]),
    ("Batching", ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"]),
    ("Parallelism and server", ["tensor_parallel_size", "pipeline_parallel_size", "port", "tool_call_parser",
                                "extra_args"]),
    ("When idle", ["sleep_after_minutes"]),
]


class ServingProfileForm(forms.ModelForm):
    class Meta:
        model = ServingProfile
        fields = PROFILE_FIELDS

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.team = team
        self.warnings = []
        self.fields["model"].queryset = RegisteredModel.objects.filter(team=team)
        for name, field in self.fields.items():
            spec = FIELDS_BY_NAME.get(name)
            if spec is None:
                continue
            field.help_text = spec.help or field.help_text
            field.label = spec.label
            if spec.min_value is not None:
                field.validators.append(MinValueValidator(spec.min_value))
            if spec.max_value is not None:
                field.validators.append(MaxValueValidator(spec.max_value))
        self.fields["name"].label = "Profile name"
        if not self.instance.pk and "block_size" not in self.initial and not any(
                host.gpus for host in WorkerHost.objects.filter(kind="gpu") if host.is_online):
            # Only CPU engines are online: their attention backend needs a multiple of 32 (16 is a
            # GPU value).
            self.initial["block_size"] = 32
        self.fields["model"].label = "Model"
        if not self.instance.pk:
            # The default length comes from the chosen model (the demo model has 4,096 positions), not 8,192.
            self.fields["max_model_len"].required = False
            self.fields["max_model_len"].widget.attrs["placeholder"] = (
                f"the model's own, up to {DEFAULT_MAX_MODEL_LEN:,}")
            self.fields["max_model_len"].help_text += (f" Empty: the model's own length (max_position_embeddings), "
                                                       f"up to {DEFAULT_MAX_MODEL_LEN:,}.")
            model = default_model(self.fields["model"].queryset)  # the starter model, else the only one
            if model is not None and "model" not in self.initial:
                self.initial["model"] = model.pk
                if "quantization" not in self.initial:
                    quantization, bits = rules.checkpoint_quantization(model)
                    self.initial.update(quantization=quantization, quantization_bits=bits)
            if "max_model_len" not in self.initial:
                self.initial["max_model_len"] = model_default_length(model) if model is not None else ""

    def _quantization_from_checkpoint(self, cleaned, model):
        # The select shows "none" until it is changed, and the rules refuse "none" for a quantized checkpoint (and
        # AWQ without its bits): a profile for a quantized model failed its first save. vLLM reads the method and
        # bits from the checkpoint itself (the profile's are never passed for one), so the profile takes the
        # checkpoint's where it left them at their defaults, and says so.
        method, bits = rules.checkpoint_quantization(model)
        if cleaned.get("quantization") == "none" and method in FIELDS_BY_NAME["quantization"].choice_values:
            cleaned["quantization"] = method
            self.warnings.append(f"Quantization set to {method}, as {model.name}'s checkpoint says "
                                 f"({model.quantization_label}): vLLM reads it from the checkpoint.")
        if (cleaned.get("quantization") == method and cleaned.get("quantization_bits") is None
                and "quantization_bits" not in self.errors):
            cleaned["quantization_bits"] = bits

    def sections(self):
        return [(title, [self[name] for name in names]) for title, names in SECTIONS]

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        taken = ServingProfile.objects.filter(team=self.team, name=name).exclude(pk=self.instance.pk)
        if taken.exists():
            raise ValidationError(f"This team already has a profile named {name!r}.")
        return name

    def clean(self):
        cleaned = super().clean()
        model = cleaned.get("model")
        self.warnings = []
        if model is None:
            return cleaned
        if cleaned.get("max_model_len") is None and "max_model_len" not in self.errors:
            cleaned["max_model_len"] = model_default_length(model)
        if model.is_quantized and "quantization" not in self.errors:
            self._quantization_from_checkpoint(cleaned, model)
        # Every rule runs even when a field was refused above (that field takes its default for the rules), so
        # the form answers every problem at once, not one round per submit.
        blank = ServingProfile()
        profile = ServingProfile(team=self.team, model=model, **{
            name: cleaned[name] if name in cleaned and name not in self.errors else getattr(blank, name)
            for name in PROFILE_FIELDS if name != "model"})
        values = profile_values(profile)
        try:
            configfile.launch_argv(values, model_path=model.path, port=8000,
                                   checkpoint_quantized=model.is_quantized)
        except configfile.ConfigFileError as error:
            self.add_error("extra_args", str(error))
            return cleaned
        verdict = rules.check_profile(values, model=model)
        for field, messages in verdict.errors.items():
            if field in self.errors:
                continue  # already refused, with its own reason
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
        self.warnings += verdict.warnings
        return cleaned


class LaunchForm(forms.Form):
    host = forms.ModelChoiceField(queryset=WorkerHost.objects.none(), required=False,
                                  empty_label="Pick the worker with the most free memory", label="Run on")
    replicas = forms.IntegerField(min_value=1, max_value=MAX_REPLICAS, initial=1, required=False,
                                  label="Replicas",
                                  help_text="Engines serving this profile, each whole, placed over the GPU workers "
                                            "with room; the route balances them. Replicas restart after a crash.")
    max_replicas = forms.IntegerField(
        min_value=1, max_value=MAX_REPLICAS, required=False, label="Scale up to",
        help_text="Optional: up to this many replicas when requests queue (one more when they keep waiting for a "
                  "minute, one fewer after five quiet minutes, drained first). Empty: a fixed number of replicas.")
    restart_on_crash = forms.BooleanField(required=False,
                                          label="Restart on crash (at once, then with backoff; up to 3 times)")
    attach_to_route = forms.BooleanField(
        required=False, label="Attach to the existing route of the same name (admins)",
        help_text="Without it, a route the team already has for this served name keeps its channels: the "
                  "deployment's local channel is made but not added to it.")

    def __init__(self, *args, running=(), **kwargs):
        """`running`: the profile's active deployments (their first rows). A launch beside them asks first."""
        super().__init__(*args, **kwargs)
        self.fields["host"].queryset = WorkerHost.objects.filter(kind="gpu").order_by("host")
        self.running = list(running)
        if self.running:
            names = ", ".join(f"#{deployment.pk} ({deployment.get_state_display().lower()})"
                              for deployment in self.running)
            self.fields["another"] = forms.BooleanField(
                required=False, label=f"Start another engine beside {names}",
                help_text="It gets its own local channel; the running deployment keeps its channel, its route and "
                          "its traffic. To serve this profile with more engines behind one route, stop it and "
                          "launch again with more replicas.")

    def clean_replicas(self):
        return self.cleaned_data.get("replicas") or 1

    def clean(self):
        cleaned = super().clean()
        top = cleaned.get("max_replicas")
        if top is not None and top < (cleaned.get("replicas") or 1):
            self.add_error("max_replicas", f"Scale up to {top} is fewer than the {cleaned.get('replicas') or 1} "
                                           "replicas asked for: leave it empty, or raise it.")
        if self.running and not cleaned.get("another"):
            first = self.running[0]
            raise forms.ValidationError(
                f"This profile already runs as deployment #{first.pk} ({first.get_state_display().lower()}). "
                "Tick “Start another engine” to launch a second one beside it, or open the running one.")
        return cleaned


class ImportForm(forms.Form):
    name = forms.CharField(max_length=100, label="Profile name")
    config = forms.CharField(widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}), required=False,
                             label="config.toml", help_text="Paste the file, or upload it below.")
    file = forms.FileField(required=False, label="…or upload config.toml")

    MAX_BYTES = 256 * 1024

    def clean(self):
        cleaned = super().clean()
        upload = cleaned.get("file")
        text = cleaned.get("config") or ""
        if upload:
            data = upload.read(self.MAX_BYTES + 1)
            if len(data) > self.MAX_BYTES:
                raise ValidationError("config.toml is larger than 256 KB; that is not a serving config.")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError("config.toml is not UTF-8 text.") from None
        if not text.strip():
            raise ValidationError("Paste a config.toml or upload one.")
        cleaned["text"] = text
        return cleaned


class ScaleForm(forms.Form):
    """A running deployment's scale policy (serving/scaling.py), as the deployment page and the API take it."""

    min_replicas = forms.IntegerField(min_value=1, max_value=MAX_REPLICAS, label="Fewest replicas")
    max_replicas = forms.IntegerField(min_value=1, max_value=MAX_REPLICAS, label="Most replicas")
    up_waiting = forms.FloatField(min_value=0.1, max_value=1000, initial=1, label="Add one when waiting requests "
                                  "per replica stay at or above")
    up_kv_percent = forms.FloatField(min_value=5, max_value=100, initial=80, label="…or when the KV cache stays at "
                                     "or above (%)")
    up_after_seconds = forms.IntegerField(min_value=10, max_value=3600, initial=60, label="…for (seconds)")
    down_after_seconds = forms.IntegerField(min_value=30, max_value=86400, initial=300,
                                            label="Remove one after this many quiet seconds",
                                            help_text="Quiet: no request waited, the KV cache under half the "
                                                      "threshold. The replica leaves the route first and stops "
                                                      "once its requests have finished.")

    def clean(self):
        cleaned = super().clean()
        low, high = cleaned.get("min_replicas"), cleaned.get("max_replicas")
        if low is not None and high is not None and high < low:
            self.add_error("max_replicas", f"The most replicas ({high}) must be at least the fewest ({low}).")
        return cleaned

    def policy_values(self):
        data = self.cleaned_data
        return {"min_replicas": data["min_replicas"], "max_replicas": data["max_replicas"],
                "up_waiting": data["up_waiting"], "up_kv_cache": data["up_kv_percent"] / 100,
                "up_after_seconds": data["up_after_seconds"], "down_after_seconds": data["down_after_seconds"]}

    @classmethod
    def initial_for(cls, policy, replicas):
        if policy is None:
            return {"min_replicas": replicas, "max_replicas": min(replicas + 1, MAX_REPLICAS)}
        def plain(number):  # 80, not 80.0
            return int(number) if float(number).is_integer() else number

        return {"min_replicas": policy.min_replicas, "max_replicas": policy.max_replicas,
                "up_waiting": plain(policy.up_waiting), "up_kv_percent": plain(round(policy.up_kv_cache * 100, 1)),
                "up_after_seconds": policy.up_after_seconds, "down_after_seconds": policy.down_after_seconds}


class ProfileLoraForm(forms.Form):
    """A profile's LoRA settings (serving/adapters.py checks them against the adapters)."""

    max_loras = forms.IntegerField(min_value=0, max_value=64, label="Adapters at once (--max-loras)",
                                   help_text="How many adapters one batch runs; 0 turns LoRA off.")
    max_lora_rank = forms.TypedChoiceField(coerce=int, label="Largest adapter rank (--max-lora-rank)",
                                           choices=[(rank, str(rank)) for rank in VLLM_MAX_RANKS])
    adapters = forms.ModelMultipleChoiceField(queryset=LoraAdapter.objects.none(), required=False,
                                              widget=forms.CheckboxSelectMultiple, label="Loaded at start")

    def __init__(self, *args, profile, **kwargs):
        kwargs.setdefault("initial", {"max_loras": profile.max_loras, "max_lora_rank": profile.max_lora_rank,
                                      "adapters": list(profile.lora_adapters.all()) if profile.pk else []})
        super().__init__(*args, **kwargs)
        self.fields["adapters"].queryset = adapters_of(profile.model)
        self.fields["adapters"].label_from_instance = lambda adapter: (
            f"{adapter.name} (served as {adapter.served_name}, rank {adapter.rank})")
