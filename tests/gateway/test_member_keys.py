"""Members issue their own gateway keys where an admin lets them, within the team's per-minute caps, on the page and
through the API; they revoke only their own; without the admin's leave the page says who issues keys (a member saw
no form and no word why, and POST /api/v1/keys was a bare 403)."""
import html

from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.accounts.models import Role, TeamKey
from panel.accounts.services import membership_add
from tests.support.api_helpers import call, token_for


def member_of(team_setup, django_user_model):
    user = django_user_model.objects.create_user("mia", password="pw-mia-123")
    membership_add(team=team_setup["team_a"], user=user, role=Role.MEMBER)
    return user


def test_without_leave_a_member_is_told_who_issues_keys(client, team_setup, django_user_model):
    mia = member_of(team_setup, django_user_model)
    client.force_login(mia)
    page = client.get(reverse("keys")).content.decode()
    assert "Keys of this team are issued by its admins (alice)" in page
    assert f'action="{reverse("key_create")}"' not in page and f'action="{reverse("member_keys")}"' not in page
    refused = client.post(reverse("key_create"), {"name": "mine"})
    assert refused.status_code == 403 and "Only this team's admins issue keys" in html.unescape(
        refused.content.decode())
    api = call(client, "post", "/keys", token_for(mia, team_setup["team_a"]), {"name": "mine"})
    assert api.status_code == 403 and "An admin can let members issue their own keys" in api.json()["detail"]
    assert not TeamKey.objects.exists()


def test_with_leave_a_member_issues_capped_keys_and_revokes_only_their_own(client, team_setup, django_user_model):
    team, alice = team_setup["team_a"], team_setup["alice"]
    mia = member_of(team_setup, django_user_model)
    client.force_login(alice)
    assert client.post(reverse("member_keys"), {"member_keys": "on", "member_key_rpm_limit": 60,
                                                "member_key_tpm_limit": 10000}).status_code == 302
    team.refresh_from_db()
    assert (team.member_keys, team.member_key_rpm_limit, team.member_key_tpm_limit) == (True, 60, 10000)
    theirs, _ = key_issue(team=team, user=alice, name="alice's")

    client.force_login(mia)
    page = client.get(reverse("keys")).content.decode()
    assert "Issue a key for yourself" in page and "allow at most 60 requests and 10K tokens per minute" in page
    over = client.post(reverse("key_create"), {"name": "bot", "rpm_limit": 100})
    assert over.status_code == 400 and "allows at most 60 requests per minute" in over.content.decode()
    assert client.post(reverse("key_create"), {"name": "bot"}).status_code == 200
    mine = TeamKey.objects.get(name="bot")
    assert (mine.created_by, mine.rpm_limit, mine.tpm_limit) == (mia, 60, 10000)  # the caps, where none was given
    api = call(client, "post", "/keys", token_for(mia, team), {"name": "script", "tpm_limit": 500})
    assert api.status_code == 201 and (api.json()["rpm_limit"], api.json()["tpm_limit"]) == (60, 500)

    assert client.post(reverse("key_revoke", args=[theirs.pk])).status_code == 403
    assert client.post(reverse("key_revoke", args=[mine.pk])).status_code == 302
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None and theirs.revoked_at is None
    page = client.get(reverse("keys")).content.decode()
    assert reverse("key_revoke", args=[theirs.pk]) not in page  # no Revoke button on another's key


def test_a_viewer_still_issues_nothing(client, team_setup):
    team = team_setup["team_a"]
    team.member_keys = True
    team.save()
    client.force_login(team_setup["vera"])
    assert client.post(reverse("key_create"), {"name": "x"}).status_code == 403
    assert "Keys of this team are issued by its admins" in client.get(reverse("keys")).content.decode()


def test_the_member_keys_setting_through_the_api(client, team_setup, django_user_model):
    from panel.audit.models import AuditAction, AuditEvent

    team = team_setup["team_a"]
    owner = token_for(team_setup["alice"], team)
    member = token_for(member_of(team_setup, django_user_model), team)
    assert call(client, "get", "/keys/members", member).json() == {
        "member_keys": False, "member_key_rpm_limit": None, "member_key_tpm_limit": None}
    refused = call(client, "put", "/keys/members", member, {"member_keys": True})
    assert refused.status_code == 403
    bad = call(client, "put", "/keys/members", owner, {"member_keys": True, "member_key_rpm_limit": 0})
    assert bad.status_code in (400, 422) and "member_key_rpm_limit" in bad.content.decode()
    team.refresh_from_db()
    assert team.member_keys is False  # nothing written
    done = call(client, "put", "/keys/members", owner, {"member_keys": True, "member_key_rpm_limit": 30,
                                                         "member_key_tpm_limit": None})
    assert done.status_code == 200 and done.json() == {
        "member_keys": True, "member_key_rpm_limit": 30, "member_key_tpm_limit": None}
    team.refresh_from_db()
    assert (team.member_keys, team.member_key_rpm_limit, team.member_key_tpm_limit) == (True, 30, None)
    [event] = AuditEvent.objects.filter(action=AuditAction.SETTING_CHANGED)
    assert event.target == "members' own gateway keys" and event.detail["rpm"] == "30"
    issued = call(client, "post", "/keys", member, {"name": "mine", "rpm_limit": 100})
    assert issued.status_code == 400 and "30" in issued.content.decode()  # the cap the API just set holds
    off = call(client, "put", "/keys/members", owner, {"member_keys": False})
    assert off.json()["member_keys"] is False
