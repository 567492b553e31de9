from django.conf import settings
from django.db import models

from panel.jobs.models import Job


class RegisteredModel(models.Model):
    """A checkpoint folder the team registered (or a quantization job produced), with the facts read from it."""

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
        method = self.quantization.get("method", "?").upper()
        bits = self.quantization.get("bits")
        group = self.quantization.get("group_size")
        return " ".join(part for part in [method, f"{bits}-bit" if bits else "", f"g{group}" if group else ""] if part)

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
    """An AutoAWQ run on a GPU worker: source model in, a new quantized RegisteredModel out."""

    source = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="quantization_jobs")
    host = models.ForeignKey("hosts.WorkerHost", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    w_bit = models.PositiveSmallIntegerField(default=4)
    q_group_size = models.PositiveSmallIntegerField(default=128)
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
        return f"AWQ {self.w_bit}-bit g{self.q_group_size} of {self.source}"

    @property
    def quant_config(self):
        return {"zero_point": self.zero_point, "q_group_size": self.q_group_size, "w_bit": self.w_bit,
                "version": self.version}
