"""Schemathesis against the API's served OpenAPI schema: for every operation, a few generated requests (valid and
invalid) with a token of each role. Every answer must be no 500, carry a status code and content type the schema
declares and match its response schema, and a role below the page's is refused (403) whatever the request says.

Bounded on purpose (EXAMPLES per operation, no example database, derandomized), so it runs in a minute or two. The
Test button (`POST /channels/{id}/test`) is left out: it calls the channel's upstream, and generated URLs would send
traffic to hosts outside this machine; the role matrix in tests/system/test_permissions.py covers it."""
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from panel.accounts.models import ROLE_RANK, Role
from panel.channels.services import channel_create, route_save
from panel.wsgi import application
from tests.support.api_helpers import role_tokens
from tests.support.url_gates import API_OPERATIONS

EXAMPLES = 4
LEFT_OUT = {("POST", "/api/v1/channels/{channel_id}/test")}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def operation_roles():
    return {(method, path): gate.role for method, path, gate in API_OPERATIONS}


@pytest.fixture
def in_process():
    """The WSGI app in the test's thread and transaction: like Django's test client, keep the test's database
    connection open across requests."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(team_setup, in_process):
    """A channel and a route in team A, so some generated ids (small ones) find real objects."""
    channel = channel_create(team=team_setup["team_a"], name="stable", kind="remote",
                             base_url="http://127.0.0.1:9/v1", model_id="m", credential_kind="none")
    route_save(team=team_setup["team_a"], model_name="chat", entries=[(channel, 0, 1)])
    return team_setup


@pytest.mark.slow  # 64 s: generated requests for every operation and role
def test_every_operation_answers_by_its_schema_and_the_pages_roles(seeded, django_user_model):
    tokens = role_tokens(seeded, django_user_model)
    roles = operation_roles()
    # The schema is for members (panel/api/auth.py reference_gate): fetched with the viewer's token.
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application,
                                            headers={"Authorization": f"Bearer {tokens[Role.VIEWER]}"})
    ran, problems, calls = 0, [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        key = (operation.method.upper(), operation.path)
        if key in LEFT_OUT:
            continue
        needed = roles[key]

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def exercise(case):
            for role, raw in tokens.items():
                response = case.call(headers={"Authorization": f"Bearer {raw}"})
                calls.append((key, role, response.status_code))
                case.validate_response(response, checks=CHECKS)
                if ROLE_RANK[role] < ROLE_RANK[needed]:
                    assert response.status_code == 403, (key, role, response.status_code)

        try:
            exercise()
        except Exception as error:  # collect every operation's failure, then report them all
            problems.append(f"{key}: {str(error)[:1500]}")
        ran += 1
    assert ran >= 40 and len(calls) >= ran * len(tokens) * 2
    answered = {status for _, _, status in calls}
    assert {200, 400, 403, 404} <= answered, answered  # it reached the services, not only the gate
    assert problems == [], "\n\n".join(problems)
