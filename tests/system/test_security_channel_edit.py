"""Attack test: an admin who moves a channel's base URL to another server must type the key again (page and API);
base-URL and credential-kind changes are audited."""
import json

import pytest
from django.core.exceptions import ValidationError

from panel.audit.models import AuditAction, AuditEvent
from panel.channels.models import Channel, ChannelKind, CredentialKind
from panel.channels.services import channel_create, channel_update
from tests.support.api_helpers import bearer, token_for

KEY = "sk-team-key-0123456789"


@pytest.fixture
def stored(team_setup):
    return channel_create(team=team_setup["team_a"], name="cloud", kind=ChannelKind.REMOTE,
                          base_url="https://provider.example/v1", model_id="m",
                          credential_kind=CredentialKind.STORED, api_key=KEY)


def test_moving_the_base_url_without_the_key_is_refused(stored):
    with pytest.raises(ValidationError) as caught:
        channel_update(channel=Channel.objects.get(pk=stored.pk), base_url="https://attacker.example/v1")
    assert "enter the key again" in caught.value.message_dict["api_key"][0]
    assert Channel.objects.get(pk=stored.pk).base_url == "https://provider.example/v1"
    same_origin = channel_update(channel=Channel.objects.get(pk=stored.pk), base_url="https://provider.example/v2")
    assert same_origin.api_key() == KEY and same_origin.changes == {
        "base_url": ("https://provider.example/v1", "https://provider.example/v2")}
    moved = channel_update(channel=Channel.objects.get(pk=stored.pk), base_url="https://other.example/v1",
                           api_key="sk-other-key-99999999")
    assert moved.api_key() == "sk-other-key-99999999"


def test_the_page_refuses_and_audits(client, team_setup, stored):
    client.force_login(team_setup["alice"])
    page = client.get(f"/channels/{stored.pk}/edit/")
    form = {name: value for name, value in page.context["form"].initial.items() if value is not None}
    form.update(base_url="https://attacker.example/v1", deployment="", enabled="on")
    answer = client.post(f"/channels/{stored.pk}/edit/", form)
    assert answer.status_code == 400 and "enter the key again" in answer.content.decode()
    assert not AuditEvent.objects.filter(action=AuditAction.CHANNEL_CHANGED).exists()
    form.update(base_url="https://provider.example/v2")
    assert client.post(f"/channels/{stored.pk}/edit/", form).status_code == 302
    event = AuditEvent.objects.get(action=AuditAction.CHANNEL_CHANGED)
    assert "provider.example/v2" in json.dumps(event.detail) and KEY not in json.dumps(event.detail)


def test_the_api_refuses_and_audits(client, team_setup, stored):
    raw = token_for(team_setup["alice"], team_setup["team_a"])

    def patch(body):
        return client.patch(f"/api/v1/channels/{stored.pk}", data=json.dumps(body),
                            content_type="application/json", **bearer(raw))

    answer = patch({"base_url": "https://attacker.example/v1"})
    assert answer.status_code == 400 and "enter the key again" in answer.json()["errors"]["api_key"][0]
    assert patch({"credential_kind": "none"}).status_code == 200
    event = AuditEvent.objects.get(action=AuditAction.CHANNEL_CHANGED)
    assert "stored → none" in json.dumps(event.detail, ensure_ascii=False)
