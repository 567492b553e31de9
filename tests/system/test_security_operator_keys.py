"""Attack tests: an operator's upstream key (a channel credential read from an environment variable) goes only to the
origins the operator bound it to in TOKENWISE_CREDENTIAL_ENV_BINDINGS, and only for the teams named there. A team
admin who names the variable and points the base URL at their own server is refused at save (page, API), at
settings.json import and on a base-URL edit; a row forced into the database is never called, by the gateway or the
Test button."""
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.models import Channel, ChannelKind, CredentialError, CredentialKind, Route, RouteChannel
from panel.channels.services import channel_create, channel_test
from panel.channels.settings_json import settings_import
from panel.env import EnvError, envbindings
from tests.support.api_helpers import bearer, token_for
from tests.support.credential_env import bind_credential_env
from tests.support.environment import ROOT, panel_env
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer

VARIABLE = "TOKENWISE_UPSTREAM_OPENAI"
OPERATOR_KEY = "sk-operator-openai-key-0042"
PROVIDER = "https://api.openai.com/v1"
ATTACKER = "https://attacker.example/v1"


@pytest.fixture
def operator(team_setup, django_user_model, monkeypatch):
    """The operator's key in the environment, bound to the provider; `adam`, an admin of team A, is the attacker."""
    monkeypatch.setenv(VARIABLE, OPERATOR_KEY)
    bind_credential_env(monkeypatch, VARIABLE, PROVIDER)
    adam = django_user_model.objects.create_user("adam", password="pw-adam-123")
    membership_add(team=team_setup["team_a"], user=adam, role=Role.ADMIN)
    return {"adam": adam, **team_setup}


def form_data(**changes):
    data = {"name": "exfil", "kind": "remote", "deployment": "", "base_url": ATTACKER, "model_id": "gpt-4o",
            "enabled": "on", "credential_kind": "env", "api_key": "", "credential_env": VARIABLE,
            "timeout_seconds": 120, "max_retries": 3, "retry_backoff": 1.5, "priority": 100, "weight": 1,
            "price_input_per_million": "0.5", "price_output_per_million": "1.5", "price_cached_per_million": "0.1"}
    data.update(changes)
    return data


def api_body(**changes):
    body = {key: value for key, value in form_data(**changes).items() if key not in ("deployment", "enabled")}
    return json.dumps(body)


def provider_channel(team, **changes):
    fields = dict(name="openai", kind=ChannelKind.REMOTE, base_url=PROVIDER, model_id="gpt-4o",
                  credential_kind=CredentialKind.ENV, credential_env=VARIABLE)
    fields.update(changes)
    return channel_create(team=team, **fields)


# ------------------------------------------------------------------------------------------------ at save

def test_the_form_refuses_the_operators_key_for_a_team_admins_server(client, operator):
    client.force_login(operator["adam"])
    response = client.post(reverse("channel_create"), form_data())
    page = response.content.decode()
    assert response.status_code == 400 and "be sent only to https://api.openai.com" in page
    assert not Channel.objects.exists()


def test_the_api_refuses_the_operators_key_for_a_team_admins_server(client, operator):
    raw = token_for(operator["adam"], operator["team_a"])
    answer = client.post("/api/v1/channels", data=api_body(), content_type="application/json", **bearer(raw))
    assert answer.status_code == 400, answer.content
    assert "https://api.openai.com" in answer.json()["errors"]["base_url"][0]
    assert not Channel.objects.exists()


@pytest.mark.parametrize("document", [
    {"channels": {"exfil": {"base_url": ATTACKER, "api_key": "${" + VARIABLE + "}", "model_id": "gpt-4o"}},
     "default_channel": "exfil"},
    {"provider": "exfil", "base_url": "https://attacker.example", "api_key_env": VARIABLE, "default_model": "gpt-4o",
     "endpoints": {"cloud_fallback": ATTACKER}},
])
def test_settings_json_cannot_send_the_operators_key_elsewhere(client, operator, document):
    client.force_login(operator["adam"])
    response = client.post(reverse("settings_import"), {"text": json.dumps(document)})
    assert response.status_code == 400 and "be sent only to https://api.openai.com" in response.content.decode()
    assert not Channel.objects.exists() and not Route.objects.exists()


def test_an_import_that_replaces_a_bound_channel_cannot_move_it(operator):
    channel = provider_channel(operator["team_a"])
    document = {"channels": {"openai": {"base_url": ATTACKER, "api_key": "${" + VARIABLE + "}", "model_id": "gpt-4o"}},
                "default_channel": "openai"}
    with pytest.raises(ValidationError) as caught:
        settings_import(team=operator["team_a"], text=json.dumps(document), replace=True)
    assert any(message.startswith("$.channels.openai.base_url: The operator lets") for message in caught.value.messages)
    assert Channel.objects.get(pk=channel.pk).base_url == PROVIDER


