"""Tool calls the provider runs and bills per call (web searches): read from Anthropic's usage.server_tool_use and
from a Responses answer's web_search_call items, whole and streamed; priced at the channel's price per 1,000 calls
into the request's cost; rolled up into the Cost tab and the usage export; and a request's max_uses held against
its budget before it goes."""
from decimal import Decimal

import anthropic
import openai
import pytest
from django.test import Client
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.budgets.reservations import maximum
from panel.dashboards.pages import dashboard_page
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.selectors import DashboardQuery
from tests.support.api_helpers import call, token_for
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.gateway import channel, gateway, records, route_to  # noqa: F401 (fixtures)

SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
ASK = [{"role": "user", "content": "what is new in vLLM"}]


@pytest.fixture
def provider():
    with FakeMessagesUpstream(models=("claude-fake", "gpt-fake"), api_key="sk-0000", apis="both") as fake:
        yield fake


@pytest.fixture
def setup(team_setup, provider):
    team = team_setup["team_a"]
    prices = {"price_input_per_million": Decimal("3"), "price_output_per_million": Decimal("15"),
              "price_tool_calls_per_thousand": Decimal("10")}
    claude = channel(team, "claude", provider, "claude-fake", key="sk-0000", apis="messages", **prices)
    gpt = channel(team, "gpt", provider, "gpt-fake", key="sk-0000", apis="both", **prices)
    route_to(team, "claude", claude), route_to(team, "gpt", gpt)
    _, raw = key_issue(team=team, user=team_setup["alice"], name="agent")
    return {"team": team, "claude": claude, "gpt": gpt, "raw": raw, **team_setup}


def test_web_searches_are_counted_and_priced_per_call_in_both_apis(gateway, setup, provider):
    client = anthropic.Anthropic(base_url=gateway.url, api_key=setup["raw"], max_retries=0)
    reply = client.messages.create(model="claude", max_tokens=20, messages=ASK, tools=[SEARCH])
    assert reply.usage.server_tool_use.web_search_requests == 1
    with client.messages.stream(model="claude", max_tokens=20, messages=ASK,
                                tools=[dict(SEARCH, max_uses=5)]) as stream:
        list(stream)
    client.messages.create(model="claude", max_tokens=20, messages=ASK)  # no tool: nothing reported
    responses = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0).responses
    answer = responses.create(model="gpt", input="what is new in vLLM", tools=[{"type": "web_search"}])
    assert [item.type for item in answer.output].count("web_search_call") == 2
    streamed = responses.create(model="gpt", input="what is new in vLLM", tools=[{"type": "web_search"}],
                                stream=True)
    list(streamed)
    rows = records(5)
    assert [row.server_tool_calls for row in rows] == [1, 2, None, 2, 2]
    for row in rows:
        tokens = (Decimal(row.prompt_tokens) * 3 + Decimal(row.completion_tokens) * 15) / 10**6
        assert row.cost == tokens + Decimal(row.server_tool_calls or 0) * 10 / 1000, row.endpoint

    usage_rollup_run()
    table = dashboard_page(tab="cost", query=DashboardQuery(team=setup["team"], range="1h")).table("cost")
    calls = {row[0]: dict(zip(table.columns, row))["provider tool calls"] for row in table.rows}
    assert calls == {"claude": 3, "gpt": 4}
    token = token_for(setup["alice"], setup["team"])  # the usage export lists them too
    items = call(Client(), "get", "/usage", token).json()["items"]
    assert sorted(item["server_tool_calls"] or 0 for item in items) == [0, 1, 2, 2, 2]


def test_a_requests_max_uses_is_held_against_the_budget(setup):
    with_tool = maximum(10, {"max_tokens": 100, "tools": [dict(SEARCH, max_uses=3)]}, [setup["claude"]])
    without = maximum(10, {"max_tokens": 100}, [setup["claude"]])
    assert with_tool.money_units - without.money_units == 3 * 10 * 10**8 // 1000  # three searches at 10 per 1,000


def test_the_channel_form_shows_the_price_per_thousand_calls(client, setup):
    client.force_login(setup["alice"])
    page = client.get(reverse("channel_edit", args=[setup["claude"].pk])).content.decode()
    assert "Tool calls / 1K" in page and 'name="price_tool_calls_per_thousand" value="10"' in page
    assert setup["claude"].prices_display.endswith("tool calls 10 per 1K")
