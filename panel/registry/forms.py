from django import forms
from django.core.exceptions import ValidationError

from panel.hosts.models import WorkerHost
from panel.registry.models import CalibrationSource
from panel.registry.services import calibration_text_check


class ModelRegisterForm(forms.Form):
    source = forms.CharField(
        max_length=1000, label="Local folder or hub id",
        help_text="An absolute path to a checkpoint folder (config.json + .safetensors), or a hub id such as "
                  "Qwen/Qwen2.5-7B-Instruct that is already in this machine's hub cache. Nothing is downloaded.",
        widget=forms.TextInput(attrs={"placeholder": "/data/models/Qwen2.5-7B-Instruct"}))
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the folder name or hub id.")


class QuantizationForm(forms.Form):
    q_group_size = forms.TypedChoiceField(
        label="Group size", coerce=int, initial=128,
        choices=[(64, "64"), (128, "128 (recommended)"), (256, "256 (smaller, costs accuracy)")],
        help_text="Weights share one scale per group. 128 is the usual balance; 256 saves a little more memory "
                  "but measurably costs accuracy.")
    zero_point = forms.BooleanField(required=False, initial=True, label="Zero point (asymmetric quantization)")
    version = forms.ChoiceField(choices=[("GEMM", "GEMM (batched serving)"), ("GEMV", "GEMV (batch size 1)")],
                                initial="GEMM", label="Kernel")
    calibration = forms.ChoiceField(choices=CalibrationSource.choices, initial=CalibrationSource.BUILTIN,
                                    widget=forms.RadioSelect)
    calibration_file = forms.FileField(required=False, label="Calibration text file",
                                       help_text="UTF-8 text from your own domain (prompts, documents), up to 20 MB.")
    max_calib_samples = forms.IntegerField(min_value=8, max_value=4096, initial=128, label="Max calibration samples")
    max_calib_seq_len = forms.IntegerField(min_value=64, max_value=4096, initial=512,
                                           label="Calibration sequence length (tokens)")
    host = forms.ModelChoiceField(queryset=WorkerHost.objects.none(), required=False,
                                  empty_label="Any GPU worker", label="Run on")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["host"].queryset = WorkerHost.objects.filter(kind="gpu").order_by("host")
        self.calibration_data = None

    def clean_host(self):
        host = self.cleaned_data.get("host")
        if host is not None and not host.is_online:
            raise ValidationError(f"{host.name} is offline; pick another worker or any GPU worker.")
        return host

    def clean(self):
        cleaned = super().clean()
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

    @property
    def warnings(self):
        if self.is_bound and self.is_valid() and self.cleaned_data["q_group_size"] == 256:
            return ["Group size 256 costs accuracy: check the quantized model's outputs (Compare, JSON check) "
                    "before you route traffic to it."]
        return []
