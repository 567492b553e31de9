"""Routing rules: each condition kind, their order, no match, validation (every error at once, nothing written),
and the gateway sending a short tool request to one channel and a long one to another."""
import pytest
from django.core.exceptions import ValidationError

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, RouteRule
from panel.channels.routing import CachedRule
from panel.channels.rules import first_match, input_token_estimate, matches, request_facts, rule_save
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)

READ_FILE = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": READ_FILE}}]


def rule(rule_id=1, **conditions):
    fields = {"name": f"rule {rule_id}", "tokens_under": None, "tokens_over": None, "tools": "", "header_name": "",
              "header_value": "", "key_id": None, "api": "", "entries": ()}
    return CachedRule(id=rule_id, **{**fields, **conditions})


def facts(api="chat", body=None, headers=(), key_id=7):
    return request_facts(api=api, body=body or {"messages": [{"role": "user", "content": "hello"}]},
                         headers=headers, key_id=key_id)


def test_it_estimates_input_tokens_from_both_body_shapes():
    text = "x" * 4000
    chat = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": [{"type": "text",
                                                                                            "text": text}]}]}
    messages = {"system": [{"type": "text", "text": text}], "messages": [{"role": "user", "content": text}]}
    assert input_token_estimate(chat) == 2000 + 8
    assert input_token_estimate(messages) == 2000 + 4
    assert input_token_estimate({"prompt": text}) == 1000
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x" * 90000}}]}]}
    assert input_token_estimate(image) < 10  # a base64 image is not text
    assert request_facts(api="messages", body={**messages, "tools": [{"name": "t", "input_schema": {}}]},
                         headers=[(b"X-Team", b"a ")]).has_tools
    assert facts(headers=[(b"X-Team", b"blue")]).headers["x-team"] == "blue"