def test_a_base_url_edit_cannot_move_the_operators_key(client, operator):
    channel = provider_channel(operator["team_a"])
    client.force_login(operator["adam"])
    response = client.post(reverse("channel_edit", args=[channel.pk]), form_data(name="openai"))
    assert response.status_code == 400 and "be sent only to https://api.openai.com" in response.content.decode()
    raw = token_for(operator["adam"], operator["team_a"])
    for body in ({"base_url": ATTACKER}, {"base_url": "https://api.openai.com.attacker.example/v1"},
                 {"base_url": "http://api.openai.com/v1"}, {"base_url": "https://api.openai.com:8443/v1"}):
        answer = client.patch(f"/api/v1/channels/{channel.pk}", data=json.dumps(body),
                              content_type="application/json", **bearer(raw))
        assert answer.status_code == 400 and "base_url" in answer.json()["errors"], (body, answer.content)
    assert Channel.objects.get(pk=channel.pk).base_url == PROVIDER
    # Another path at the bound origin is the provider's business.
    answer = client.patch(f"/api/v1/channels/{channel.pk}", data=json.dumps({"base_url": "https://api.openai.com/v2"}),
                          content_type="application/json", **bearer(raw))
    assert answer.status_code == 200, answer.content


def test_switching_a_channel_at_the_attackers_server_to_the_operators_key_is_refused(client, operator):
    channel = channel_create(team=operator["team_a"], name="mine", kind=ChannelKind.REMOTE, base_url=ATTACKER,
                             model_id="gpt-4o", credential_kind=CredentialKind.STORED, api_key="sk-adams-own-key-1")
    raw = token_for(operator["adam"], operator["team_a"])
    answer = client.patch(f"/api/v1/channels/{channel.pk}", content_type="application/json", **bearer(raw),
                          data=json.dumps({"credential_kind": "env", "credential_env": VARIABLE}))
    assert answer.status_code == 400, answer.content
    assert Channel.objects.get(pk=channel.pk).credential_kind == CredentialKind.STORED


def test_a_key_bound_to_other_teams_is_refused_to_this_one(operator, monkeypatch):
    bind_credential_env(monkeypatch, VARIABLE, PROVIDER, teams=[operator["team_b"].slug])
    with pytest.raises(ValidationError) as caught:
        provider_channel(operator["team_a"])
    assert "the operator's key for other teams" in caught.value.message_dict["credential_env"][0]
    assert provider_channel(operator["team_b"]).api_key() == OPERATOR_KEY


# ------------------------------------------------------------------------------------------------ rows already saved

def forced_channel(team, base_url, variable=VARIABLE, name="exfil"):
    """A row as an older installation, or a write that bypassed the checks, left it."""
    return Channel.objects.create(team=team, name=name, kind=ChannelKind.REMOTE, base_url=base_url, model_id="m",
                                  credential_kind=CredentialKind.ENV, credential_env=variable, max_retries=0,
                                  timeout_seconds=5)


def test_the_test_button_sends_nothing_to_an_unbound_origin(client, operator):
    with FakeUpstream(models=("m",)) as attacker:
        channel = forced_channel(operator["team_a"], attacker.base_url)
        with pytest.raises(CredentialError, match="only to https://api.openai.com"):
            channel.api_key()
        result = channel_test(channel)
        assert not result["ok"] and "No request was sent" in result["diagnosis"]
        assert attacker.requests == []


def test_a_channel_saved_before_the_bindings_is_misconfigured_with_what_to_set(client, operator, monkeypatch):
    monkeypatch.setenv("TOKENWISE_UPSTREAM_LEGACY", "sk-legacy-key-000001")
    with FakeUpstream(models=("m",)) as upstream:
        channel = forced_channel(operator["team_a"], upstream.base_url, variable="TOKENWISE_UPSTREAM_LEGACY")
        client.force_login(operator["alice"])
        page = client.get(reverse("channel_detail", args=[channel.pk])).content.decode()
        assert "Misconfigured:" in page and "TOKENWISE_CREDENTIAL_ENV_BINDINGS" in page
        assert "TOKENWISE_UPSTREAM_LEGACY=https://" in page  # what the operator sets, as an example
        assert not channel_test(channel)["ok"] and upstream.requests == []


def gateway_route(team, model_name, channel):
    route = Route.objects.create(team=team, model_name=model_name, strategy="priority")
    RouteChannel.objects.create(route=route, channel=channel, position=0)


def ask(gateway, raw, model):
    return httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                      headers={"Authorization": f"Bearer {raw}"})


