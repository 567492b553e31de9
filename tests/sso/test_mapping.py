"""The group mapping and the TOKENWISE_OIDC_* settings, read as start-up reads them: no browser, no database."""
import json

import pytest

from panel.accounts.models import ROLE_RANK, Role
from panel.env import EnvError
from panel.sso.config import oidc_settings
from panel.sso.mapping import ROLES, grants_for, group_map_parse, groups_in, teams_named

GROUPS = {"ml-admins": {"ml": "admin"}, "ml": {"ml": "member", "demo": "viewer"}, "owners": {"demo": "owner"}}
PROVIDER = {
    "TOKENWISE_OIDC_CLIENT_ID": "tokenwise", "TOKENWISE_OIDC_CLIENT_SECRET": "s3cret",
    "TOKENWISE_OIDC_ISSUER": "https://id.example.com",
    "TOKENWISE_OIDC_AUTHORIZATION_URL": "https://id.example.com/auth",
    "TOKENWISE_OIDC_TOKEN_URL": "https://id.example.com/token",
    "TOKENWISE_OIDC_USERINFO_URL": "https://id.example.com/me",
    "TOKENWISE_OIDC_JWKS_URL": "https://id.example.com/jwks",
    "TOKENWISE_OIDC_GROUPS": json.dumps(GROUPS),
}


def test_it_knows_the_panels_roles():
    assert set(ROLES) == set(Role.values)
    assert [ROLE_RANK[Role(role)] for role in ROLES] == [0, 1, 2, 3]  # lowest first, as the panel ranks them


def test_it_gives_the_highest_role_where_two_groups_name_one_team():
    assert grants_for(["ml", "ml-admins"], GROUPS) == {"ml": "admin", "demo": "viewer"}
    assert grants_for(["ml", "owners"], GROUPS) == {"ml": "member", "demo": "owner"}
    assert grants_for(["marketing"], GROUPS) == {}
    assert grants_for([], GROUPS) == {}
    assert teams_named(GROUPS) == {"ml", "demo"}


def test_it_reads_a_groups_claim_as_a_list_or_one_name():
    assert groups_in(["b", "a", "a", 3, ""]) == ["a", "b"]
    assert groups_in("ml") == ["ml"]
    assert groups_in(None) == [] and groups_in({"ml": True}) == []


@pytest.mark.parametrize("text, words", [
    ("", "TOKENWISE_OIDC_GROUPS is not set"),
    ("{ml: admin}", "TOKENWISE_OIDC_GROUPS is not JSON"),
    ("[]", "must be a JSON object of group to {team slug: role}"),
    ("{}", "must be a JSON object of group to {team slug: role}"),
    ('{"ml": "admin"}', "group 'ml' must map to an object of team slug to role"),
    ('{"ml": {}}', "group 'ml' must map to an object of team slug to role"),
    ('{"ml": {"Team A": "admin"}}', "names 'Team A', which is not a team's slug"),
    ('{"ml": {"ml": "superuser"}}', "gives team 'ml' the role 'superuser'; a role is one of viewer, member, admin"),
    ('{" ": {"ml": "member"}}', "a group name is empty"),
])
def test_it_refuses_a_mapping_it_cannot_read(text, words):
    with pytest.raises(EnvError) as refused:
        group_map_parse("TOKENWISE_OIDC_GROUPS", text)
    assert words in str(refused.value)


def test_it_is_off_until_a_client_id_is_set(monkeypatch):
    for name in PROVIDER:
        monkeypatch.delenv(name, raising=False)
    assert oidc_settings(["panel.accounts.backends.ThrottledModelBackend"]) == {"SSO_ENABLED": False, "SSO_NAME": ""}


def test_it_puts_the_providers_backend_first_when_on(monkeypatch):
    for name, value in PROVIDER.items():
        monkeypatch.setenv(name, value)
    found = oidc_settings(["panel.accounts.backends.ThrottledModelBackend"])
    assert found["SSO_ENABLED"] and found["SSO_NAME"] == "SSO" and found["SSO_GROUP_MAP"] == GROUPS
    assert found["AUTHENTICATION_BACKENDS"] == ["panel.sso.backends.ProviderBackend",
                                                "panel.accounts.backends.ThrottledModelBackend"]
    assert found["OIDC_OP_TOKEN_ENDPOINT"] == "https://id.example.com/token" and found["OIDC_USE_PKCE"]


@pytest.mark.parametrize("name, value, words", [
    ("TOKENWISE_OIDC_CLIENT_SECRET", "", "TOKENWISE_OIDC_CLIENT_SECRET is not set"),
    ("TOKENWISE_OIDC_TOKEN_URL", "", "TOKENWISE_OIDC_TOKEN_URL is not set"),
    ("TOKENWISE_OIDC_TOKEN_URL", "id.example.com/token", "is not an http(s) URL"),
    ("TOKENWISE_OIDC_ISSUER", "http://id.example.com", "the identity provider is reached over https"),
    ("TOKENWISE_OIDC_SCOPES", "email profile", "must include openid"),
    ("TOKENWISE_OIDC_SIGN_ALGO", "none", "is not one of RS256"),
    ("TOKENWISE_OIDC_GROUPS", '{"ml": {"ml": "boss"}}', "the role 'boss'"),
])
def test_it_stops_start_up_on_a_missing_or_bad_setting(monkeypatch, name, value, words):
    for provider_name, provider_value in PROVIDER.items():
        monkeypatch.setenv(provider_name, provider_value)
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvError) as refused:
        oidc_settings([])
    assert words in str(refused.value)


def test_it_allows_http_on_this_machine_only(monkeypatch):
    for name, value in PROVIDER.items():
        monkeypatch.setenv(name, value.replace("https://id.example.com", "http://127.0.0.1:9400"))
    assert oidc_settings([])["SSO_ISSUER"] == "http://127.0.0.1:9400"
