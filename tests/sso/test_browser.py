"""In Chromium, through a real OpenID Connect provider (node's oidc-provider, tests/support/oidc_provider.py): a
person signs in with it and lands in the team and role their groups give; one whose groups give nothing is refused
and gets no account; a local account still signs in with its password beside the button; a group changed at the
provider applies at the next sign-in."""
import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from panel.accounts.models import Membership, Role
from panel.audit.models import AuditAction, AuditEvent
from panel.sso.config import oidc_settings
from panel.sso.models import Identity
from tests.support.browser import screenshot, sign_in
from tests.support.oidc_provider import OidcProvider

USERS = {
    "ada": {"email": "ada@acme.test", "email_verified": True, "preferred_username": "ada", "name": "Ada",
            "groups": ["ml-admins"]},
    "mallory": {"email": "mallory@acme.test", "preferred_username": "mallory", "groups": ["marketing"]},
}
GROUPS = {"ml-admins": {"team-a": "admin"}, "ml": {"team-a": "member"}, "b-viewers": {"team-b": "viewer"}}


@pytest.fixture
def provider(live_server, team_setup, tmp_path, settings, monkeypatch):
    """The provider started with USERS, and the panel's single sign-on turned on for it as TOKENWISE_OIDC_* would."""
    identity_provider = OidcProvider(tmp_path, f"{live_server.url}/sso/callback/", USERS).start()
    for name, value in identity_provider.panel_environment(GROUPS).items():
        monkeypatch.setenv(name, value)
    for name, value in oidc_settings(settings.AUTHENTICATION_BACKENDS).items():
        setattr(settings, name, value)
    yield identity_provider
    identity_provider.stop()


def through_the_provider(page, base_url, login):
    page.goto(f"{base_url}/login/")
    page.click("#sso-sign-in")
    page.fill("input[name=login]", login)  # the provider's own sign-in form
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")


def test_it_signs_in_through_the_provider_as_the_mapped_team_and_role(page, live_server, provider):
    page.goto(f"{live_server.url}/login/")
    expect(page.locator("#sso-sign-in")).to_have_text("Sign in with Acme ID")
    expect(page.locator("#id_username")).to_be_visible()
    screenshot(page, "sso-login")

    through_the_provider(page, live_server.url, "ada")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator("#team-select option:checked")).to_have_text("Team A")
    expect(page.locator(".role-badge")).to_have_text("admin")
    expect(page.locator(".topbar .user")).to_contain_text("ada")
    ada = Identity.objects.get(subject="ada").user
    assert ada.email == "ada@acme.test" and not ada.has_usable_password()
    assert {(m.team.slug, m.role) for m in Membership.objects.filter(user=ada)} == {("team-a", Role.ADMIN)}


def test_it_refuses_a_person_whose_groups_give_no_team(page, live_server, provider):
    accounts = get_user_model().objects.count()
    through_the_provider(page, live_server.url, "mallory")
    page.wait_for_url(f"{live_server.url}/sso/refused/")
    expect(page.locator("#sso-refusal")).to_contain_text("no group that gives access to a team here")
    expect(page.locator("#sso-refusal")).to_contain_text("(your groups: marketing)")
    screenshot(page, "sso-refused")
    assert get_user_model().objects.count() == accounts and not Identity.objects.exists()
    refusal = AuditEvent.objects.get(action=AuditAction.SIGNIN_FAILED, target="single sign-on (Acme ID)")
    assert "(your groups: marketing)" in refusal.detail["reason"]
    page.goto(f"{live_server.url}/")
    page.wait_for_url(f"{live_server.url}/login/?next=/")  # not signed in


def test_it_refuses_an_id_token_from_another_issuer(page, live_server, provider, settings):
    settings.SSO_ISSUER = "https://id.acme.test"  # what the operator set; the provider signs as itself
    through_the_provider(page, live_server.url, "ada")
    page.wait_for_url(f"{live_server.url}/sso/refused/")
    expect(page.locator("#sso-refusal")).to_contain_text("Acme ID did not confirm the sign-in")
    assert not Identity.objects.exists()


def test_it_still_signs_in_a_local_account_with_its_password(page, live_server, provider):
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    expect(page.locator(".role-badge")).to_have_text("owner")
    assert not Identity.objects.exists()


def test_it_applies_a_group_changed_at_the_provider_at_the_next_sign_in(page, live_server, provider):
    through_the_provider(page, live_server.url, "ada")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator(".role-badge")).to_have_text("admin")

    provider.set_users({**USERS, "ada": {**USERS["ada"], "groups": ["ml", "b-viewers"]}})
    page.click(".topbar .user button:has-text('Sign out')")
    page.wait_for_url(f"{live_server.url}/login/")
    page.click("#sso-sign-in")  # the provider still knows ada: it answers without its form
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator(".role-badge")).to_have_text("member")
    ada = Identity.objects.get(subject="ada").user
    assert {(m.team.slug, m.role) for m in Membership.objects.filter(user=ada)} == {("team-a", Role.MEMBER),
                                                                                 ("team-b", Role.VIEWER)}

    provider.set_users({**USERS, "ada": {**USERS["ada"], "groups": ["b-viewers"]}})
    page.click(".topbar .user button:has-text('Sign out')")
    page.click("#sso-sign-in")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator("#team-select option:checked")).to_have_text("Team B")
    expect(page.locator(".role-badge")).to_have_text("viewer")
    assert not Membership.objects.filter(user=ada, team__slug="team-a").exists()  # the group gone, the membership too
