"""The panel's own requests (Compare columns, evaluation runs, shadow copies) go through the gateway's one pipeline:
a channel that speaks only Anthropic's Messages API is asked in Messages and its answer comes back as text; a route
column follows the route's rules and its canary split as a client's request does; its deadline cuts a channel that
never starts answering; and the team's budget holds the request's most while it runs."""
from decimal import Decimal

import pytest

from panel.budgets.services import budget_set
from panel.channels.models import Route, RouteChannel, RouteRule, RouteRuleChannel
from panel.channels.routing import routing_changed
from panel.compare.relay import stream_chat
from panel.evaluations.runs import _ask
from panel.gateway.panel_requests import candidate_resolve
from panel.gateway.upstream import connections_close
from panel.usage.models import RequestLog
from tests.support.fake_messages_upstream import MESSAGES_PATH, FakeMessagesUpstream
from tests.support.fake_upstream import FakeUpstream, content_text
from tests.support.gateway import channel
from tests.support.waiting import run_coroutine, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def columns(team, spec):
    return candidate_resolve(team=team, spec=spec)


def ask_column(column, team, payload):
    """The Compare relay's events for one column, in an event loop of their own (as a page's request has)."""
    async def run():
        try:
            return [event async for event in stream_chat(column, payload, team_id=team.pk)]
        finally:
            await connections_close()

    return run_coroutine(run())


def rows(count):
    return wait_until(lambda: list(RequestLog.objects.order_by("id")) if RequestLog.objects.count() >= count
                      else None, seconds=10, message="the usage rows")


def test_a_messages_only_channel_is_asked_in_messages_from_compare_and_evaluations(team_setup):
    team = team_setup["team_a"]
    with FakeMessagesUpstream(models=("claude-x",), apis="messages", chunks=4) as fake:
        anthropic = channel(team, "anthropic", fake, "claude-x", apis="messages",
                            price_input_per_million=Decimal("3"), price_output_per_million=Decimal("15"))
        column = columns(team, {"kind": "channel", "id": anthropic.pk, "label": "anthropic"})
        events = ask_column(column, team, {"messages": [{"role": "user", "content": "hello there"}],
                                           "max_tokens": 16})
        done = events[-1]
        assert done["ok"], done
        assert done["text"] == content_text(4) and [e["text"] for e in events if e["type"] == "delta"]
        assert {request.path for request in fake.requests} == {MESSAGES_PATH}

        async def evaluate():
            try:
                return await _ask(column, [{"role": "user", "content": "one case"}], 16, team.pk)
            finally:
                await connections_close()

        answer = run_coroutine(evaluate())
        assert answer.ok and answer.text == content_text(4)
        assert [request.path for request in fake.requests] == [MESSAGES_PATH, MESSAGES_PATH]
    compare_row, evaluation_row = rows(2)
    assert (compare_row.endpoint, evaluation_row.endpoint) == ("compare", "evaluation")
    assert compare_row.cost > 0 and compare_row.channel_id == anthropic.pk and compare_row.outcome == "ok"


def test_a_route_column_follows_the_routes_rules_and_its_canary(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(models=("m",), chunks=2) as usual, FakeUpstream(models=("m",), chunks=3) as tools, \
            FakeUpstream(models=("m",), chunks=5) as candidate:
        usual_channel = channel(team, "usual", usual, "m")
        tools_channel = channel(team, "for-long-prompts", tools, "m")
        candidate_channel = channel(team, "candidate", candidate, "m")
        route = Route.objects.create(team=team, model_name="assistant")
        RouteChannel.objects.create(route=route, channel=usual_channel, position=0)
        rule = RouteRule.objects.create(route=route, name="long prompts", position=0, tokens_over=50)
        RouteRuleChannel.objects.create(rule=rule, channel=tools_channel, position=0)
        routing_changed(team.pk)
        column = columns(team, {"kind": "route", "id": route.pk, "label": "route assistant"})

        short = ask_column(column, team, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})[-1]
        long = ask_column(column, team, {"messages": [{"role": "user", "content": "word " * 400}],
                                         "max_tokens": 8})[-1]
        assert short["text"] == content_text(2) and long["text"] == content_text(3)
        assert long["metrics"]["channel"] == "for-long-prompts"

        route.canary_channel, route.canary_percent, route.canary_state = candidate_channel, 100, "running"
        route.save()
        routing_changed(team.pk)
        column = columns(team, {"kind": "route", "id": route.pk, "label": "route assistant"})  # read per request
        canary = ask_column(column, team, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})[-1]
        assert canary["text"] == content_text(5) and canary["metrics"]["channel"] == "candidate"
    first, second, third = rows(3)
    assert second.route_rule_id == rule.pk and third.canary is True


def test_a_route_columns_deadline_cuts_a_channel_that_never_answers(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(models=("m",)) as stuck:
        stuck.behave("hang_before_headers")
        hanging = channel(team, "stuck", stuck, "m", timeout=30)
        route = Route.objects.create(team=team, model_name="slow", deadline_seconds=1)
        RouteChannel.objects.create(route=route, channel=hanging, position=0)
        routing_changed(team.pk)
        column = columns(team, {"kind": "route", "id": route.pk, "label": "route slow"})
        done = ask_column(column, team, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})[-1]
    assert not done["ok"] and done["error_kind"] in ("stalled", "deadline")  # as a client's request is cut
    assert done["metrics"]["latency_ms"] < 5000  # the route's 1 s, not the channel's 30 s or its 10 s to a first byte
    assert rows(1)[0].error_kind == done["error_kind"]


def test_the_teams_budget_holds_a_panel_requests_most_while_it_runs(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    with FakeUpstream(models=("m",), chunks=3) as fake:
        priced = channel(team, "priced", fake, "m")
        budget_set(team=team, tokens_per_month=40, user=alice)
        column = columns(team, {"kind": "channel", "id": priced.pk, "label": "priced"})
        refused = ask_column(column, team, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200})[-1]
        assert not refused["ok"] and refused["error_kind"] == "budget_exceeded"
        assert "monthly budget of 40 tokens" in refused["diagnosis"]
        assert fake.requests == []  # refused before any channel was asked
    row = rows(1)[0]
    assert (row.endpoint, row.status_code, row.error_kind) == ("compare", 402, "budget_exceeded")
