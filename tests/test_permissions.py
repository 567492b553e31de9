"""Every page and endpoint goes through the team/role gate (panel.accounts.decorators.team_view), so a new view
without a check fails here. Then, for every gated URL: anonymous users are sent to sign in, and a role below the
one a view needs gets 403, for every method the view takes."""
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from panel.accounts.models import ROLE_RANK, Role
from panel.accounts.services import membership_add

# Views that are not team-scoped, on purpose, each with its reason.
PUBLIC = {
    "login": "signing in",
    "logout": "signing out",
    "switch_team": "login_required; checks membership itself (404 for a team the user is not in)",
    "no_team": "login_required; for users in no team",
    "metrics": "Prometheus scrapes it without a session: bearer TOKENWISE_METRICS_TOKEN when set, else private network",
    "account_setup": "an invited person's one-time set-password link (they have no password to sign in with yet)",
}


def gated_patterns():
    """(name, pattern, view) for every named URL of the panel outside the Django admin."""
    found = []

    def walk(patterns, prefix=""):
        for entry in patterns:
            if isinstance(entry, URLResolver):
                if entry.app_name == "admin":
                    continue
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern) and entry.name:
                found.append((entry.name, prefix + str(entry.pattern), entry.callback))

    walk(get_resolver().url_patterns)
    return found


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
def test_it_enforces_the_role_each_view_needs(client, team_setup, django_user_model, name, pattern, view):
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
        user = django_user_model.objects.create_user(f"{role}-{name}"[:150], password="pw-role-123")
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
