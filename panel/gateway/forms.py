from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone


class KeyIssueForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses this key, e.g. the support bot's back end.")
    allowed_models = forms.CharField(
        required=False, max_length=2000, label="Allowed models",
        help_text="Comma-separated model names from your routes; empty allows every model of the team.")
    rpm_limit = forms.IntegerField(required=False, min_value=1, max_value=1_000_000, label="Requests per minute")
    tpm_limit = forms.IntegerField(required=False, min_value=1, max_value=1_000_000_000, label="Tokens per minute")
    fit_to_budget = forms.BooleanField(
        required=False, label="Fit max_tokens to the budget",
        help_text="When a request's max_tokens would not fit in what a budget has left, lower it to fit instead of "
                  "refusing the request (402); the answer may then end early, and its header says so.")
    expires_at = forms.DateTimeField(required=False, label="Expires (UTC)",
                                     widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                     help_text="Empty: never.")

    def __init__(self, *args, route_names=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.route_names = set(route_names)

    def clean_allowed_models(self):
        names = sorted({name.strip() for name in self.cleaned_data["allowed_models"].split(",") if name.strip()})
        unknown = [name for name in names if name not in self.route_names]
        if unknown:
            raise ValidationError(f"No route serves {', '.join(unknown)}; add the route first or fix the name.")
        return names

    def clean_expires_at(self):
        expires = self.cleaned_data["expires_at"]
        if expires is not None and expires <= timezone.now():
            raise ValidationError("The expiry must be in the future.")
        return expires


class MemberKeysForm(forms.Form):
    member_keys = forms.BooleanField(required=False, label="Members may issue their own keys")
    member_key_rpm_limit = forms.IntegerField(required=False, min_value=1, max_value=1_000_000,
                                              label="At most, requests per minute",
                                              help_text="Per key a member issues; empty: no cap.")
    member_key_tpm_limit = forms.IntegerField(required=False, min_value=1, max_value=1_000_000_000,
                                              label="At most, tokens per minute",
                                              help_text="Per key a member issues; empty: no cap.")

    def __init__(self, *args, instance=None, **kwargs):
        if instance is not None and not args:
            kwargs.setdefault("initial", {"member_keys": instance.member_keys,
                                          "member_key_rpm_limit": instance.member_key_rpm_limit,
                                          "member_key_tpm_limit": instance.member_key_tpm_limit})
        super().__init__(*args, **kwargs)
