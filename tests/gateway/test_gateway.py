"""The unified gateway against local fake upstreams that misbehave on demand: for each fault, what the client
sees, the attempts made, and exactly one usage record. Bad client input gets an OpenAI-style error."""
import json
import time
from datetime import timedelta
from decimal import Decimal

import httpx
import openai
import pytest
from django.utils import timezone

from panel.accounts.keys import key_issue, key_revoke
from panel.channels.models import Channel
from tests.support.fake_upstream import closed_port
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup, stream_events  # noqa: F401 (fixtures)
from tests.support.gateway_server import GatewayServer


def test_it_answers_through_the_local_channel_and_records_usage_and_cost(gateway, setup, primary, fallback):
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "chat" and body["choices"][0]["message"]["content"]
    sent = primary.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-primary-0000"  # decrypted, never the ciphertext
    assert sent.json["model"] == "up-model" and fallback.requests == []
    [row] = records()
    assert (row.outcome, row.status_code, row.attempts, row.fell_back) == ("ok", 200, 1, False)
    assert (row.team, row.key, row.route, row.channel) == (setup["team"], setup["key"], setup["route"], setup["local"])
    assert row.prompt_tokens == body["usage"]["prompt_tokens"] > 0
    assert row.completion_tokens == body["usage"]["completion_tokens"] > 0
    expected = (Decimal(row.prompt_tokens) * Decimal("0.10") + Decimal(row.completion_tokens) * Decimal("0.20")) / 10**6
    assert row.cost == expected
    assert row.ttft_ms is not None and row.latency_ms >= row.ttft_ms
    setup["key"].refresh_from_db()  # the key's "last used" (Gateway keys, My usage, the API)
    assert setup["key"].last_used_at is not None and setup["key"].last_used_at >= row.created_at


def test_it_streams_with_the_openai_sdk_and_asks_upstream_for_usage(gateway, setup, primary):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    chunks = list(client.chat.completions.create(model="chat", messages=CHAT["messages"], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and all(c.usage is None for c in chunks)  # the client did not ask for usage: none forwarded
    assert primary.requests[-1].json["stream_options"] == {"include_usage": True}
    with_usage = list(client.chat.completions.create(model="chat", messages=CHAT["messages"], stream=True,
                                                     stream_options={"include_usage": True}))
    assert with_usage[-1].usage.completion_tokens > 0
    rows = records(2)
    assert all(r.stream and r.outcome == "ok" and r.completion_tokens > 0 and r.ttft_ms > 0 for r in rows)
    models = client.models.list()
    assert [m.id for m in models.data] == ["chat"]


def test_it_works_with_the_async_sdk(gateway, setup):
    import asyncio

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
        plain = await client.chat.completions.create(model="chat", messages=CHAT["messages"])
        stream = await client.chat.completions.create(model="chat", messages=CHAT["messages"], stream=True)
        pieces = [chunk async for chunk in stream]
        completion = await client.completions.create(model="chat", prompt="say something", max_tokens=5)
        return plain, pieces, completion

    # In a thread of its own: the session's Chromium (Playwright's sync API) keeps an event loop set on this one.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        plain, pieces, completion = pool.submit(asyncio.run, run()).result()
    assert plain.choices[0].message.content and len(pieces) > 3 and completion.choices[0].text
    assert [r.endpoint for r in records(3)] == ["chat", "chat", "completions"]


@pytest.mark.parametrize("behaviour, options, stream", [
    ("status_500", {}, False), ("status_503", {}, True), ("malformed_json", {}, False),
    ("error_event", {}, True), ("hang_before_headers", {"delay": 5}, False),
    ("hang_after_headers", {"delay": 5}, True), ("cut_stream", {"after": 0}, True),
])
def test_it_falls_back_when_the_local_channel_fails_before_the_first_byte(gateway, setup, primary, fallback,
                                                                           behaviour, options, stream):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=0.5)
    primary.behave(behaviour, **options)
    body = dict(CHAT, stream=stream)
    response = post(gateway, setup["raw"], body)
    assert response.status_code == 200, response.text
    if stream:
        events = stream_events(response)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))
    else:
        assert response.json()["choices"][0]["message"]["content"]
    assert len(fallback.requests) == 1
    [row] = records()
    assert row.outcome == "ok" and row.fell_back and row.channel == setup["cloud"]
    if behaviour.startswith("hang"):  # a channel that stalls is not asked again: straight to the fallback
        assert row.attempts == 2 and [step["outcome"] for step in row.attempt_trail] == ["stalled", "ok"]
    else:  # two tries on the local channel (max_retries 1), then the fallback
        assert row.attempts == 3 and [step["channel"] for step in row.attempt_trail] == ["local", "local", "cloud"]


