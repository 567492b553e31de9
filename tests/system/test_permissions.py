"""Every page and endpoint goes through the team/role gate (panel.accounts.decorators.team_view), so a new view
without a check fails here. Then, for every gated URL: anonymous users are sent to sign in, and a role below the
one a view needs gets 403, for every method the view takes."""
import re

import pytest
from django.urls import reverse

from panel.accounts.models import ROLE_RANK, Role
from panel.accounts.services import membership_add
from tests.support.teams import user_create
from tests.support.url_gates import API_OPERATIONS, PUBLIC, gated_patterns

# Views that are not team-scoped, on purpose, each with its reason.

def url_for(name, pattern):
    arguments = re.findall(r"<(?:(\w+):)?(\w+)>", pattern)
    values = {key: ("toml" if key == "kind" else 999999) for _, key in arguments}
    return reverse(name, kwargs=values) if values else reverse(name)


def required_role(view):
    view = getattr(view, "view_class", view)
    while view is not None:
        if hasattr(view, "required_role"):
            return view.required_role
        view = getattr(view, "__wrapped__", None)
    return None


PATTERNS = gated_patterns()


def test_it_gates_every_view_or_says_why_not():
    ungated = [name for name, _, view in PATTERNS if required_role(view) is None and name not in PUBLIC]
    assert ungated == [], f"views without team_view(...) and not in PUBLIC: {ungated}"
    assert len(PATTERNS) > 30


@pytest.mark.parametrize("name, pattern, view", [p for p in PATTERNS if p[0] not in PUBLIC],
                         ids=[p[0] for p in PATTERNS if p[0] not in PUBLIC])
def test_it_enforces_the_role_each_view_needs(client, team_setup, name, pattern, view):
    url = url_for(name, pattern)
    needed = required_role(view)
    served = []
    for method in (client.get, client.post):
        client.logout()
        response = method(url)
        if response.status_code == 405:  # this view does not take that method at all
            continue
        served.append(method.__name__)
        assert response.status_code == 302 and "/login/" in response["Location"], (name, method)
    assert served, name
    users = {Role.OWNER: team_setup["alice"], Role.VIEWER: team_setup["vera"]}
    for role in (Role.MEMBER, Role.ADMIN):
        user = user_create(f"{role}-{name}"[:150], "pw-role-123")
        membership_add(team=team_setup["team_a"], user=user, role=role)
        users[role] = user
    for role, user in users.items():
        client.force_login(user)
        for method in (client.get, client.post):
            if method.__name__ not in served:
                continue
            status = method(url).status_code
            if ROLE_RANK[role] < ROLE_RANK[needed]:
                assert status == 403, (name, role, method.__name__, status)
            else:
                assert status != 403, (name, role, method.__name__, status)


# ------------------------------------------------------------------------------------------------- the API


def api_url(path):
    return re.sub(r"\{(\w+)\}", lambda match: "toml" if match.group(1) == "kind" else "999999", path)


def test_every_api_operation_declares_the_role_of_its_page():
    assert len(API_OPERATIONS) > 40
    missing = [f"{method} {path}" for method, path, gate in API_OPERATIONS if gate is None]
    assert missing == []
    page_roles = {name: required_role(view) for name, _, view in PATTERNS if name not in PUBLIC}
    # Spot checks that the API reads the pages' rules: keys issued by members (their own, where the team lets
    # them: the service decides), benchmarks by members, the audit log by admins, dashboards by everyone.
    roles = {(method, path): gate.role for method, path, gate in API_OPERATIONS}
    assert roles[("POST", "/api/v1/keys")] == page_roles["key_create"] == Role.MEMBER
    assert roles[("POST", "/api/v1/benchmarks")] == page_roles["benchmark_create"] == Role.MEMBER
    assert roles[("GET", "/api/v1/audit")] == page_roles["audit"] == Role.ADMIN
    assert roles[("GET", "/api/v1/usage")] == page_roles["dashboards_csv"] == Role.VIEWER


@pytest.mark.parametrize("method, path, gate", API_OPERATIONS, ids=[f"{m} {p}" for m, p, _ in API_OPERATIONS])
def test_it_enforces_the_pages_role_on_every_api_operation(client, team_setup, django_user_model, method, path,
                                                           gate):
    from tests.support.api_helpers import bearer, role_tokens

    url, needed = api_url(path), gate.role
    anonymous = client.generic(method, url, "{}", content_type="application/json")
    assert anonymous.status_code == 401, (method, path)
    for role, raw in role_tokens(team_setup, django_user_model).items():
        status = client.generic(method, url, "{}", content_type="application/json", **bearer(raw)).status_code
        if ROLE_RANK[role] < ROLE_RANK[needed] or gate.refusal:
            assert status == 403, (method, path, role, status)
        else:
            assert status != 403 and status < 500, (method, path, role, status)
