"""The gateway's Anthropic Messages endpoint against local fake providers, with the official anthropic SDK (sync,
async, streaming, a tool-use round trip): passed through to a channel that speaks Messages, translated to one that
speaks only chat completions, and a chat client translated to a Messages-only channel. Errors in the shape each SDK
expects, and the usage record and cost of each request (cache reads and writes priced)."""
import json
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest

from panel.accounts.keys import key_issue
from panel.channels.rules import input_token_estimate
from tests.support import client_shapes
from tests.support.fake_messages_upstream import TOOL_INPUT
from tests.support.gateway import records, route_to
from tests.support.messages_gateway import anthropic_fake, chat_fake, client_for, gateway, setup  # noqa: F401 (fixtures)
from tests.support.waiting import run_coroutine

TOOLS = [{"name": "read_file", "description": "Read a file of the repository.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
                           "required": ["path"]}}]
REVIEW = [{"role": "user", "content": "Review the change in src/app.py please"}]


def test_it_passes_a_messages_request_through_with_x_api_key_and_prices_cache_reads_and_writes(gateway, setup,
                                                                                                anthropic_fake):
    reply = client_for(gateway, setup["raw"]).messages.create(
        model="claude", max_tokens=50, system="You review code.", messages=REVIEW)
    assert reply.type == "message" and reply.model == "claude" and reply.stop_reason == "end_turn"
    assert reply.content[0].text == "alpha bravo charlie delta echo foxtrot"
    assert (reply.usage.cache_read_input_tokens, reply.usage.cache_creation_input_tokens) == (3, 2)
    sent = anthropic_fake.requests[-1]
    assert sent.path == "/v1/messages" and sent.json["model"] == "claude-fake"
    assert sent.json["system"] == "You review code." and sent.json["messages"] == REVIEW
    assert sent.headers["x-api-key"] == "sk-ant-0000" and "authorization" not in sent.headers
    [row] = records()
    assert (row.endpoint, row.outcome, row.status_code, row.channel, row.stream) == (
        "messages", "ok", 200, setup["cloud"], False)
    prompt = reply.usage.input_tokens + 3 + 2
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens, row.cache_write_tokens) == (prompt, 6, 3, 2)
    expected = (Decimal(prompt - 5) * 3 + Decimal(3) * Decimal("0.3") + Decimal(2) * Decimal("3.75")
                + Decimal(6) * 15) / 10**6
    assert row.cost == expected and row.system_prompt_hash


def test_it_streams_anthropic_events_through_to_the_async_sdk(gateway, setup):
    async def run():
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=setup["raw"], max_retries=0)
        kinds = []
        async with client.messages.stream(model="claude", max_tokens=50, messages=REVIEW) as stream:
            async for event in stream:
                kinds.append(event.type)
            return kinds, await stream.get_final_message()

    kinds, final = run_coroutine(run())
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text == "alpha bravo charlie delta echo foxtrot" and final.model == "claude"
    assert final.usage.output_tokens == 6 and final.usage.cache_read_input_tokens == 3
    [row] = records()
    assert (row.endpoint, row.stream, row.outcome, row.completion_tokens, row.cached_tokens) == (
        "messages", True, "ok", 6, 3)
    assert row.ttft_ms is not None


def tool_round_trip(client, model, **extra):
    """Ask with a tool, get a tool_use, answer it with a tool_result, get text: the agent loop's two turns."""
    first = client.messages.create(model=model, max_tokens=60, tools=TOOLS, messages=REVIEW, **extra)
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and call.name == "read_file" and call.input == TOOL_INPUT
    history = REVIEW + [{"role": "assistant", "content": [block.model_dump() for block in first.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                      "content": "def main(): pass"}]}]
    second = client.messages.create(model=model, max_tokens=60, tools=TOOLS, messages=history, **extra)
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"
    return call


