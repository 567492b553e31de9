"""The gateway's time budgets and a client that leaves: a hanging channel falls back within seconds, the route's
deadline bounds every retry and fallback, and a client that disconnects (before the headers, mid-stream, during a
retry's backoff) ends all upstream work for it: no attempt after it, one usage row saying client_closed."""
import time

import httpx
import openai
import pytest

from panel.channels.models import Channel, Route
from tests.support.fake_upstream import content_text
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)


def test_a_hanging_first_channel_falls_back_within_15_seconds_with_the_default_budgets(gateway, setup, primary,
                                                                                      fallback):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=10, timeout_seconds=120,
                                                        max_retries=3)
    primary.behave("hang_before_headers")  # never answers
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0, timeout=60)
    started = time.monotonic()
    answer = client.chat.completions.create(model="chat", messages=CHAT["messages"])
    took = time.monotonic() - started
    assert answer.choices[0].message.content and 9.5 < took < 15
    assert len(primary.requests) == 1  # a stalled channel is not asked again
    [row] = records()
    assert (row.outcome, row.fell_back, row.channel, row.attempts) == ("ok", True, setup["cloud"], 2)
    assert [(s["channel"], s["outcome"]) for s in row.attempt_trail] == [("local", "stalled"), ("cloud", "ok")]
    assert 9500 < row.attempt_trail[0]["ms"] < 11000


@pytest.mark.parametrize("stream", [False, True])
def test_the_route_deadline_bounds_every_retry_and_fallback(gateway, setup, primary, fallback, stream):
    Route.objects.filter(pk=setup["route"].pk).update(deadline_seconds=2)
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=1.5)
    primary.behave("hang_before_headers")
    fallback.behave("hang_before_headers")
    started = time.monotonic()
    response = post(gateway, setup["raw"], dict(CHAT, stream=stream))
    assert time.monotonic() - started < 3
    assert response.status_code == 504 and response.json()["error"]["code"] in ("stalled", "deadline")
    [row] = records()
    assert row.outcome in ("upstream_stalled", "error") and row.channel is not None
    assert response.headers["x-request-id"] == row.request_id


def test_a_retry_is_not_started_when_its_backoff_would_pass_the_deadline(gateway, setup, primary, fallback):
    Route.objects.filter(pk=setup["route"].pk).update(deadline_seconds=2)
    primary.behave("status_429", retry_after=3)  # the backoff (3 s) would pass the deadline: the fallback instead
    started = time.monotonic()
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    assert time.monotonic() - started < 1
    [row] = records()
    assert [(s["channel"], s["status"]) for s in row.attempt_trail] == [("local", 429), ("cloud", 200)]


# ------------------------------------------------------------------------------------------------ a client that leaves

def leave_after(gateway, setup, body, seconds):
    """Send `body` and hang up after `seconds` without an answer; returns when the client closed."""
    with pytest.raises(httpx.ReadTimeout):
        with httpx.Client(timeout=seconds) as client:
            client.post(f"{gateway.url}/v1/chat/completions", json=body,
                        headers={"Authorization": f"Bearer {setup['raw']}"})
    return time.monotonic()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_before_the_headers_ends_the_upstream_call_and_nothing_follows(
        gateway, setup, primary, fallback, stream):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=2)
    primary.behave("hang_before_headers")
    left = leave_after(gateway, setup, dict(CHAT, stream=stream), 1)
    primary.wait_for_disconnects(1, timeout=1)  # the upstream call ended within a second of the client leaving
    assert time.monotonic() - left < 1.5
    time.sleep(2)  # past the first-byte budget: the fallback would have been called by now
    assert len(primary.requests) == 1 and fallback.requests == []
    [row] = records()
    assert (row.outcome, row.status_code, row.channel, row.attempts) == ("client_closed", 499, setup["local"], 1)


def test_a_client_that_leaves_mid_stream_ends_the_stream_and_nothing_follows(gateway, setup, primary, fallback):
    primary.behave("slow_drip", delay=0.3)
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True),
                           headers={"Authorization": f"Bearer {setup['raw']}"}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break
    left = time.monotonic()
    primary.wait_for_disconnects(1, timeout=1)
    assert time.monotonic() - left < 1.5
    time.sleep(1)
    assert len(primary.requests) == 1 and fallback.requests == []
    [row] = records()
    assert (row.outcome, row.channel, row.attempts) == ("client_closed", setup["local"], 1)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_during_a_retry_backoff_gets_no_more_attempts(gateway, setup, primary, fallback,
                                                                          stream):
    primary.behave("status_429", retry_after=3)
    leave_after(gateway, setup, dict(CHAT, stream=stream), 1)
    time.sleep(3)  # past the backoff: the retry would have been sent by now
    assert len(primary.requests) == 1 and fallback.requests == []
    [row] = records()
    assert (row.outcome, row.channel, row.attempts) == ("client_closed", setup["local"], 1)
    assert [(s["channel"], s["status"]) for s in row.attempt_trail] == [("local", 429)]


# ------------------------------------------------------------------------------------------------ what the row says

