"""Attack tests: an admin of team A who set an account's password through A's invite link cannot get into team B
when B invites that email: the email binds nothing (B must invite by username, told which team made the account),
and the account joins B only by accepting, signed in, and nobody else can accept for it."""
import re

from django.contrib.auth import get_user_model
from django.urls import reverse

from panel.accounts.models import Invitation, InvitedAccount, Membership
from panel.accounts.services import membership_add
from tests.support.api_helpers import bearer, token_for


def invited_by_team_a_whose_admin_set_the_password(client, alice):
    """dana@example.com's account, made by team A's invitation; A's admin used the link and holds the password."""
    client.force_login(alice)
    answer = client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "member"})
    link = re.search(r'id="setup-link">([^<]+)<', answer.content.decode()).group(1)
    client.logout()
    client.post(link, {"new_password1": "alice-knows-this-9", "new_password2": "alice-knows-this-9"})
    return get_user_model().objects.get(email="dana@example.com")


def test_another_teams_invite_by_email_does_not_reach_an_account_an_invite_created(client, team_setup):
    alice, bob = team_setup["alice"], team_setup["bob"]  # owners of team A and team B
    dana = invited_by_team_a_whose_admin_set_the_password(client, alice)
    client.force_login(bob)
    refused = client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "admin"})
    page = refused.content.decode()
    assert refused.status_code == 400 and "invite by username" in page and "Team A" in page
    by_api = client.post("/api/v1/members", {"who": "dana@example.com", "role": "admin"},
                         content_type="application/json", **bearer(token_for(bob, team_setup["team_b"])))
    assert by_api.status_code == 400 and "invite by username" in by_api.json()["detail"]
    assert not Invitation.objects.filter(user=dana).exists()
    assert not Membership.objects.filter(team=team_setup["team_b"], user=dana).exists()
    client.force_login(dana)  # what A's admin would do with the invitation
    assert "Team B" not in client.get(reverse("account")).content.decode()
    # A superuser who checked the address with its person frees it (the admin site's tick).
    InvitedAccount.objects.filter(user=dana).update(email_verified=True)
    client.force_login(bob)
    assert client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "admin"}).status_code == 302
    assert Invitation.objects.filter(team=team_setup["team_b"], user=dana).exists()


def test_an_invite_by_username_binds_nothing_until_that_account_accepts(client, team_setup, django_user_model):
    alice, bob = team_setup["alice"], team_setup["bob"]
    dana = invited_by_team_a_whose_admin_set_the_password(client, alice)
    client.force_login(bob)
    answer = client.post(reverse("member_invite"), {"who": "dana", "role": "admin"}, follow=True)
    assert "created by Team A&#x27;s invitation" in answer.content.decode()  # bob is told whose account it is
    assert not Membership.objects.filter(team=team_setup["team_b"], user=dana).exists()
    invitation = Invitation.objects.get(team=team_setup["team_b"], user=dana)

    stranger = django_user_model.objects.create_user("eve", password="pw-eve-12345")
    membership_add(team=team_setup["team_a"], user=stranger)
    client.force_login(stranger)  # someone else cannot accept it for dana
    client.post(reverse("invitation_accept", args=[invitation.pk]))
    assert not Membership.objects.filter(team=team_setup["team_b"]).exclude(user=bob).exists()

    client.force_login(dana)
    assert "Accept" in client.get(reverse("account")).content.decode()
    client.post(reverse("invitation_accept", args=[invitation.pk]))
    assert Membership.objects.get(team=team_setup["team_b"], user=dana).role == "admin"
    assert not Invitation.objects.exists()


def test_accounts_invited_before_the_record_existed_are_found_in_the_audit_log(team_setup, django_user_model):
    import importlib

    from django.apps import apps

    from panel.audit.models import AuditAction, AuditEvent

    old = django_user_model.objects.create_user("olga", email="olga@example.com", password="pw-olga-123")
    AuditEvent.objects.create(action=AuditAction.MEMBER_ADDED, team=team_setup["team_a"], actor=team_setup["alice"],
                              target="olga", detail={"role": "member", "new_account": True})
    AuditEvent.objects.create(action=AuditAction.MEMBER_ADDED, team=team_setup["team_b"], actor=team_setup["bob"],
                              target="olga", detail={"role": "member", "new_account": False, "invited": True})
    migration = importlib.import_module("panel.accounts.migrations.0005_invitedaccount")
    migration.from_the_audit_log(apps, None)
    origin = InvitedAccount.objects.get(user=old)
    assert (origin.team, origin.team_name, origin.invited_by, origin.email_verified) == (
        team_setup["team_a"], "Team A", team_setup["alice"], False)
    assert InvitedAccount.objects.count() == 1
