"""Team keys: issued by admins, shown once, stored as a SHA-256 and the last four characters, revocable."""
import hashlib
import re

import pytest
from django.db import connection
from django.urls import reverse

from panel.accounts.models import Role, TeamKey
from panel.accounts.services import membership_add
from panel.channels.models import Route


@pytest.fixture
def route(team_setup):
    return Route.objects.create(team=team_setup["team_a"], model_name="chat")


def test_it_shows_a_new_key_once_and_stores_only_its_hash(client, team_setup, route):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("key_create"), {"name": "support bot", "allowed_models": "chat",
                                                   "rpm_limit": 60})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    raw = re.search(r'<pre class="command" id="new-key">(tw-[A-Za-z0-9_-]+)</pre>', response.content.decode()).group(1)
    assert len(raw) >= 3 + 43  # 256 random bits, URL-safe base64
    key = TeamKey.objects.get()
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest() and key.last4 == raw[-4:]
    assert (key.allowed_models, key.rpm_limit, key.team) == (["chat"], 60, team_setup["team_a"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM gateway_teamkey")
        assert raw not in repr(cursor.fetchall())
    again = client.get(reverse("keys")).content.decode()
    assert raw not in again and f"tw-…{raw[-4:]}" in again


@pytest.mark.parametrize("data, message", [
    ({"name": ""}, "This field is required"),
    ({"name": "x", "allowed_models": "chat, nope"}, "No route serves nope"),
    ({"name": "x", "expires_at": "2020-01-01T00:00"}, "must be in the future"),
    ({"name": "x", "rpm_limit": 0}, "greater than or equal to 1"),
])
def test_it_refuses_bad_key_requests_and_saves_nothing(client, team_setup, route, data, message):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("key_create"), data)
    assert response.status_code == 400 and message in response.content.decode()
    assert TeamKey.objects.count() == 0


def test_it_lets_only_admins_issue_and_revoke(client, team_setup, route, django_user_model):
    from panel.accounts.keys import key_issue

    key, _ = key_issue(team=team_setup["team_a"], user=None, name="existing")
    member = django_user_model.objects.create_user("mona", password="pw-mona-123")
    membership_add(team=team_setup["team_a"], user=member, role=Role.MEMBER)
    for user in (team_setup["vera"], member):
        client.force_login(user)
        assert client.post(reverse("key_create"), {"name": "x"}).status_code == 403
        assert client.post(reverse("key_revoke", args=[key.pk])).status_code == 403
        assert client.get(reverse("keys")).status_code == 200
    assert TeamKey.objects.count() == 1 and TeamKey.objects.get().status == "active"


def test_it_revokes_a_key_and_hides_other_teams_keys(client, team_setup):
    from panel.accounts.keys import key_issue

    mine, _ = key_issue(team=team_setup["team_a"], user=None, name="mine")
    theirs, _ = key_issue(team=team_setup["team_b"], user=None, name="theirs")
    client.force_login(team_setup["alice"])
    assert client.post(reverse("key_revoke", args=[theirs.pk])).status_code == 404
    response = client.post(reverse("key_revoke", args=[mine.pk]), follow=True)
    assert "Revoked mine" in response.content.decode()
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.status == "revoked" and theirs.status == "active"
    assert "already revoked" in client.post(reverse("key_revoke", args=[mine.pk]), follow=True).content.decode()
    assert "theirs" not in client.get(reverse("keys")).content.decode()
