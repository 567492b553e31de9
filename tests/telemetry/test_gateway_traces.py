"""A gateway process (uvicorn, as it runs in production) with TOKENWISE_OTEL_ENDPOINT set sends a span per request
and one per upstream attempt, and the panel's metrics, to an OTLP/HTTP receiver; the request's text only for a team
whose owner turned it on; a client's traceparent continued, and passed to the team's own engines only."""
import json

import httpx
import pytest

from panel.accounts.models import Team
from tests.support.fake_upstream import content_text
from tests.support.gateway import CHAT, fallback, gateway_for, post, primary, records, setup, stream_events  # noqa: F401
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.waiting import wait_until

SERVER, CLIENT = 2, 3  # OTLP's span kinds
OK, ERROR = 0, 2  # status codes: unset, error


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as started:
        yield started


@pytest.fixture
def traced(transactional_db, request, receiver):
    receiver.clear()
    yield from gateway_for(request, TOKENWISE_OTEL_ENDPOINT=receiver.url, TOKENWISE_OTEL_EXPORT_INTERVAL_MS="200",
                           TOKENWISE_OTEL_SERVICE_NAME="tokenwise-test",
                           TOKENWISE_OTEL_HEADERS="x-collector-key=one%20two")


def trace_of(receiver, request_id, attempts):
    """The request's span and its attempts' spans, once all of them arrived."""
    def complete(spans):
        mine = [span for span in spans if span["attributes"].get("tokenwise.request.id") == request_id]
        return mine and len([span for span in spans if span["parent_span_id"] == mine[0]["span_id"]]) == attempts

    spans = receiver.wait_for_spans(complete, message=f"the spans of {request_id}")
    [request] = [span for span in spans if span["attributes"].get("tokenwise.request.id") == request_id]
    children = sorted((span for span in spans if span["parent_span_id"] == request["span_id"]),
                      key=lambda span: span["start"])
    return request, children


def texts(spans):
    return " ".join(str(value) for span in spans for value in span["attributes"].values())


def test_it_sends_a_span_per_request_and_per_attempt_with_the_genai_attributes(traced, receiver, setup, primary):
    primary.behave("status_500", times=2)  # both tries on the local channel fail: the cloud channel answers
    response = post(traced, setup["raw"], CHAT)
    assert response.status_code == 200, response.text
    [row] = records()
    request, attempts = trace_of(receiver, response.headers["x-request-id"], 3)

    assert request["name"] == "chat chat" and request["kind"] == SERVER and request["status"] == OK
    attributes = request["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.response.model"] == "cloud-model" and attributes["gen_ai.request.max_tokens"] == 20
    assert attributes["gen_ai.request.stream"] is False
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        row.prompt_tokens, row.completion_tokens) and row.completion_tokens > 0
    assert attributes["tokenwise.team.id"] == setup["team"].pk and attributes["tokenwise.key.id"] == setup["key"].pk
    assert (attributes["tokenwise.route.id"], attributes["tokenwise.route.name"]) == (setup["route"].pk, "chat")
    assert (attributes["tokenwise.channel.id"], attributes["tokenwise.channel.name"]) == (setup["cloud"].pk, "cloud")
    assert attributes["tokenwise.cost"] == pytest.approx(float(row.cost)) and row.cost > 0
    assert attributes["tokenwise.outcome"] == "ok" and attributes["http.response.status_code"] == 200
    assert attributes["tokenwise.attempts"] == 3 and attributes["tokenwise.fell_back"] is True
    assert request["resource"]["service.name"] == "tokenwise-test"
    assert receiver.headers()[0]["x-collector-key"] == "one two"

    # Two failed tries on the local channel, then the fallback, each a child span with its own times.
    assert [span["name"] for span in attempts] == ["chat up-model", "chat up-model", "chat cloud-model"]
    assert {span["trace_id"] for span in attempts} == {request["trace_id"]}
    assert all(span["kind"] == CLIENT for span in attempts)
    outcomes = [span["attributes"]["tokenwise.attempt.outcome"] for span in attempts]
    assert outcomes == [step["outcome"] for step in row.attempt_trail] and outcomes[2] == "ok" != outcomes[0]
    assert [span["status"] for span in attempts] == [ERROR, ERROR, OK]
    assert [span["attributes"].get("http.response.status_code") for span in attempts] == [500, 500, 200]
    assert attempts[0]["attributes"]["error.type"] == outcomes[0]
    assert [span["attributes"]["tokenwise.channel.name"] for span in attempts] == ["local", "local", "cloud"]
    assert attempts[0]["attributes"]["server.port"] == primary.port
    assert request["start"] <= attempts[0]["start"] < attempts[0]["end"] <= attempts[1]["start"]
    assert attempts[1]["end"] <= attempts[2]["start"] < attempts[2]["end"] <= request["end"]

    # The team did not opt in: no prompt and no answer text anywhere.
    assert "gen_ai.input.messages" not in attributes and "gen_ai.output.messages" not in attributes
    everything = texts([request, *attempts])
    assert "one two three four" not in everything and content_text(4).split()[0] not in everything