def test_the_gateway_never_sends_the_operators_key_to_an_unbound_origin(transactional_db, team_setup):
    from django.db import connection

    with FakeUpstream(models=("m",)) as provider, FakeUpstream(models=("m",)) as attacker:
        team = team_setup["team_a"]
        gateway_route(team, "good", forced_channel(team, provider.base_url, name="provider"))
        gateway_route(team, "m", forced_channel(team, attacker.base_url))  # the same host, another port
        bindings = f"{VARIABLE}=https://api.openai.com,{provider.base_url.removesuffix('/v1')}"
        server = GatewayServer(connection.settings_dict["NAME"], **{VARIABLE: OPERATOR_KEY},
                               TOKENWISE_CREDENTIAL_ENV_BINDINGS=bindings)
        try:
            _, raw = key_issue(team=team, user=team_setup["alice"], name="app")
            assert ask(server, raw, "good").status_code == 200  # the bound origin gets the key
            assert provider.requests[-1].headers["authorization"] == f"Bearer {OPERATOR_KEY}"
            answer = ask(server, raw, "m")
            assert answer.status_code >= 500 and OPERATOR_KEY not in answer.text, answer.text
            assert "only to" in answer.text
        finally:
            server.stop()
        assert attacker.requests == []
        assert OPERATOR_KEY not in server.log()


class Redirector:
    """The bound origin answering every request with a 307 to another server (an open redirect at the provider)."""

    def __init__(self, location):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.send_response(307)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_gateway_does_not_follow_a_redirect_away_from_the_bound_origin(transactional_db, team_setup):
    from django.db import connection

    with FakeUpstream(models=("m",)) as attacker:
        redirector = Redirector(attacker.base_url + "/messages")
        try:
            team = team_setup["team_a"]
            channel = forced_channel(team, redirector.base_url)
            Channel.objects.filter(pk=channel.pk).update(apis="messages")  # the key rides in x-api-key
            gateway_route(team, "m", channel)
            server = GatewayServer(connection.settings_dict["NAME"], **{VARIABLE: OPERATOR_KEY},
                                   TOKENWISE_CREDENTIAL_ENV_BINDINGS=f"{VARIABLE}={redirector.base_url[:-3]}")
            try:
                _, raw = key_issue(team=team, user=team_setup["alice"], name="app")
                answer = httpx.post(f"{server.url}/v1/messages", timeout=30, headers={"x-api-key": raw},
                                    json={"model": "m", "max_tokens": 4, "messages": [{"role": "user",
                                                                                        "content": "hi"}]})
                assert answer.status_code >= 400 and OPERATOR_KEY not in answer.text, answer.text
            finally:
                server.stop()
        finally:
            redirector.close()
        assert attacker.requests == []


# ------------------------------------------------------------------------------------------------ the setting

def test_the_setting_reads_origins_and_teams(monkeypatch):
    monkeypatch.setenv("TW_TEST_BINDINGS", " A_KEY=https://API.example.com ; B_KEY=http://10.0.0.7:8001,"
                                           "https://b.example.com:443/@team-a|team_b ")
    bindings = envbindings("TW_TEST_BINDINGS", "")
    assert bindings["A_KEY"].origins == {"https://api.example.com:443"} and not bindings["A_KEY"].teams
    assert bindings["B_KEY"].origins == {"http://10.0.0.7:8001", "https://b.example.com:443"}
    assert bindings["B_KEY"].teams == {"team-a", "team_b"}


@pytest.mark.parametrize("value, words", [
    ("A_KEY", "is not VARIABLE=https://host[:port]"),
    ("A_KEY=https://api.example.com/v1", "is not an origin"),
    ("A_KEY=ftp://api.example.com", "is not an origin"),
    ("A_KEY=https://x.example;A_KEY=https://y.example", "bound twice"),
    ("A_KEY=https://x.example@", "is not a team's slug"),
    ("DJANGO_SECRET=https://x.example", "panel's own configuration"),
])
def test_a_malformed_setting_names_itself(monkeypatch, value, words):
    monkeypatch.setenv("TW_TEST_BINDINGS", value)
    with pytest.raises(EnvError, match="TW_TEST_BINDINGS") as caught:
        envbindings("TW_TEST_BINDINGS", "")
    assert words in str(caught.value)


@pytest.mark.parametrize("value", ["TAOTOKEN_API_KEY=taotoken.net", "SECRET_KEY=https://attacker.example"])
def test_the_panel_does_not_start_with_a_bad_binding(value):
    run = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=panel_env(TOKENWISE_CREDENTIAL_ENV_BINDINGS=value))
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenwise: configuration error: TOKENWISE_CREDENTIAL_ENV_BINDINGS")
