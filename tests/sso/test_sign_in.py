"""Signing in through the provider, from its user info on (services.identity_sign_in): the account, its teams and
roles from its groups, refusals. The browser test (test_browser.py) goes through the real provider."""
import pytest
from django.contrib.auth import get_user_model

from panel.accounts.keys import key_issue
from panel.accounts.models import AccessToken, Membership, Role, Team, TeamKey
from panel.accounts.services import membership_add, team_create
from panel.accounts.tokens import token_issue
from panel.audit.models import AuditAction, AuditEvent
from panel.sso.models import Identity
from panel.sso.services import SignInRefused, identity_sign_in
from tests.support.teams import user_create

ISSUER = "https://id.example.com"
GROUPS = {"ml-admins": {"team-a": "admin"}, "ml": {"team-a": "member"}, "b-viewers": {"team-b": "viewer"},
          "ghosts": {"no-such-team": "member"}, "solo-owners": {"solo": "owner"}, "solo": {"solo": "member"}}


def sign_in(sub, groups, **claims):
    return identity_sign_in(issuer=ISSUER, claims={"sub": sub, "groups": groups, **claims}, groups_claim="groups",
                            group_map=GROUPS)


def roles(user):
    return {membership.team.slug: membership.role for membership in Membership.objects.filter(user=user)}


@pytest.fixture
def teams(team_setup):
    return team_setup


def test_it_opens_an_account_with_the_teams_and_roles_its_groups_give(teams):
    user = sign_in("ada-1", ["ml-admins", "ml", "b-viewers"], preferred_username="ada", email="ada@acme.test")
    assert user.username == "ada" and user.email == "ada@acme.test" and not user.has_usable_password()
    assert roles(user) == {"team-a": Role.ADMIN, "team-b": Role.VIEWER}
    assert Identity.objects.get(user=user).groups == ["b-viewers", "ml", "ml-admins"]
    added = AuditEvent.objects.filter(action=AuditAction.MEMBER_ADDED, target="ada")
    assert added.count() == 2 and {event.actor_name for event in added} == {"identity provider"}
    assert sign_in("ada-1", ["ml"]) == user  # the same identity, the same account


def test_it_refuses_an_identity_whose_groups_give_nothing_and_opens_no_account(teams):
    accounts = get_user_model().objects.count()
    for groups in (["marketing"], [], ["ghosts"]):  # no group mapped; no group at all; a mapped team that is gone
        with pytest.raises(SignInRefused) as refused:
            sign_in("mallory-1", groups, preferred_username="mallory")
        assert "no group that gives access to a team here" in str(refused.value)
        assert f"(your groups: {', '.join(groups) or 'none'})" in str(refused.value)
    assert get_user_model().objects.count() == accounts and not Identity.objects.exists()


def test_it_follows_the_providers_groups_at_the_next_sign_in(teams):
    user = sign_in("ada-1", ["ml-admins", "b-viewers"], preferred_username="ada")
    assert sign_in("ada-1", ["ml"]) == user
    assert roles(user) == {"team-a": Role.MEMBER}  # admin lowered to member; the team B group gone with its team
    assert AuditEvent.objects.filter(action=AuditAction.ROLE_CHANGED, target="ada", team=teams["team_a"]).exists()
    assert AuditEvent.objects.filter(action=AuditAction.MEMBER_REMOVED, target="ada", team=teams["team_b"]).exists()


def test_it_removes_a_known_identitys_memberships_when_no_group_is_left_and_refuses_it(teams):
    user = sign_in("ada-1", ["ml"], preferred_username="ada")
    with pytest.raises(SignInRefused):
        sign_in("ada-1", ["marketing"])
    assert roles(user) == {}


def test_it_leaves_memberships_in_teams_the_mapping_does_not_name(teams):
    user = sign_in("ada-1", ["ml"], preferred_username="ada")
    other = team_create(name="Research", owner=teams["alice"])
    membership_add(team=other, user=user, role=Role.MEMBER)  # an invitation accepted in the panel
    sign_in("ada-1", ["ml-admins"])
    assert roles(user) == {"team-a": Role.ADMIN, "research": Role.MEMBER}


def test_it_never_takes_over_a_local_account_by_name_or_email(teams):
    alice = teams["alice"]
    alice.email = "alice@acme.test"
    alice.save()
    user = sign_in("someone-at-the-provider", ["ml"], preferred_username="alice", email="alice@acme.test")
    assert user != alice and user.username == "alice2"
    assert roles(alice) == {"team-a": Role.OWNER}


def test_it_refuses_user_info_without_a_subject(teams):
    with pytest.raises(SignInRefused) as refused:
        identity_sign_in(issuer=ISSUER, claims={"groups": ["ml"]}, groups_claim="groups", group_map=GROUPS)
    assert "did not say who you are" in str(refused.value)


def test_it_keeps_an_email_the_provider_has_not_verified_off_the_account(db):
    team_create(name="Team A", owner=user_create("owner", "pw-owner-123"))
    user = sign_in("eve-1", ["ml"], preferred_username="eve", email="ceo@acme.test", email_verified=False)
    assert user.email == ""


def test_a_teams_last_owner_stays_its_owner_whatever_the_groups_say(teams):
    """The panel's pages refuse to lower or remove a team's last owner; the provider's groups cannot either. The
    change is kept out, audited and logged, until the team has another owner."""
    solo = Team.objects.create(name="Solo", slug="solo")
    user = sign_in("olga-1", ["solo-owners"], preferred_username="olga")
    assert roles(user) == {"solo": Role.OWNER}
    sign_in("olga-1", ["solo"])  # the group now gives member
    sign_in("olga-1", ["ml"])  # no group of team solo any more
    assert roles(user) == {"solo": Role.OWNER, "team-a": Role.MEMBER}
    kept = AuditEvent.objects.filter(action=AuditAction.OWNER_KEPT, team=solo, target="olga")
    assert [event.detail["groups_give"] for event in kept.order_by("pk")] == ["member", "none"]
    assert {event.actor_name for event in kept} == {"identity provider"}

    membership_add(team=solo, user=teams["bob"], role=Role.OWNER)  # now there is another owner
    sign_in("olga-1", ["solo"])
    assert roles(user) == {"solo": Role.MEMBER}


def test_a_membership_the_groups_end_takes_the_members_tokens_and_own_keys_with_it(teams):
    """As a removal in the panel does: their access tokens of the team and the gateway keys they issued as a member
    stop; the team's other keys stay."""
    team = teams["team_a"]
    user = sign_in("ada-1", ["ml"], preferred_username="ada")
    membership = Membership.objects.get(user=user, team=team)
    token, _ = token_issue(membership=membership, name="deploy script")
    own_key, _ = key_issue(team=team, user=user, name="ada's notebook")
    team_key, _ = key_issue(team=team, user=teams["alice"], name="the app")
    sign_in("ada-1", ["b-viewers"])  # out of team A
    assert roles(user) == {"team-b": Role.VIEWER}
    assert AccessToken.objects.get(pk=token.pk).revoked_at is not None
    assert TeamKey.objects.get(pk=own_key.pk).revoked_at is not None
    assert TeamKey.objects.get(pk=team_key.pk).revoked_at is None
    revoked = AuditEvent.objects.filter(team=team, target="ada", action__in=[AuditAction.KEY_REVOKED,
                                                                              AuditAction.TOKEN_REVOKED])
    assert {(event.action, event.actor_name) for event in revoked} == {
        (AuditAction.KEY_REVOKED, "identity provider"), (AuditAction.TOKEN_REVOKED, "identity provider")}
