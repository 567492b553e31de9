"""Shadow traffic through a real gateway process: a running test mirrors answered requests to its candidate in the
background (the client gets only the route's answer), each copy judged against the answer the client got and costed
as a `shadow` usage row; the test stops itself when its budget is spent, and when the candidate keeps failing; a
candidate that answers without the JSON the client asked for fails its check."""
from decimal import Decimal

import openai
import pytest

from panel.channels.models import ShadowResult, ShadowState, ShadowTest
from panel.channels.shadow import FAILURES_IN_A_ROW, shadow_start, shadow_summary
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream, content_text
from tests.support.gateway import (  # noqa: F401 (fixtures)
    CHAT,
    channel,
    fallback,
    gateway,
    post,
    primary,
    records,
    setup,
)
from tests.support.waiting import wait_until

# A gateway process per test (tests/support/gateway.py): shadow requests run after the answer, past a test
GATEWAY_PER_TEST = True


@pytest.fixture
def candidate(setup):
    with FakeUpstream(models=("small-model",), api_key="sk-small-2222") as fake:
        row = channel(setup["team"], "small", fake, "small-model", key="sk-small-2222", retries=0,
                      price_input_per_million=Decimal("0.01"), price_output_per_million=Decimal("0.02"))
        yield fake, row


def results(count):
    wait_until(lambda: ShadowResult.objects.count() >= count, seconds=20, message=f"{count} shadow results")
    return list(ShadowResult.objects.order_by("created_at", "pk"))


def test_answered_requests_are_mirrored_to_the_candidate_and_judged_against_the_clients_answer(
        gateway, setup, primary, candidate):
    fake, small = candidate
    shadow = shadow_start(route=setup["route"], channel=small, percent=100, budget=Decimal("5"))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    whole = client.chat.completions.create(model="chat", max_tokens=5, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name five words."}])
    assert whole.choices[0].message.content == content_text(5)  # the route's own answer, never the candidate's
    streamed = list(client.chat.completions.create(model="chat", max_tokens=3, stream=True,
                                                   messages=[{"role": "user", "content": "Three words."}]))
    assert streamed
    wait_until(lambda: fake.requests, seconds=10, message="the candidate asked in the background (after the answer)")
    first, second = results(2)
    assert fake.requests[0].json["messages"] == [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Name five words."}]
    assert fake.requests[0].json["model"] == "small-model" and fake.requests[0].json["max_tokens"] == 5
    for result in (first, second):
        assert result.ok and result.passed and result.similarity == 1.0 and result.json_valid is None
        assert result.cost > 0 and result.client_cost > result.cost and result.latency_ms > 0
    rows = RequestLog.objects.filter(endpoint="shadow")
    wait_until(lambda: rows.count() == 2, seconds=10, message="the shadow usage rows")
    assert set(rows.values_list("channel_id", flat=True)) == {small.pk} and rows.filter(route=None).count() == 2
    summary = shadow_summary(shadow)
    assert (summary["mirrored"], summary["answered"], summary["passed"], summary["pass_rate"]) == (2, 2, 2, 1.0)
    assert summary["cost_per_accepted"] == summary["cost"] / 2 and summary["budget_left"] < Decimal("5")


def test_the_test_stops_when_its_budget_is_spent(gateway, setup, candidate):
    fake, small = candidate
    small.price_input_per_million = Decimal("100000")  # 0.1 a token: one request spends the budget
    small.save()
    shadow = shadow_start(route=setup["route"], channel=small, percent=100, budget=Decimal("0.1"))
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    results(1)
    shadow.refresh_from_db()
    assert shadow.state == ShadowState.BUDGET_SPENT and "its budget of 0.1 was spent" in shadow.stop_reason
    asked = len(fake.requests)
    wait_until(lambda: post(gateway, setup["raw"], CHAT).status_code == 200 and len(fake.requests) == asked,
               seconds=10, message="no more copies once the routing says the test stopped")


def test_the_test_stops_when_the_candidate_keeps_failing_and_a_wrong_answer_fails_its_check(gateway, setup,
                                                                                           candidate):
    fake, small = candidate
    shadow = shadow_start(route=setup["route"], channel=small, percent=100, budget=Decimal("5"))
    fake.behave("broken_json_content", times=1)
    asked = {**CHAT, "response_format": {"type": "json_object"}}
    assert post(gateway, setup["raw"], asked).status_code == 200
    [judged] = results(1)
    assert judged.ok and judged.json_valid is False and not judged.passed
    fake.behave("status_500", times=100)
    for _ in range(FAILURES_IN_A_ROW):
        assert post(gateway, setup["raw"], CHAT).status_code == 200  # the client never sees the candidate fail
        wait_until(lambda: ShadowResult.objects.count() >= 1 + _ + 1, seconds=20, message="the next result")
    shadow.refresh_from_db()
    assert shadow.state == ShadowState.FAILED
    assert f"small failed {FAILURES_IN_A_ROW} mirrored requests in a row" in shadow.stop_reason
    assert ShadowTest.objects.filter(state=ShadowState.RUNNING).count() == 0