def test_it_retries_a_transient_error_on_the_same_channel(gateway, setup, primary, fallback):
    primary.behave("status_500", times=1)
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    [row] = records()
    assert (row.attempts, row.fell_back, row.channel) == (2, False, setup["local"])
    assert fallback.requests == []


def test_it_honours_retry_after_on_429(gateway, setup, primary):
    primary.behave("status_429", times=1, retry_after=1)
    started = time.monotonic()
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    assert time.monotonic() - started >= 0.9
    [row] = records()
    assert row.attempts == 2 and not row.fell_back


def test_it_falls_back_on_connection_refused(gateway, setup, fallback):
    Channel.objects.filter(pk=setup["local"].pk).update(base_url=f"http://127.0.0.1:{closed_port()}/v1")
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    [row] = records()
    assert row.fell_back and row.attempts == 3


def test_it_ends_a_stream_cut_after_the_first_byte_with_an_error_event(gateway, setup, primary, fallback):
    primary.behave("cut_stream", after=3)
    response = post(gateway, setup["raw"], dict(CHAT, stream=True))
    assert response.status_code == 200
    events = stream_events(response)
    assert events[-1]["error"]["code"] == "cut" and "[DONE]" not in events
    assert fallback.requests == []  # too late to fall back: the client already has bytes
    [row] = records()
    assert (row.outcome, row.error_kind, row.fell_back) == ("upstream_cut", "cut", False)
    assert row.channel == setup["local"]


def test_it_ends_a_stream_with_an_error_event_mid_way(gateway, setup, primary):
    primary.behave("error_event", after=3)
    events = stream_events(post(gateway, setup["raw"], dict(CHAT, stream=True)))
    assert events[-1]["error"]["code"] == "error_event"
    [row] = records()
    assert row.outcome == "error" and row.error_kind == "error_event"


def test_it_relays_a_slow_drip(gateway, setup, primary):
    primary.behave("slow_drip", delay=0.05)
    events = stream_events(post(gateway, setup["raw"], dict(CHAT, stream=True)))
    assert events[-1] == "[DONE]"
    [row] = records()
    assert row.outcome == "ok" and row.latency_ms > 500


def test_it_reports_a_clean_error_when_every_channel_fails(gateway, setup, primary, fallback):
    primary.behave("status_503")
    fallback.behave("status_503")
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"
    [row] = records()
    assert row.outcome == "error" and row.attempts == 4 and row.channel == setup["cloud"]  # the last one called
    assert [(step["channel"], step["status"]) for step in row.attempt_trail] == [
        ("local", 503), ("local", 503), ("cloud", 503), ("cloud", 503)]


def test_it_cools_down_a_failing_channel(gateway, setup, primary, fallback):
    Channel.objects.filter(pk=setup["local"].pk).update(base_url=f"http://127.0.0.1:{closed_port()}/v1",
                                                        max_retries=0)
    for _ in range(3):
        assert post(gateway, setup["raw"], CHAT).status_code == 200
    started = time.monotonic()
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    rows = records(4)
    assert [r.attempts for r in rows] == [2, 2, 2, 1]  # the fourth goes straight to the fallback
    assert all(r.fell_back for r in rows)  # the first choice was cooled down: still a fallback
    assert time.monotonic() - started < 1


def test_it_never_calls_a_channel_whose_key_cannot_be_decrypted(gateway, setup, primary, fallback):
    from cryptography.fernet import Fernet

    Channel.objects.filter(pk=setup["local"].pk).update(
        credential_ciphertext=Fernet(Fernet.generate_key()).encrypt(b"sk-other").decode())
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    assert primary.requests == [] and len(fallback.requests) == 1
    [row] = records()
    assert row.fell_back and row.channel == setup["cloud"]


def test_it_cancels_the_upstream_request_when_the_client_disconnects(gateway, setup, primary):
    primary.behave("slow_drip", delay=0.2)
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True),
                           headers={"Authorization": f"Bearer {setup['raw']}"}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break
    primary.wait_for_disconnects(1, timeout=5)  # raises if the upstream request was not cancelled
    [row] = records()
    assert row.outcome == "client_closed"


