"""The roles table (panel/accounts/roles.py) is the one place roles are decided: every page view behind team_view and
every API operation names an action in it, every action in it is named by one of them, and a page and an API
operation that do the same thing share one action. tests/system/test_permissions.py then checks that the role of
each action is what a request gets."""
import pytest

from panel.accounts.decorators import team_view
from panel.accounts.roles import ACTIONS
from panel.api.auth import gate
from panel.api.urls import api
from tests.support.url_gates import API_OPERATIONS, PUBLIC, gated_patterns


def page_action(view):
    while view is not None:
        if hasattr(view, "action"):
            return view.action
        view = getattr(view, "__wrapped__", None)
    return None


PAGES = {name: page_action(view) for name, _, view in gated_patterns() if name not in PUBLIC}
OPERATIONS = {(method, path): token_auth.action if token_auth else None for method, path, token_auth in API_OPERATIONS}


def test_every_page_view_names_an_action_of_the_table():
    assert len(PAGES) > 100
    assert {name: action for name, action in PAGES.items() if action not in ACTIONS} == {}


def test_every_api_operation_names_an_action_of_the_table():
    assert len(OPERATIONS) > 40
    assert {key: action for key, action in OPERATIONS.items() if action not in ACTIONS} == {}


def test_every_operation_served_is_behind_its_gate():
    """As served (the OpenAPI schema is built from the operations bound to the API): a token or the session, never
    the API's default, which lets nobody in."""
    schema = api.get_openapi_schema()
    security = {f"{method.upper()} {path}": operation.get("security")
                for path, methods in schema["paths"].items() for method, operation in methods.items()}
    assert len(security) == len(OPERATIONS)
    gated = [{"AccessTokenAuth": []}, {"BrowserSession": []}]
    assert {key: found for key, found in security.items() if found != gated} == {}


def test_every_action_in_the_table_is_used():
    used = set(PAGES.values()) | set(OPERATIONS.values())
    assert sorted(set(ACTIONS) - used) == []


def test_a_page_and_the_api_doing_the_same_thing_share_an_action():
    assert PAGES["model_create"] == OPERATIONS[("POST", "/api/v1/models")] == "models.register"
    assert PAGES["key_create"] == OPERATIONS[("POST", "/api/v1/keys")] == "keys.issue_own"
    assert PAGES["member_keys"] == "keys.manage"
    assert PAGES["profile_edit"] == OPERATIONS[("PATCH", "/api/v1/profiles/{profile_id}")] == "profiles.edit"
    assert PAGES["channel_edit"] == OPERATIONS[("PATCH", "/api/v1/channels/{channel_id}")] == "channels.edit"
    assert PAGES["token_create"] == OPERATIONS[("POST", "/api/v1/tokens")] == "tokens.create"
    assert PAGES["members"] == OPERATIONS[("DELETE", "/api/v1/members/{membership_id}")] == "members.manage"
    assert PAGES["webhooks"] == OPERATIONS[("GET", "/api/v1/webhooks")] == "webhooks.manage"


def test_an_unknown_action_is_refused_where_it_is_named():
    with pytest.raises(LookupError, match="models.regster"):
        team_view("models.regster")
    with pytest.raises(LookupError, match="models.regster"):
        gate("models.regster")
