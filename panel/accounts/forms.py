from django import forms

from panel.accounts.models import ROLE_RANK, Role


def role_choices(actor_role):
    """The roles an actor may hand out: an admin never makes an owner."""
    return [(value, label) for value, label in Role.choices if actor_role == Role.OWNER or value != Role.OWNER]


class InviteForm(forms.Form):
    who = forms.CharField(label="Username or email", max_length=254,
                          help_text="An existing account gets an invitation it accepts, signed in. A new email "
                                    "gets an account and a one-time link to set its password, shown to you to "
                                    "pass on.")
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)

    def __init__(self, *args, actor_role, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = role_choices(actor_role)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class GpuQuotaForm(forms.Form):
    gpu_quota = forms.IntegerField(
        label="GPU quota", required=False, min_value=0, max_value=100_000,
        help_text="The most GPUs the team's deployments may hold at once (tensor × pipeline parallel × replicas, on "
                  "GPU hosts). Empty: no limit; 0: CPU hosts only.")


class TracePromptsForm(forms.Form):
    trace_prompts = forms.BooleanField(
        label="Prompts and answers in traces", required=False,
        help_text="When the panel sends OpenTelemetry traces, each gateway request's span carries its prompt and "
                  "answer text (gen_ai.input.messages, gen_ai.output.messages). Off: figures and names only.")


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. the deploy script.")
    role = forms.ChoiceField(label="Acts as", choices=Role.choices,
                             help_text="At most your own role; a lower one limits what the token can do.")
    expires_at = forms.DateTimeField(required=False, label="Expires (UTC)",
                                     widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                     help_text="Empty: never.")

    def __init__(self, *args, actor_role, **kwargs):
        super().__init__(*args, **kwargs)
        rank = ROLE_RANK[Role(actor_role)]
        self.fields["role"].choices = [(value, label) for value, label in Role.choices
                                       if ROLE_RANK[Role(value)] <= rank]
        self.fields["role"].initial = actor_role
