"""Member management: who may invite, change roles and remove, the owner safeguards, the one-time set-password
link for a new email, and the audit rows each action leaves."""
import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from panel.accounts.models import Membership, Role
from panel.accounts.services import membership_add
from panel.audit.models import AuditAction, AuditEvent


@pytest.fixture
def people(team_setup, django_user_model):
    """Team A: alice owner, vera viewer, plus adam (admin), mia (member); carl has an account but no team."""
    team = team_setup["team_a"]
    adam = django_user_model.objects.create_user("adam", email="adam@example.com", password="pw-adam-123")
    mia = django_user_model.objects.create_user("mia", password="pw-mia-123")
    django_user_model.objects.create_user("carl", email="Carl@Example.com", password="pw-carl-123")
    membership_add(team=team, user=adam, role=Role.ADMIN)
    membership_add(team=team, user=mia, role=Role.MEMBER)
    return {**team_setup, "adam": adam, "mia": mia}


def m(team, username):
    return Membership.objects.get(team=team, user__username=username)


def audits(action):
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


def test_it_lists_members_for_admins_only(client, people):
    client.force_login(people["adam"])
    page = client.get(reverse("members"))
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("alice", "adam", "mia", "vera"):
        assert f'data-member="{name}"' in html
    assert "bob" not in html  # team B
    assert 'href="/members/"' in html  # the top bar link
    for user in (people["mia"], people["vera"]):
        client.force_login(user)
        assert client.get(reverse("members")).status_code == 403
        assert 'href="/members/"' not in client.get(reverse("home")).content.decode()


def accept(client, user, team):
    from panel.accounts.models import Invitation

    client.force_login(user)
    invitation = Invitation.objects.get(team=team, user=user)
    assert client.post(reverse("invitation_accept", args=[invitation.pk])).status_code == 302


def test_it_invites_an_existing_user_by_username_or_by_email(client, people):
    client.force_login(people["adam"])
    response = client.post(reverse("member_invite"), {"who": "carl@example.com", "role": "viewer"})
    assert response.status_code == 302
    assert not Membership.objects.filter(team=people["team_a"], user__username="carl").exists()  # not yet
    [event] = audits(AuditAction.MEMBER_ADDED)
    assert (event.actor, event.target, event.detail) == (people["adam"], "carl", {"role": "viewer",
                                                                                 "new_account": False,
                                                                                 "invited": True})
    accept(client, get_user_model().objects.get(username="carl"), people["team_a"])
    assert m(people["team_a"], "carl").role == Role.VIEWER
    client.force_login(people["alice"])
    assert client.post(reverse("member_invite"), {"who": "bob", "role": "admin"}).status_code == 302
    accept(client, people["bob"], people["team_a"])
    assert m(people["team_a"], "bob").role == Role.ADMIN
    assert m(people["team_b"], "bob").role == Role.OWNER  # untouched in his own team


@pytest.mark.parametrize("who, role, words", [
    ("nobody", "member", "No account is named"),
    ("not-an-email@", "member", "not a valid email"),
    ("mia", "member", "already a member"),
    ("", "member", "This field is required"),
    ("carl", "superuser", "Select a valid choice"),
])
def test_it_refuses_a_bad_invite_and_writes_nothing(client, people, who, role, words):
    client.force_login(people["alice"])
    users, members = get_user_model().objects.count(), Membership.objects.count()
    response = client.post(reverse("member_invite"), {"who": who, "role": role})
    assert response.status_code == 400
    assert words in response.content.decode()
    assert (get_user_model().objects.count(), Membership.objects.count()) == (users, members)
    assert audits(AuditAction.MEMBER_ADDED) == []


def test_it_creates_an_inactive_account_for_a_new_email_with_a_one_time_link(client, people):
    client.force_login(people["adam"])
    response = client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "member"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    dana = get_user_model().objects.get(email="dana@example.com")
    assert dana.username == "dana" and not dana.is_active and not dana.has_usable_password()
    link = re.search(r'id="setup-link">([^<]+)<', response.content.decode()).group(1)
    assert link.startswith("http://testserver/welcome/")
    assert link not in str(AuditEvent.objects.values_list("target", "detail"))  # never stored
    assert m(people["team_a"], "dana").role == Role.MEMBER
    client.logout()
    assert not client.login(username="dana", password="")  # no password yet: cannot sign in
    weak = client.post(link, {"new_password1": "123", "new_password2": "123"})
    assert weak.status_code == 400 and not get_user_model().objects.get(pk=dana.pk).is_active
    done = client.post(link, {"new_password1": "a-long-Pass-phrase-9", "new_password2": "a-long-Pass-phrase-9"},
                       follow=True)
    # Setting the password signs the person in, and the page says so with the username to sign in with next time.
    assert done.redirect_chain == [(reverse("home"), 302)]
    assert done.context["user"].get_username() == "dana"
    assert "Your password is set and you are signed in" in done.content.decode() and "dana" in done.content.decode()
    assert AuditEvent.objects.filter(action=AuditAction.SIGNIN, actor=dana).count() == 1
    client.logout()
    assert client.login(username="dana", password="a-long-Pass-phrase-9")
    client.logout()
    again = client.get(link)  # spent: the password hash changed
    assert again.status_code == 404 and "not valid" in again.content.decode()
    assert client.get("/welcome/Mg/bogus-token/").status_code == 404


