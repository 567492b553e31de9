from django import forms
from django.conf import settings

from panel.notifications.models import SUBSCRIBABLE, EventKind, WebhookFormat


class WebhookForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who listens, e.g. #ops in Slack.")
    url = forms.CharField(max_length=500, label="URL", widget=forms.URLInput(attrs={"spellcheck": "false"}),
                          help_text="Receives a POST with a JSON body for each event.")
    format = forms.ChoiceField(choices=WebhookFormat.choices, initial=WebhookFormat.JSON,
                               help_text="Slack-compatible sends {\"text\": …}, which Slack, Mattermost and most chat "
                                         "webhooks show as a message.")
    events = forms.MultipleChoiceField(
        required=False, choices=[(kind, EventKind(kind).label) for kind in SUBSCRIBABLE],
        widget=forms.CheckboxSelectMultiple, help_text="None ticked: every event.")
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        allowed = ", ".join(settings.OUTBOUND_ALLOW_CIDRS) or "none"
        self.fields["url"].help_text += (
            " A receiver on this machine or a private network (localhost, 10.x, 192.168.x, ...) is refused unless "
            f"the operator lists its range in TOKENWISE_OUTBOUND_ALLOW (listed now: {allowed}).")