def test_a_tool_use_round_trip_passes_through_and_is_translated_to_a_chat_channel(gateway, setup, anthropic_fake,
                                                                                 chat_fake):
    client = client_for(gateway, setup["raw"])
    tool_round_trip(client, "claude")
    call = tool_round_trip(client, "local")
    first, second = chat_fake.requests[-2:]
    assert first.path == "/v1/chat/completions" and first.headers["authorization"] == "Bearer sk-chat-1111"
    assert first.json["tools"][0] == {"type": "function", "function": {
        "name": "read_file", "parameters": TOOLS[0]["input_schema"], "description": "Read a file of the repository."}}
    assert second.json["messages"][1]["tool_calls"][0]["id"] == call.id
    assert second.json["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "def main(): pass"}
    rows = records(4)
    assert [row.channel for row in rows] == [setup["cloud"]] * 2 + [setup["chat"]] * 2
    assert all(row.endpoint == "messages" and row.outcome == "ok" for row in rows)
    assert rows[2].completion_tokens == 9  # the chat channel's usage, translated


def test_a_streamed_tool_call_is_translated_from_chat_chunks_to_anthropic_events(gateway, setup, chat_fake):
    client = client_for(gateway, setup["raw"])
    with client.messages.stream(model="local", max_tokens=60, tools=TOOLS, messages=REVIEW) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use" and final.content[0].input == TOOL_INPUT
    assert final.usage.output_tokens == 9
    assert chat_fake.requests[-1].json["stream_options"] == {"include_usage": True}
    with client.messages.stream(model="local", max_tokens=60, messages=REVIEW) as stream:
        assert "".join(stream.text_stream) == "alpha bravo charlie delta echo foxtrot"
    rows = records(2)
    assert [(row.stream, row.outcome, row.completion_tokens) for row in rows] == [(True, "ok", 9), (True, "ok", 6)]


def test_a_chat_client_is_translated_to_a_messages_only_channel_whole_and_streamed(gateway, setup, anthropic_fake):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    chat_tools = [{"type": "function", "function": {"name": "read_file", "parameters": TOOLS[0]["input_schema"]}}]
    answer = client.chat.completions.create(model="claude", max_tokens=40, tools=chat_tools,
                                            messages=[{"role": "system", "content": "Be brief."}, *REVIEW])
    call = answer.choices[0].message.tool_calls[0]
    assert answer.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == TOOL_INPUT
    sent = anthropic_fake.requests[-1].json
    assert sent["system"] == "Be brief." and sent["tools"][0]["input_schema"] == TOOLS[0]["input_schema"]
    chunks = list(client.chat.completions.create(model="claude", max_tokens=40, messages=REVIEW, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 3
    rows = records(2)
    assert [(row.endpoint, row.outcome, row.cached_tokens, row.cache_write_tokens) for row in rows] == [
        ("chat", "ok", 3, 2), ("chat", "ok", 3, 2)]


def test_refusals_have_anthropic_error_shapes_the_sdk_raises(gateway, setup, anthropic_fake):
    client = client_for(gateway, setup["raw"])
    with pytest.raises(anthropic.AuthenticationError):
        client_for(gateway, "tw-not-a-key").messages.create(model="claude", max_tokens=5, messages=REVIEW)
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        client.messages.create(model="nobody", max_tokens=5, messages=REVIEW)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="claude", max_tokens=0, messages=REVIEW)
    with pytest.raises(anthropic.BadRequestError, match="'service_tier' has no counterpart in chat completions"):
        client.messages.create(model="local", max_tokens=50, messages=REVIEW, extra_body={"service_tier": "auto"})
    _, narrow = key_issue(team=setup["team"], user=None, name="narrow", allowed_models=["local"])
    with pytest.raises(anthropic.PermissionDeniedError):
        client_for(gateway, narrow).messages.create(model="claude", max_tokens=5, messages=REVIEW)
    _, slow = key_issue(team=setup["team"], user=None, name="slow", rpm_limit=1)
    client_for(gateway, slow).messages.create(model="claude", max_tokens=5, messages=REVIEW)
    with pytest.raises(anthropic.RateLimitError):
        client_for(gateway, slow).messages.create(model="claude", max_tokens=5, messages=REVIEW)
    anthropic_fake.behave("status_503")
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(model="claude", max_tokens=5, messages=REVIEW)
    assert failed.value.status_code == 502 and failed.value.body["error"]["type"] == "api_error"
    raw = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": setup["raw"]},
                     json={"model": "claude", "max_tokens": 5, "messages": "hello"})
    assert raw.status_code == 400 and raw.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages: a non-empty list is required"}}
    rows = records(9)
    assert [row.status_code for row in rows] == [401, 404, 400, 400, 403, 200, 429, 502, 400]
    assert all(row.endpoint == "messages" for row in rows)


def test_a_budget_spent_by_messages_refuses_the_next_chat_request(gateway, setup):
    from panel.budgets.reservations import prompt_bound
    from panel.budgets.services import budget_set

    most = prompt_bound({"messages": REVIEW}).tokens + 50  # room for this request's most, and no more
    budget_set(team=setup["team"], key=setup["key"], tokens_per_month=most, user=setup["alice"])
    client_for(gateway, setup["raw"]).messages.create(model="claude", max_tokens=50, messages=REVIEW)
    refused = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"Authorization": f"Bearer {setup['raw']}"},
                         json={"model": "local", "max_tokens": 50, "messages": REVIEW}, timeout=30)
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "budget_exceeded"
    with pytest.raises(anthropic.APIStatusError) as spent:
        client_for(gateway, setup["raw"]).messages.create(model="claude", max_tokens=50, messages=REVIEW)
    assert spent.value.status_code == 402 and spent.value.body["error"]["type"] == "billing_error"