def test_it_matches_each_condition_kind():
    short_tools = facts(body={"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    long_plain = facts(body={"messages": [{"role": "user", "content": "word " * 8000}]})
    assert matches(rule(tokens_under=4000), short_tools) and not matches(rule(tokens_under=4000), long_plain)
    assert matches(rule(tokens_over=4000), long_plain) and not matches(rule(tokens_over=4000), short_tools)
    assert matches(rule(tools="with"), short_tools) and not matches(rule(tools="with"), long_plain)
    assert matches(rule(tools="without"), long_plain) and not matches(rule(tools="without"), short_tools)
    tagged = facts(headers=[(b"x-workload", b"batch")])
    assert matches(rule(header_name="x-workload", header_value="batch"), tagged)
    assert not matches(rule(header_name="x-workload", header_value="interactive"), tagged)
    assert not matches(rule(header_name="x-workload", header_value="batch"), facts())
    assert matches(rule(key_id=7), facts()) and not matches(rule(key_id=8), facts())
    assert matches(rule(api="messages"), facts(api="messages")) and not matches(rule(api="messages"), facts())
    both = rule(tools="with", tokens_under=4000)  # every set condition must hold
    assert matches(both, short_tools)
    assert not matches(both, facts(body={"messages": [{"role": "user", "content": "w " * 9000}], "tools": TOOLS}))


def test_the_first_matching_rule_wins_and_no_match_leaves_the_route():
    rules = (rule(1, tools="with"), rule(2, tokens_under=4000), rule(3, api="completions"))
    assert first_match(rules, facts(body={"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})).id == 1
    assert first_match(rules, facts()).id == 2
    assert first_match(rules[::-1], facts(api="completions", body={"prompt": "x"})).id == 3
    assert first_match(rules, facts(body={"messages": [{"role": "user", "content": "x " * 9000}]})) is None
    assert first_match((), facts()) is None


@pytest.mark.django_db
def test_it_refuses_a_bad_rule_with_every_error_and_writes_nothing(team_setup):
    from panel.channels.models import Route
    team, other = team_setup["team_a"], team_setup["team_b"]
    route = Route.objects.create(team=team, model_name="chat")
    foreign = Channel.objects.create(team=other, name="theirs", base_url="http://127.0.0.1:9/v1", model_id="m")
    foreign_key, _ = key_issue(team=other, user=team_setup["bob"], name="theirs")
    with pytest.raises(ValidationError) as caught:
        rule_save(route=route, name="", tokens_under=100, tokens_over=500, tools="sometimes",
                  header_name="authorization", header_value="", key=foreign_key, api="fax", channels=[foreign])
    problems = caught.value.message_dict
    assert set(problems) == {"name", "tokens_under", "tools", "header_name", "header_value", "key", "api", "channels"}
    with pytest.raises(ValidationError) as caught:
        rule_save(route=route, name="everything", channels=[])
    assert set(caught.value.message_dict) == {"__all__", "channels"}
    assert RouteRule.objects.count() == 0


@pytest.mark.django_db
def test_it_saves_rules_in_order(team_setup):
    from panel.channels.models import Route
    from panel.channels.rules import rule_delete, rule_move
    team = team_setup["team_a"]
    route = Route.objects.create(team=team, model_name="chat")
    a = Channel.objects.create(team=team, name="a", base_url="http://127.0.0.1:9/v1", model_id="m")
    b = Channel.objects.create(team=team, name="b", base_url="http://127.0.0.1:9/v1", model_id="m")
    first = rule_save(route=route, name="tools", tools="with", channels=[b, a])
    second = rule_save(route=route, name="batch", header_name="X-Workload", header_value="batch", channels=[a])
    assert [r.name for r in route.rules.all()] == ["tools", "batch"] and second.header_name == "x-workload"
    assert first.channel_list() == [b, a]
    rule_move(rule=second, offset=-1)
    assert [r.name for r in route.rules.all()] == ["batch", "tools"]
    rule_delete(rule=first)
    assert [r.name for r in route.rules.all()] == ["batch"]


def test_a_short_tool_request_goes_to_one_channel_and_a_long_one_to_another(gateway, setup, primary, fallback):
    # "Tools and under 4,000 input tokens -> local; the rest -> cloud": the route's own list puts the cloud first.
    route = setup["route"]
    route.strategy = "priority"
    route.save()
    route.routechannel_set.filter(channel=setup["local"]).update(position=5)
    short = rule_save(route=route, name="short tool calls", tools="with", tokens_under=4000, channels=[setup["local"]])
    tool_call = {**CHAT, "tools": TOOLS}
    long_call = {**CHAT, "messages": [{"role": "user", "content": "read this file " * 2000}], "tools": TOOLS}
    assert post(gateway, setup["raw"], tool_call).status_code == 200
    assert post(gateway, setup["raw"], long_call).status_code == 200
    assert post(gateway, setup["raw"], CHAT).status_code == 200  # no tools: the route's own list
    assert len(primary.requests) == 1 and len(fallback.requests) == 2
    assert primary.requests[0].json["tools"] and "read this file" in fallback.requests[0].json["messages"][0]["content"]
    first, second, third = records(3)
    assert (first.route_rule_id, first.channel) == (short.pk, setup["local"])
    assert (second.route_rule_id, second.channel) == (None, setup["cloud"])
    assert (third.route_rule_id, third.channel) == (None, setup["cloud"])


def test_a_rule_falls_back_over_its_own_channels(gateway, setup, primary, fallback):
    rule = rule_save(route=setup["route"], name="tools to the cloud", tools="with",
                     channels=[setup["cloud"], setup["local"]])
    fallback.behave("status_503", times=5)
    assert post(gateway, setup["raw"], {**CHAT, "tools": TOOLS}).status_code == 200
    [row] = records(1)
    assert (row.route_rule_id, row.channel, row.fell_back) == (rule.pk, setup["local"], True)
    assert len(fallback.requests) >= 1 and len(primary.requests) == 1