@pytest.mark.parametrize("body, headers, status, code", [
    (b"{not json", None, 400, "invalid_json"),
    (json.dumps({"messages": CHAT["messages"]}).encode(), None, 400, "missing_model"),
    (json.dumps(dict(CHAT, model="nope")).encode(), None, 404, "model_not_found"),
    (json.dumps(dict(CHAT, messages="hi")).encode(), None, 400, "invalid_messages"),
    (json.dumps(dict(CHAT, max_tokens=10**9)).encode(), None, 400, "invalid_max_tokens"),
    (b"{" + b" " * (5 * 1024 * 1024) + b"}", None, 413, "request_too_large"),
    (json.dumps(CHAT).encode(), {"Authorization": "Bearer tw-wrong"}, 401, "invalid_api_key"),
    (json.dumps(CHAT).encode(), {}, 401, "missing_api_key"),
    (json.dumps(CHAT).encode(), "nospace", 401, "invalid_api_key"),
])
def test_it_refuses_bad_client_input_openai_style(gateway, setup, primary, body, headers, status, code):
    if headers is None:
        headers = {"Authorization": f"Bearer {setup['raw']}"}
    elif headers == "nospace":
        headers = {"Authorization": f"Bearer{setup['raw']}"}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, timeout=30,
                          headers={"content-type": "application/json", **headers})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error
    if headers.get("Authorization", "").startswith("Bearertw"):
        assert "space after 'Bearer'" in error["message"]
    assert primary.requests == []
    [row] = records()
    assert row.status_code == status and row.outcome == "error"


def test_it_refuses_revoked_expired_and_foreign_keys(gateway, setup, team_setup, primary):
    revoked, revoked_raw = key_issue(team=setup["team"], user=None, name="old")
    key_revoke(key=revoked)
    expired, expired_raw = key_issue(team=setup["team"], user=None, name="temp",
                                     expires_at=timezone.now() + timedelta(seconds=1))
    time.sleep(1.2)
    other, other_raw = key_issue(team=team_setup["team_b"], user=None, name="theirs")
    assert "revoked" in post(gateway, revoked_raw, CHAT).json()["error"]["message"]
    assert "expired" in post(gateway, expired_raw, CHAT).json()["error"]["message"]
    foreign = post(gateway, other_raw, CHAT)  # team B has no route "chat": team A's is invisible to it
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "model_not_found"
    limited, limited_raw = key_issue(team=setup["team"], user=None, name="narrow", allowed_models=["other"])
    assert post(gateway, limited_raw, CHAT).status_code == 403
    assert primary.requests == []
    records(4)


def test_it_limits_requests_per_minute_across_processes(gateway, setup, transactional_db):
    from django.db import connection

    limited, raw = key_issue(team=setup["team"], user=None, name="slow", rpm_limit=3)
    second = GatewayServer(connection.settings_dict["NAME"])
    try:
        codes = [post(server, raw, CHAT).status_code for server in (gateway, second, gateway, second)]
        refused = post(second, raw, CHAT)
    finally:
        second.stop()
    assert codes == [200, 200, 200, 429]
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_it_limits_tokens_per_minute_holding_each_requests_most(gateway, setup, primary):
    """A key with a tokens-per-minute limit holds each request's most (prompt estimate + max_tokens) in its window
    while it runs: 16 concurrent streams against a limit that holds three cannot pass it (the first request of a
    window passed it by its whole answer before), what each used replaces its hold when it ends, and a request
    whose most alone is over the limit is refused with 400 (waiting would not help)."""
    import concurrent.futures

    import redis
    from django.conf import settings

    from panel.channels.rules import input_token_estimate
    from panel.gateway.rate_limits import window, window_keys

    most = input_token_estimate(CHAT) + CHAT["max_tokens"]
    limited, raw = key_issue(team=setup["team"], user=None, name="tokens", tpm_limit=3 * most)
    too_big = post(gateway, raw, dict(CHAT, max_tokens=3 * most))
    assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "tokens_per_minute_exceeded"
    assert f"more than this key's limit of {3 * most:,} tokens per minute: lower max_tokens" in too_big.text

    primary.behave("slow_drip", delay=0.05)
    first_minute = window()[0]

    def stream():
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True), timeout=60,
                          headers={"Authorization": f"Bearer {raw}"}) as response:
            return response.status_code, b"".join(response.iter_bytes())

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: stream(), range(16)))
    statuses = [status for status, _ in answers]
    assert 1 <= statuses.count(200) and set(statuses) <= {200, 429}, statuses
    used = records(17)  # the refusals are recorded too
    spent = sum(row.prompt_tokens + row.completion_tokens for row in used)
    store = redis.Redis.from_url(settings.REDIS_URL)
    windows = [int(store.get(window_keys(limited.id, minute)[1]) or 0)
               for minute in range(first_minute, window()[0] + 1)]  # one window, or two across a minute's end
    assert all(tokens <= 3 * most for tokens in windows), windows  # never past the limit
    assert sum(windows) == spent  # every hold replaced by what its request used
    refused = next(body for status, body in answers if status == 429)
    assert b"tokens per minute" in refused
