from decimal import Decimal

from django import forms


class GpuPriceForm(forms.Form):
    """What an hour of one GPU on a host costs (an L40S or H100 rental, or the amortized price of your own), and how
    many GPUs a deployment there is billed for when it records none. The dashboards' local cost reads these."""

    gpu_price_per_hour = forms.DecimalField(label="Price per GPU-hour", required=False, min_value=Decimal(0),
                                            max_digits=10, decimal_places=4,
                                            help_text="Empty: no price (the Cost dashboard asks for one).")
    gpu_count = forms.IntegerField(label="GPUs", required=False, min_value=1, max_value=64,
                                   help_text="Empty: the deployment's own GPUs, else 1 (a CPU host: the machine).")