def test_a_failed_request_names_its_channel_in_the_row_the_log_and_the_request_id(gateway, setup, primary, fallback):
    primary.behave("status_503")
    fallback.behave("status_503")
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 502
    [row] = records()
    assert response.headers["x-request-id"] == row.request_id and row.request_id.startswith("req_")
    assert row.channel == setup["cloud"] and [s["outcome"] for s in row.attempt_trail] == ["upstream_error"] * 4
    [line] = [line for line in gateway.log().splitlines() if row.request_id in line]
    for part in (f"…{setup['raw'][-4:]}", "route chat", "channel cloud", "status 502", "outcome error", " ms"):
        assert part in line, line


def test_listing_models_is_not_a_usage_row_and_a_refusal_is_logged(gateway, setup):
    assert httpx.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {setup['raw']}"}).status_code == 200
    refused = post(gateway, "tw-wrong", CHAT)
    assert refused.status_code == 401
    [row] = records()  # the refusal only
    assert row.status_code == 401 and refused.headers["x-request-id"] == row.request_id
    assert any(row.request_id in line and "status 401" in line for line in gateway.log().splitlines())


def test_a_stall_after_the_first_byte_is_upstream_stalled_not_the_clients_fault(gateway, setup, primary):
    Channel.objects.filter(pk=setup["local"].pk).update(idle_timeout_seconds=0.5)
    primary.behave("slow_drip", delay=2)  # the first event, then a gap past the idle budget
    body = dict(CHAT, stream=True)
    from tests.support.gateway import stream_events

    events = stream_events(post(gateway, setup["raw"], body))
    assert events[-1]["error"]["code"] == "stalled"
    [row] = records()
    assert (row.outcome, row.channel) == ("upstream_stalled", setup["local"])


# ------------------------------------------------------------------------------------------------ a Redis outage

@pytest.fixture
def gateway_without_redis(transactional_db):
    from django.db import connection

    from tests.support.fake_upstream import closed_port
    from tests.support.gateway_server import GatewayServer

    server = GatewayServer(connection.settings_dict["NAME"], REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0",
                           TOKENWISE_BUDGET_CACHE_SECONDS="0")
    yield server
    server.stop()


def test_a_redis_outage_fails_open_on_rate_limits_and_budgets_and_keeps_the_usage_rows(gateway_without_redis, setup):
    from panel.accounts.models import TeamKey
    from panel.budgets.models import Budget

    TeamKey.objects.filter(pk=setup["key"].pk).update(rpm_limit=100, tpm_limit=100_000)
    Budget.objects.create(team=setup["team"], key=setup["key"], tokens_per_month=1000)
    for stream in (False, True):
        response = post(gateway_without_redis, setup["raw"], dict(CHAT, stream=stream))
        assert response.status_code == 200, response.text
    rows = records(2)
    assert all(row.outcome == "ok" and row.key_id == setup["key"].pk for row in rows)
    log = gateway_without_redis.log()
    assert "letting the request through" in log and "Traceback" not in log


# ------------------------------------------------------------------------- a non-streamed answer is watched as a stream

def test_a_non_streamed_answer_that_drips_past_the_first_byte_budget_is_answered_not_fallen_back(
        gateway, setup, primary, fallback):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=1, idle_timeout_seconds=1,
                                                        timeout_seconds=30)
    primary.chunks, primary.chunk_delay = 10, 0.3  # about 3 s in all, a token every 0.3 s
    started = time.monotonic()
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 200, response.text
    assert time.monotonic() - started > 2.5
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == "chat"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": content_text(10)}
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 10
    assert primary.requests[0].json["stream"] is True and fallback.requests == []
    [row] = records()
    assert (row.outcome, row.channel, row.fell_back, row.completion_tokens) == ("ok", setup["local"], False, 10)
    assert row.prompt_tokens == answer["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("behaviour", ["hang_before_headers", "hang_after_headers"])
def test_a_non_streamed_request_to_a_true_hang_still_falls_back(gateway, setup, primary, fallback, behaviour):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=1, idle_timeout_seconds=1)
    primary.behave(behaviour)
    started = time.monotonic()
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 200 and time.monotonic() - started < 2.5
    assert response.json()["choices"][0]["message"]["content"] == content_text(fallback.chunks)
    [row] = records()
    assert [(s["channel"], s["outcome"]) for s in row.attempt_trail] == [("local", "stalled"), ("cloud", "ok")]


def test_a_non_streamed_answer_that_stops_dripping_is_a_stall(gateway, setup, primary, fallback):
    Route.objects.filter(pk=setup["route"].pk).update(fallback_on_error=False)
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=1, idle_timeout_seconds=0.5)
    primary.behave("slow_drip", delay=2)  # the first token in time, then a silence past the idle budget
    response = post(gateway, setup["raw"], CHAT)
    assert response.status_code == 504 and response.json()["error"]["code"] == "stalled"
    [row] = records()
    assert (row.outcome, row.channel) == ("upstream_stalled", setup["local"])



def test_a_client_that_leaves_after_a_failure_keeps_the_failure_as_the_outcome():
    """A client that hangs up on a cut stream's error event left because of the cut: the row says so."""
    from panel.gateway.exchange import Exchange

    cut = Exchange("chat", time.perf_counter())
    cut.fail(502, "cut")
    cut.client_left()
    assert (cut.fields["outcome"], cut.fields["error_kind"], cut.fields["status_code"]) == ("upstream_cut", "cut", 502)
    waiting = Exchange("chat", time.perf_counter())
    waiting.client_left()
    assert (waiting.fields["outcome"], waiting.fields["status_code"]) == ("client_closed", 499)
