"""The channel Test button against a small OpenAI-compatible server started in the test (http.server in a thread),
which answers, refuses keys, lacks models, stalls or breaks on demand; plus a closed port and a name that does not
resolve. Each failure must come back as a diagnosis in words."""
import json
import socket
import time

import httpx
import pytest

from panel.channels.diagnosis import describe_upstream_error, diagnose
from panel.channels.models import Channel, ChannelKind, CredentialKind
from panel.channels.services import channel_create, channel_test
from tests.support.credential_env import bind_credential_env
from tests.support.fake_provider import GOOD_KEY, FakeProvider


@pytest.fixture
def provider():
    fake = FakeProvider()
    yield fake
    fake.close()


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make(team, base_url, **changes):
    fields = dict(name="fake", kind=ChannelKind.REMOTE, base_url=base_url, model_id="qwen2.5-7b-instruct",
                  credential_kind=CredentialKind.STORED, timeout_seconds=5)
    fields.update(changes)
    api_key = fields.pop("api_key", GOOD_KEY if fields["credential_kind"] == CredentialKind.STORED else "")
    return channel_create(team=team, api_key=api_key, **fields)


def test_it_passes_against_a_working_server_and_records_the_result(team_setup, provider):
    channel = make(team_setup["team_a"], provider.url + "/v1")
    result = channel_test(channel)
    assert result["ok"] and result["diagnosis"] == ""
    assert [(step["name"], step["status"], step["ok"]) for step in result["steps"]] == [
        ("GET /models", 200, True), ("chat completion (max_tokens 1)", 200, True)]
    assert all(step["latency_ms"] > 0 for step in result["steps"])
    assert result["models"] == provider.models and "lists 2 models" in result["steps"][0]["detail"]
    # The server got the decrypted key, and a one-token request to the channel's model.
    (_, path1, auth1, _), (_, path2, auth2, body) = provider.seen
    assert (path1, path2) == ("/v1/models", "/v1/chat/completions") and auth1 == auth2 == f"Bearer {GOOD_KEY}"
    assert body["max_tokens"] == 1 and body["model"] == "qwen2.5-7b-instruct"
    stored = Channel.objects.get(pk=channel.pk)
    assert stored.last_test["ok"] is True and stored.last_tested_at is not None and stored.test_ok


def test_a_refused_key_is_a_401_diagnosis_and_the_chat_is_not_tried(team_setup, provider):
    channel = make(team_setup["team_a"], provider.url + "/v1", api_key="sk-wrong-key-00000000")
    result = channel_test(channel)
    assert not result["ok"] and result["kind"] == "unauthorized"
    assert "401" in result["diagnosis"] and "missing, wrong or revoked" in result["diagnosis"]
    assert "sk-wrong-key-00000000" not in json.dumps(result)  # the echoed key is redacted
    assert len(provider.seen) == 1 and len(result["steps"]) == 1
    assert Channel.objects.get(pk=channel.pk).last_test["kind"] == "unauthorized"


def test_a_model_the_server_does_not_serve_is_a_404_listing_what_it_serves(team_setup, provider):
    channel = make(team_setup["team_a"], provider.url + "/v1", model_id="qwen2.5-14b-instruct")
    result = channel_test(channel)
    assert result["kind"] == "not_found_model" and result["steps"][1]["status"] == 404
    assert "'qwen2.5-14b-instruct' is not served" in result["diagnosis"]
    assert "qwen2.5-7b-instruct, tiny" in result["diagnosis"]
    assert any("not among the models" in note for note in result["notes"])


def test_a_base_url_without_v1_is_a_404_on_the_path(team_setup, provider):
    channel = make(team_setup["team_a"], provider.url)
    assert any("has no /v1" in warning for warning in channel.warnings)
    result = channel_test(channel)
    assert result["kind"] == "not_found_path" and [step["status"] for step in result["steps"]] == [404, 404]
    assert "path is wrong" in result["diagnosis"] and "/v1" in result["diagnosis"]


def test_a_server_without_a_models_listing_passes_on_the_chat(team_setup, provider):
    provider.behaviour = "no_models"
    result = channel_test(make(team_setup["team_a"], provider.url + "/v1"))
    assert result["ok"] and any("does not list models" in note for note in result["notes"])


def test_a_slow_server_is_a_timeout_that_names_timeout_seconds(team_setup, provider):
    provider.behaviour, provider.delay = "slow", 3.0
    channel = make(team_setup["team_a"], provider.url + "/v1", timeout_seconds=0.5)
    started = time.monotonic()
    result = channel_test(channel)
    assert time.monotonic() - started < 2.5
    assert result["kind"] == "read_timeout" and result["steps"][0]["status"] is None
    assert "within 0.5 s" in result["diagnosis"] and "raise timeout_seconds" in result["diagnosis"]