def test_it_lets_an_admin_manage_members_and_admins_but_never_owners(client, people):
    team = people["team_a"]
    client.force_login(people["adam"])
    assert client.post(reverse("member_role", args=[m(team, "mia").pk]), {"role": "admin"}).status_code == 302
    assert m(team, "mia").role == Role.ADMIN
    [event] = audits(AuditAction.ROLE_CHANGED)
    assert (event.target, event.detail) == ("mia", {"before": "member", "after": "admin"})
    # an admin can neither make an owner nor touch one
    assert client.post(reverse("member_role", args=[m(team, "mia").pk]), {"role": "owner"}).status_code == 403
    assert client.post(reverse("member_role", args=[m(team, "alice").pk]), {"role": "viewer"}).status_code == 403
    assert client.post(reverse("member_remove", args=[m(team, "alice").pk])).status_code == 403
    assert client.post(reverse("member_invite"), {"who": "carl", "role": "owner"}).status_code == 400
    assert (m(team, "mia").role, m(team, "alice").role) == (Role.ADMIN, Role.OWNER)
    assert not Membership.objects.filter(team=team, user__username="carl").exists()
    assert len(audits(AuditAction.REFUSED)) == 3
    assert len(audits(AuditAction.ROLE_CHANGED)) == 1
    # another team's membership is a 404, and nothing changes there
    other = m(people["team_b"], "bob")
    assert client.post(reverse("member_role", args=[other.pk]), {"role": "viewer"}).status_code == 404
    assert client.post(reverse("member_remove", args=[other.pk])).status_code == 404
    assert m(people["team_b"], "bob").role == Role.OWNER
    # a bad role is a 400, nothing written
    assert client.post(reverse("member_role", args=[m(team, "vera").pk]), {"role": "boss"}).status_code == 400
    assert m(team, "vera").role == Role.VIEWER
    # remove a member
    assert client.post(reverse("member_remove", args=[m(team, "vera").pk])).status_code == 302
    assert not Membership.objects.filter(team=team, user=people["vera"]).exists()
    [removed] = audits(AuditAction.MEMBER_REMOVED)
    assert (removed.actor, removed.target, removed.detail) == (people["adam"], "vera", {"role": "viewer"})
    assert get_user_model().objects.filter(username="vera").exists()  # the account stays


def test_it_keeps_the_last_owner(client, people):
    team = people["team_a"]
    client.force_login(people["alice"])
    demote = client.post(reverse("member_role", args=[m(team, "alice").pk]), {"role": "admin"})
    assert demote.status_code == 400 and "last owner" in demote.content.decode()
    remove = client.post(reverse("member_remove", args=[m(team, "alice").pk]))
    assert remove.status_code == 400 and "last owner" in remove.content.decode()
    assert m(team, "alice").role == Role.OWNER and audits(AuditAction.ROLE_CHANGED) == []
    # with a second owner, the first may step down
    assert client.post(reverse("member_role", args=[m(team, "adam").pk]), {"role": "owner"}).status_code == 302
    assert client.post(reverse("member_role", args=[m(team, "alice").pk]), {"role": "member"}).status_code == 302
    assert m(team, "alice").role == Role.MEMBER
    client.force_login(people["adam"])
    assert client.post(reverse("member_remove", args=[m(team, "adam").pk])).status_code == 400
    assert [e.detail["after"] for e in audits(AuditAction.ROLE_CHANGED)] == ["owner", "member"]


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_it_refuses_every_member_action_below_admin(client, people, role):
    team = people["team_a"]
    user = people["mia"] if role == Role.MEMBER else people["vera"]
    client.force_login(user)
    target = m(team, "adam")
    for url, data in ((reverse("member_invite"), {"who": "carl", "role": "member"}),
                      (reverse("member_role", args=[target.pk]), {"role": "viewer"}),
                      (reverse("member_remove", args=[target.pk]), {})):
        assert client.post(url, data).status_code == 403
    assert m(team, "adam").role == Role.ADMIN and Membership.objects.filter(team=team).count() == 4
    assert len(audits(AuditAction.REFUSED)) == 3


def test_it_hands_out_a_new_link_only_for_a_pending_account_of_this_team(client, people):
    client.force_login(people["adam"])
    client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "member"})
    again = client.post(reverse("member_link", args=[m(people["team_a"], "dana").pk]))
    assert again.status_code == 200 and "/welcome/" in again.content.decode()
    active = client.post(reverse("member_link", args=[m(people["team_a"], "mia").pk]), follow=True)
    assert "/welcome/" not in active.content.decode() and "already set a password" in active.content.decode()
    # bob (team B's owner) cannot pull the pending account into his team and set its password
    client.force_login(people["bob"])
    refused = client.post(reverse("member_invite"), {"who": "dana", "role": "member"})
    assert refused.status_code == 400 and "invited to another team" in refused.content.decode()
    refused = client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "member"})
    assert refused.status_code == 400 and "invite by username" in refused.content.decode()
    assert not Membership.objects.filter(team=people["team_b"], user__username="dana").exists()
