"""The OpenTelemetry settings refuse bad values with one line naming the variable; only an owner lets the team's
prompts and answers into its traces, on the Members page, and the change is audited."""
import subprocess
import sys

import pytest
from django.urls import reverse

from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.audit.models import AuditAction, AuditEvent
from panel.env import EnvError, envpairs
from tests.support.environment import ROOT, panel_env
from tests.support.teams import user_create


@pytest.mark.parametrize("changes, words", [
    ({"TOKENWISE_OTEL_ENDPOINT": "collector:4318"}, "is not an http:// or https:// URL"),
    ({"TOKENWISE_OTEL_HEADERS": "api-key"}, "'api-key' is not name=value"),
    ({"TOKENWISE_OTEL_EXPORT_INTERVAL_MS": "often"}, "is not a whole number"),
    ({"TOKENWISE_OTEL_EXPORT_INTERVAL_MS": "10"}, "out of range"),
])
def test_it_stops_on_a_bad_setting_with_one_line_naming_it(changes, words):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=panel_env(**changes),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert next(iter(changes)) in line and words in line


def test_it_reads_headers_as_the_otlp_exporters_do(monkeypatch):
    monkeypatch.setenv("TOKENWISE_OTEL_HEADERS", "api-key=a%3Db, x-team = blue ,")
    assert envpairs("TOKENWISE_OTEL_HEADERS") == {"api-key": "a=b", "x-team": "blue"}
    monkeypatch.setenv("TOKENWISE_OTEL_HEADERS", "=value")
    with pytest.raises(EnvError):
        envpairs("TOKENWISE_OTEL_HEADERS")


def test_only_an_owner_lets_prompts_into_traces(team_setup, client):
    team = team_setup["team_a"]
    admin = user_create("trace-admin", "pw-admin-123")
    membership_add(team=team, user=admin, role=Role.ADMIN)
    client.force_login(admin)
    page = client.get(reverse("members")).content.decode()
    assert "never prompt or answer text" in page and 'name="trace_prompts"' not in page
    assert client.post(reverse("team_trace_prompts"), {"trace_prompts": "on"}).status_code == 403
    team.refresh_from_db()
    assert team.trace_prompts is False

    client.force_login(team_setup["alice"])
    page = client.get(reverse("members")).content.decode()
    assert 'name="trace_prompts"' in page and "sends no traces now" in page
    assert client.post(reverse("team_trace_prompts"), {"trace_prompts": "on"}).status_code == 302
    team.refresh_from_db()
    assert team.trace_prompts is True
    assert AuditEvent.objects.filter(action=AuditAction.SETTING_CHANGED, target="prompts and answers in traces",
                                     ).exists()
    assert client.post(reverse("team_trace_prompts"), {}).status_code == 302  # the box left empty: off
    team.refresh_from_db()
    assert team.trace_prompts is False