def test_the_test_waits_at_most_the_cap_even_with_a_long_channel_timeout(team_setup, provider):
    provider.behaviour, provider.delay = "slow", 3.0
    channel = make(team_setup["team_a"], provider.url + "/v1", timeout_seconds=600)
    result = channel_test(channel, timeout_cap=0.5)
    assert result["timeout_seconds"] == 0.5 and result["kind"] == "read_timeout"


def test_a_closed_port_is_connection_refused(team_setup):
    port = closed_port()
    result = channel_test(make(team_setup["team_a"], f"http://127.0.0.1:{port}/v1"))
    assert result["kind"] == "connection_refused"
    assert f"Connection refused at 127.0.0.1:{port}" in result["diagnosis"]
    assert "server is down or the port is wrong" in result["diagnosis"]


def test_a_host_that_does_not_resolve_is_a_dns_failure(team_setup):
    result = channel_test(make(team_setup["team_a"], "http://no-such-host.invalid/v1", timeout_seconds=3))
    assert result["kind"] == "dns" and "no-such-host.invalid does not resolve" in result["diagnosis"]


@pytest.mark.parametrize("behaviour, kind, words", [
    ("429", "rate_limited", "raise max_retries and retry_backoff"),
    ("500", "server_error", "500 from the server"),
    ("html", "not_json", "not with JSON"),
    ("no_choices", "no_choices", "KeyError: choices"),
])
def test_other_failures_have_their_own_diagnosis(team_setup, provider, behaviour, kind, words):
    provider.behaviour = behaviour
    result = channel_test(make(team_setup["team_a"], provider.url + "/v1"))
    assert not result["ok"] and result["kind"] == kind and words in result["diagnosis"]


def test_a_credential_that_cannot_be_produced_sends_nothing(team_setup, provider, monkeypatch):
    monkeypatch.delenv("TOKENWISE_UPSTREAM_FAKE_PROVIDER", raising=False)
    bind_credential_env(monkeypatch, "TOKENWISE_UPSTREAM_FAKE_PROVIDER", provider.url)
    channel = make(team_setup["team_a"], provider.url + "/v1", credential_kind=CredentialKind.ENV,
                   credential_env="TOKENWISE_UPSTREAM_FAKE_PROVIDER")
    result = channel_test(channel)
    assert result["kind"] == "credential" and "No request was sent" in result["diagnosis"]
    assert "TOKENWISE_UPSTREAM_FAKE_PROVIDER is not set" in result["diagnosis"] and provider.seen == []
    monkeypatch.setenv("TOKENWISE_UPSTREAM_FAKE_PROVIDER", GOOD_KEY)
    assert channel_test(channel)["ok"]
    assert Channel.objects.get(pk=channel.pk).misconfigured == ""


def test_a_local_channel_sends_the_empty_key(team_setup, provider):
    provider.key = "EMPTY"
    channel = make(team_setup["team_a"], provider.url + "/v1", kind=ChannelKind.LOCAL,
                   credential_kind=CredentialKind.NONE, model_id="tiny")
    assert channel_test(channel)["ok"] and provider.seen[0][2] == "Bearer EMPTY"


# ------------------------------------------------------------------------------------------------ the word table

def test_describe_upstream_error_for_statuses_and_exceptions():
    assert "missing, wrong or revoked" in describe_upstream_error(status=401)
    assert "\"Bearer Bearer" in describe_upstream_error(status=401, key="Bearersk-abc")
    assert "Forbidden" in describe_upstream_error(status=403)
    assert "quota" in describe_upstream_error(status=429)
    assert "503 from the server" in describe_upstream_error(status=503, body=b"<html>")
    assert "path is wrong" in describe_upstream_error(status=404, step="models")
    said = describe_upstream_error(status=404, body='{"message": "The model `x` does not exist."}')
    assert "not served" in said and "The server said: The model `x` does not exist." in said
    assert "sk-••••" in describe_upstream_error(status=401,
                                                body='{"error": {"message": "bad key sk-abcdefghijklmnop"}}')
    request = httpx.Request("GET", "http://127.0.0.1:9/v1/models")
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    assert "Connection refused" in describe_upstream_error(exception=refused, url="http://127.0.0.1:9/v1")
    assert diagnose(exception=httpx.ReadTimeout("timed out", request=request), timeout=7).kind == "read_timeout"
    assert diagnose(exception=httpx.ConnectTimeout("timed out", request=request)).kind == "connect_timeout"
    assert diagnose(exception=httpx.RemoteProtocolError("Server disconnected")).kind == "protocol"
    try:
        try:
            socket.getaddrinfo("no-such-host.invalid", 80)
        except socket.gaierror as error:
            raise httpx.ConnectError(str(error), request=request) from error
    except httpx.ConnectError as error:
        assert diagnose(exception=error).kind == "dns"
