"""Helpers for the API tests: a personal access token per role, and calls with it."""
import json

import pytest

from panel.accounts.models import Membership, Role
from panel.accounts.services import membership_add
from panel.accounts.tokens import token_issue
from tests.support.teams import user_create


def token_for(user, team, role=None):
    """A raw personal access token of `user` in `team` (acting with `role`, at most theirs)."""
    membership = Membership.objects.get(user=user, team=team)
    return token_issue(membership=membership, name=f"test {role or membership.role}", role=role)[1]


def role_tokens(team_setup, django_user_model):
    """{role: raw token} in team A: alice (owner), an admin, a member, vera (viewer)."""
    tokens = {Role.OWNER: token_for(team_setup["alice"], team_setup["team_a"]),
              Role.VIEWER: token_for(team_setup["vera"], team_setup["team_a"])}
    for role in (Role.ADMIN, Role.MEMBER):
        user = user_create(f"api-{role}", "pw-role-123")
        membership_add(team=team_setup["team_a"], user=user, role=role)
        tokens[role] = token_for(user, team_setup["team_a"])
    return tokens


def bearer(raw):
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


API = "/api/v1"


def call(client, method, path, raw=None, body=None, **extra):
    kwargs = {"content_type": "application/json", "data": json.dumps(body)} if body is not None else {}
    headers = bearer(raw) if raw else {}
    return getattr(client, method)(API + path, **kwargs, **headers, **extra)


@pytest.fixture
def owner_token(team_setup):
    return token_for(team_setup["alice"], team_setup["team_a"])
