"""The fault matrix under the time budgets: for each way a channel misbehaves, with and without a fallback, how long
the client waits for its answer, how many upstream attempts were made, and exactly one usage row naming the failing
channel (its attempt trail too)."""
import time

import pytest

from panel.channels.models import Channel, Route
from tests.support.fake_upstream import closed_port
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup, stream_events  # noqa: F401

# behaviour, options, stream, attempts on the failing channel (max_retries 1), the most seconds to the answer
FAULTS = [
    ("refused", {}, False, 2, 2),
    ("unresolvable", {}, False, 1, 2),  # a host name that does not resolve is not asked again
    ("status_500", {}, False, 2, 2),
    ("status_503", {}, True, 2, 2),
    ("status_429", {"retry_after": 1}, False, 2, 3),
    ("hang_before_headers", {}, False, 1, 2.5),  # a stall is not retried on the same channel
    ("hang_after_headers", {}, True, 1, 2.5),
    ("cut_stream", {"after": 0}, True, 2, 2),
    ("error_event", {}, True, 2, 2),
    ("malformed_json", {}, False, 2, 2),
]


@pytest.fixture
def budgets(setup):
    Channel.objects.filter(pk=setup["local"].pk).update(first_byte_timeout_seconds=1, idle_timeout_seconds=1)
    return setup


def misbehave(setup, primary, behaviour, options):
    if behaviour == "refused":
        Channel.objects.filter(pk=setup["local"].pk).update(base_url=f"http://127.0.0.1:{closed_port()}/v1")
    elif behaviour == "unresolvable":
        Channel.objects.filter(pk=setup["local"].pk).update(base_url="http://no-such-host.invalid/v1")
    else:
        primary.behave(behaviour, **options)


@pytest.mark.parametrize("behaviour, options, stream, attempts, seconds", FAULTS, ids=[f[0] for f in FAULTS])
def test_with_a_fallback_the_client_gets_its_answer_from_it(gateway, budgets, primary, fallback, behaviour, options,
                                                           stream, attempts, seconds):
    misbehave(budgets, primary, behaviour, options)
    started = time.monotonic()
    response = post(gateway, budgets["raw"], dict(CHAT, stream=stream))
    assert response.status_code == 200, response.text
    if stream:
        assert stream_events(response)[-1] == "[DONE]"
    took = time.monotonic() - started
    assert took < seconds, took
    [row] = records()
    assert (row.outcome, row.fell_back, row.channel, row.attempts) == ("ok", True, budgets["cloud"], attempts + 1)
    assert [s["channel"] for s in row.attempt_trail] == ["local"] * attempts + ["cloud"]
    assert len(fallback.requests) == 1


@pytest.mark.parametrize("behaviour, options, stream, attempts, seconds", FAULTS, ids=[f[0] for f in FAULTS])
def test_without_a_fallback_the_client_gets_a_clean_error_naming_the_channel(gateway, budgets, primary, fallback,
                                                                            behaviour, options, stream, attempts,
                                                                            seconds):
    Route.objects.filter(pk=budgets["route"].pk).update(fallback_on_error=False)
    misbehave(budgets, primary, behaviour, options)
    started = time.monotonic()
    response = post(gateway, budgets["raw"], dict(CHAT, stream=stream))
    took = time.monotonic() - started
    assert response.status_code in (429, 502, 504), response.text
    assert response.json()["error"]["type"] == "upstream_error"
    assert took < seconds, took
    [row] = records()
    assert row.channel == budgets["local"] and row.attempts == attempts and fallback.requests == []
    assert row.outcome in ("error", "upstream_stalled", "upstream_cut")
    assert row.request_id == response.headers["x-request-id"]
    assert [s["channel"] for s in row.attempt_trail] == ["local"] * attempts


def test_a_slow_drip_is_relayed_not_cut(gateway, budgets, primary, fallback):
    Channel.objects.filter(pk=budgets["local"].pk).update(timeout_seconds=30)
    primary.behave("slow_drip", delay=0.2)  # under the idle budget of 1 s: a slow channel, not a stalled one
    events = stream_events(post(gateway, budgets["raw"], dict(CHAT, stream=True)))
    assert events[-1] == "[DONE]"
    [row] = records()
    assert (row.outcome, row.channel, row.attempts, row.fell_back) == ("ok", budgets["local"], 1, False)


def test_a_stream_past_the_channels_total_time_says_so(gateway, budgets, primary, fallback):
    primary.behave("slow_drip", delay=0.2)  # every gap within the idle budget, the whole stream past the 2 s total
    events = stream_events(post(gateway, budgets["raw"], dict(CHAT, stream=True)))
    assert events[-1]["error"]["message"] == "the stream ran past the channel's total time", events[-1]
    [row] = records()
    assert (row.outcome, row.channel) == ("upstream_stalled", budgets["local"])