def test_it_adds_the_prompt_and_answer_only_for_a_team_that_opted_in(traced, receiver, setup):
    body = dict(CHAT, stream=True, stream_options={"include_usage": True})
    first = post(traced, setup["raw"], body)
    Team.objects.filter(pk=setup["team"].pk).update(trace_prompts=True)
    second = post(traced, setup["raw"], body)
    answer = "".join(event["choices"][0]["delta"].get("content") or "" for event in stream_events(second)
                     if isinstance(event, dict) and event.get("choices"))
    records(2)
    kept_out, _ = trace_of(receiver, first.headers["x-request-id"], 1)
    shared, [attempt] = trace_of(receiver, second.headers["x-request-id"], 1)

    assert "gen_ai.input.messages" not in kept_out["attributes"] and "one two" not in texts([kept_out])
    assert json.loads(shared["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "one two three four"}]}]
    assert answer and json.loads(shared["attributes"]["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    assert shared["attributes"]["gen_ai.request.stream"] is True
    assert shared["attributes"]["gen_ai.response.time_to_first_chunk"] > 0
    assert "gen_ai.input.messages" not in attempt["attributes"]  # the text is on the request's span only


def test_a_request_every_channel_failed_is_an_error_span(traced, receiver, setup, primary, fallback):
    primary.behave("status_500", times=2)
    fallback.behave("status_500", times=2)
    response = post(traced, setup["raw"], CHAT)
    assert response.status_code >= 500
    [row] = records()
    request, attempts = trace_of(receiver, response.headers["x-request-id"], 4)
    assert request["status"] == ERROR and request["attributes"]["tokenwise.outcome"] == row.outcome == "error"
    assert request["attributes"]["error.type"] == row.error_kind
    assert request["attributes"]["http.response.status_code"] == row.status_code
    assert [span["status"] for span in attempts] == [ERROR] * 4
    assert "gen_ai.response.model" not in request["attributes"]


def test_it_sends_the_panels_metrics(traced, receiver, setup):
    response = post(traced, setup["raw"], CHAT)
    assert response.status_code == 200
    records()

    def requests_counted():
        return [point for point in receiver.metrics() if point["name"] == "tokenwise_gateway_requests"
                and point["attributes"] == {"endpoint": "chat", "model": "chat", "outcome": "ok"}
                and point["value"] >= 1]

    wait_until(requests_counted, seconds=15, message="the request counter over OTLP")
    points = receiver.metrics()
    latency = [point for point in points if point["name"] == "tokenwise_gateway_request_latency_seconds"
               and point["attributes"] == {"model": "chat"}][-1]
    assert latency["count"] >= 1 and sum(latency["buckets"]) == latency["count"] and latency["sum"] > 0
    assert len(latency["buckets"]) == len(latency["bounds"]) + 1
    tokens = {point["attributes"]["direction"]: point["value"] for point in points
              if point["name"] == "tokenwise_gateway_tokens" and point["attributes"]["model"] == "chat"}
    assert tokens["prompt"] >= 4 and tokens["completion"] >= 1
    assert points[-1]["resource"]["service.instance.id"]


def test_it_continues_a_clients_trace_and_passes_it_to_the_teams_own_engine_only(traced, receiver, setup, primary,
                                                                                  fallback):
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"Authorization": f"Bearer {setup['raw']}", "traceparent": f"00-{trace_id}-{client_span}-01",
               "tracestate": "vendor=abc"}
    primary.behave("status_500", times=2)  # the local engine fails twice, then the cloud answers
    response = httpx.post(f"{traced.url}/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    request, attempts = trace_of(receiver, response.headers["x-request-id"], 3)
    assert (request["trace_id"], request["parent_span_id"]) == (trace_id, client_span)
    assert {span["trace_id"] for span in attempts} == {trace_id}
    # The engine's calls carried the trace, the request span as their parent; the cloud got none.
    sent = [call.headers.get("traceparent") for call in primary.requests]
    assert sent == [f"00-{trace_id}-{request['span_id']}-01"] * 2
    assert {call.headers.get("tracestate") for call in primary.requests} == {"vendor=abc"}
    assert [call.headers.get("traceparent") for call in fallback.requests] == [None]

    # No traceparent, or one that cannot be continued: a trace of the gateway's own, still passed to the engine.
    for given in (None, "00-00000000000000000000000000000000-00f067aa0ba902b7-01", f"ff-{trace_id}-{client_span}-01"):
        primary.reset()
        extra = {"traceparent": given} if given else {}
        answered = httpx.post(f"{traced.url}/v1/chat/completions", json=CHAT, timeout=30,
                              headers={"Authorization": f"Bearer {setup['raw']}", **extra})
        assert answered.status_code == 200
        own, _ = trace_of(receiver, answered.headers["x-request-id"], 1)
        assert own["trace_id"] != trace_id and not own["parent_span_id"]
        assert [call.headers["traceparent"] for call in primary.requests] == [
            f"00-{own['trace_id']}-{own['span_id']}-01"]