def test_count_tokens_passes_through_to_a_messages_channel_and_estimates_for_a_chat_only_one_in_a_header(
        gateway, setup, anthropic_fake, chat_fake):
    client = client_for(gateway, setup["raw"])
    counted = client.messages.with_raw_response.count_tokens(model="claude", system="You review code.",
                                                             messages=REVIEW)
    assert counted.parse().input_tokens == 9 and anthropic_fake.requests[-1].path == "/v1/messages/count_tokens"
    assert "x-tokenwise-token-count" not in counted.headers  # the provider counted
    # No channel of the route can count: the gateway's estimate, marked as one; nothing is sent upstream.
    sent = len(chat_fake.requests)
    estimated = client.messages.with_raw_response.count_tokens(model="local", messages=REVIEW)
    assert estimated.parse().input_tokens == input_token_estimate({"messages": REVIEW}) > 0
    assert estimated.headers["x-tokenwise-token-count"].startswith("estimate") and len(chat_fake.requests) == sent
    shape = client_shapes.load("claude_code_2_1_332")["body"]  # Claude Code counts its whole context
    reply = httpx.post(f"{gateway.url}/v1/messages/count_tokens", headers={"x-api-key": setup["raw"]},
                       json={key: value for key, value in dict(shape, model="local").items()
                             if key not in ("max_tokens", "stream")}, timeout=10)
    assert reply.status_code == 200 and reply.json()["input_tokens"] > 10_000, reply.text


def test_responses_and_embeddings_pass_through_to_an_openai_channel_with_usage_rows(gateway, setup, chat_fake):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    chat_fake.cached_tokens = 2
    response = client.responses.create(model="local", input="summarise the diff of src/app.py")
    assert response.output_text == "alpha bravo charlie delta echo foxtrot" and response.model == "local"
    streamed = client.responses.create(model="local", input="summarise it again", stream=True)
    kinds = [event.type for event in streamed]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    vectors = client.embeddings.create(model="local", input=["one two", "three"])
    assert [item.embedding for item in vectors.data] == [[0.25, -0.5, 0.125]] * 2
    assert [request.path for request in chat_fake.requests] == ["/v1/responses", "/v1/responses", "/v1/embeddings"]
    with pytest.raises(openai.BadRequestError, match="only the Anthropic Messages API"):
        client.embeddings.create(model="claude", input="one")
    rows = records(4)
    assert [(row.endpoint, row.stream, row.prompt_tokens, row.completion_tokens, row.cached_tokens)
            for row in rows[:3]] == [("responses", False, 5, 6, 2), ("responses", True, 3, 6, 2),
                                     ("embeddings", False, 3, 0, 0)]
    assert rows[0].cost == (Decimal(5 - 2) * 1 + Decimal(6) * 2) / 10**6 and rows[3].status_code == 400


def test_a_messages_request_falls_back_from_a_failing_chat_channel_to_a_messages_one(gateway, setup, chat_fake,
                                                                                    anthropic_fake):
    route_to(setup["team"], "mixed", setup["chat"], setup["cloud"])
    chat_fake.behave("status_503")
    reply = client_for(gateway, setup["raw"]).messages.create(model="mixed", max_tokens=50, messages=REVIEW)
    assert reply.content[0].text == "alpha bravo charlie delta echo foxtrot"
    [row] = records()
    assert (row.outcome, row.channel, row.fell_back, row.attempts) == ("ok", setup["cloud"], True, 3)
    assert [step["outcome"] for step in row.attempt_trail] == ["upstream_error", "upstream_error", "ok"]


def test_a_stream_cut_after_its_first_event_ends_with_an_anthropic_error_event(gateway, setup, anthropic_fake):
    anthropic_fake.behave("cut_stream", times=1, after=3)
    with httpx.stream("POST", f"{gateway.url}/v1/messages", headers={"x-api-key": setup["raw"]}, timeout=30,
                      json={"model": "claude", "max_tokens": 50, "stream": True, "messages": REVIEW}) as response:
        lines = [line for line in response.iter_lines() if line]
    events = [line[7:] for line in lines if line.startswith("event: ")]
    assert events == ["message_start", "ping", "content_block_start", "error"]
    error = json.loads(lines[-1][6:])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    [row] = records()
    assert (row.outcome, row.status_code, row.stream) == ("upstream_cut", 502, True)
