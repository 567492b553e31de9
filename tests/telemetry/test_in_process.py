"""OpenTelemetry in the panel's own process: nothing is started (no tracer, no thread) while
TOKENWISE_OTEL_ENDPOINT is empty; with it set, the panel's own requests through the pipeline (a Compare column)
are traced like a client's."""
import threading

import pytest

from panel.compare.relay import stream_chat
from panel.gateway import otlp
from panel.gateway.panel_requests import candidate_resolve
from panel.gateway.upstream import connections_close
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import channel
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.waiting import run_coroutine, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def ask_column(column, team, payload):
    """A Compare column's request through the gateway's pipeline, in an event loop of its own (as a page's is)."""
    async def run():
        try:
            return [event async for event in stream_chat(column, payload, team_id=team.pk)]
        finally:
            await connections_close()

    return run_coroutine(run())


def exporter_threads():
    return [thread.name for thread in threading.enumerate() if "otlp" in thread.name.lower()
            or "otel" in thread.name.lower() or "batch" in thread.name.lower()]


def test_it_starts_nothing_without_an_endpoint(team_setup, settings):
    assert settings.OTEL_ENDPOINT == ""
    team = team_setup["team_a"]
    with FakeUpstream(models=("up-model",)) as fake:
        column = candidate_resolve(team=team, spec={"kind": "channel", "id": channel(team, "up", fake, "up-model").pk,
                                                    "label": "up"})
        events = ask_column(column, team, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
    assert events[-1]["ok"], events[-1]
    assert otlp.running() is None and exporter_threads() == []


def test_the_panels_own_requests_are_traced_with_their_endpoint(team_setup, settings):
    team = team_setup["team_a"]
    with OtlpReceiver() as receiver, FakeUpstream(models=("up-model",)) as fake:
        settings.OTEL_ENDPOINT, settings.OTEL_EXPORT_INTERVAL_SECONDS = receiver.url, 0.2
        try:
            up = channel(team, "up", fake, "up-model")
            column = candidate_resolve(team=team, spec={"kind": "channel", "id": up.pk, "label": "up"})
            events = ask_column(column, team, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
            assert events[-1]["ok"], events[-1]
            assert otlp.running() is not None and "otlp metrics" in exporter_threads()
        finally:
            otlp.stop()  # sends what is queued
        wait_until(lambda: len(receiver.spans()) >= 2, seconds=10, message="the request's spans")
        request, attempt = sorted(receiver.spans(), key=lambda span: span["parent_span_id"])
    assert request["attributes"]["tokenwise.endpoint"] == "compare"
    assert request["attributes"]["tokenwise.team.id"] == team.pk and "tokenwise.key.id" not in request["attributes"]
    assert attempt["parent_span_id"] == request["span_id"] and attempt["name"] == "chat up-model"
    assert attempt["attributes"]["tokenwise.channel.id"] == up.pk
    assert "gen_ai.input.messages" not in request["attributes"]
