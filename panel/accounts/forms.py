from django import forms

from panel.accounts.models import Role


def role_choices(actor_role):
    """The roles an actor may hand out: an admin never makes an owner."""
    return [(value, label) for value, label in Role.choices if actor_role == Role.OWNER or value != Role.OWNER]


class InviteForm(forms.Form):
    who = forms.CharField(label="Username or email", max_length=254,
                          help_text="An existing account is added at once. A new email gets an account and a "
                                    "one-time link to set its password, shown to you to pass on.")
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)

    def __init__(self, *args, actor_role, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = role_choices(actor_role)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)
