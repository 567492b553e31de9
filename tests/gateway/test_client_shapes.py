"""Conformance with what real clients send: every captured request shape (tests/support/fixtures/clients/, written by
tests/support/client_shapes.py; the README names the clients and versions) sent through the gateway, streamed and
not, to a channel that speaks the client's API (passed through: the upstream gets the body as sent, the model
renamed) and to one that needs it translated (Messages <-> chat completions; Responses -> chat completions for a
channel set to chat completions only, whose provider answers 404 to /v1/responses). A Messages-only channel is
skipped for a Responses request, and refused in words when it is the route's only one.

Each answer must be well formed for the client's API (a body, or a stream whose events open and close as the API
says), and each request leaves one usage row whose figures are the ones the client's answer reports."""
import json
from decimal import Decimal

import httpx
import pytest

from panel.channels.models import Channel
from panel.gateway import deferred_tools
from panel.gateway.responses_translation import responses_request_to_chat
from panel.gateway.translation import dropped_for_chat
from panel.serving.models import Deployment, ServingProfile
from tests.support import client_shapes
from tests.support.channels import make_deployment
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.gateway import channel, records, route_to
from tests.support.messages_gateway import anthropic_fake, chat_fake, gateway, setup  # noqa: F401 (fixtures)

MESSAGES = ["claude_code_2_1_332", "claude_code_2_1_332_tool_turn", "claude_code_2_1_332_tool_search",
            "anthropic_python_2_14_0_tool_turn"]
CHAT = ["openai_python_3_57_0_chat_tool_turn"]
RESPONSES = ["openai_python_3_57_0_responses", "openai_python_3_57_0_responses_tool_turn", "codex_0_171_0",
             "codex_0_171_0_tool_turn"]
STEERING = ("thinking", "output_config", "context_management")


def ask(gateway, raw, shape, model, stream):
    """(status, headers, the answer: a JSON body, or a stream's [(event name, data)] with [DONE] as ("", "[DONE]"))."""
    headers = {**shape["headers"], "authorization": f"Bearer {raw}"}
    body = dict(shape["body"], model=model, stream=stream)
    with httpx.stream("POST", f"{gateway.url}{shape['path']}", json=body, headers=headers, timeout=30) as reply:
        if reply.status_code != 200 or not stream:
            return reply.status_code, reply.headers, json.loads(reply.read())
        events, name = [], ""
        for line in reply.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
                events.append((name, data if data == "[DONE]" else json.loads(data)))
                name = ""
        return reply.status_code, reply.headers, events


# ------------------------------------------------------------------------------------------------- well formed

def messages_answer(answer, stream):
    """The usage a Messages answer reports, after checking it is one: a message, or message_start, blocks opened,
    filled and closed in order (a tool_use's input JSON when whole), message_delta and message_stop."""
    if not stream:
        assert answer["type"] == "message" and answer["role"] == "assistant" and answer["id"].startswith("msg_")
        assert answer["stop_reason"] in ("end_turn", "tool_use", "max_tokens", "stop_sequence")
        for block in answer["content"]:
            assert block["type"] == "text" and isinstance(block["text"], str) or (
                block["type"] == "tool_use" and isinstance(block["input"], dict) and block["id"])
        return answer["usage"]
    assert all(name == data["type"] for name, data in answer), answer
    kinds = [data["type"] for _, data in answer]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert answer[0][1]["message"]["id"].startswith("msg_")
    usage, open_block, closed = dict(answer[0][1]["message"]["usage"]), None, 0
    for _, event in answer[1:]:
        if event["type"] == "content_block_start":
            assert open_block is None and event["index"] == closed
            open_block = dict(event["content_block"], partial="")
        elif event["type"] == "content_block_delta":
            assert event["index"] == closed and open_block is not None
            open_block["partial"] += event["delta"].get("partial_json", "")
        elif event["type"] == "content_block_stop":
            assert event["index"] == closed and open_block is not None
            if open_block["type"] == "tool_use":
                assert isinstance(json.loads(open_block["partial"] or "{}"), dict)
            open_block, closed = None, closed + 1
        elif event["type"] == "message_delta":
            assert open_block is None and event["delta"]["stop_reason"]
            usage.update(event["usage"])
    return usage


def chat_answer(answer, stream):
    """The usage a chat completion reports, after checking it is one: a chat.completion, or chunks (each a
    chat.completion.chunk), a finish reason, the usage chunk the client asked for, then [DONE]."""
    if not stream:
        assert answer["object"] == "chat.completion" and answer["id"]
        [choice] = answer["choices"]
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length", "tool_calls")
        for call in choice["message"].get("tool_calls") or []:
            assert isinstance(json.loads(call["function"]["arguments"]), dict) and call["id"]
        return answer["usage"]
    assert answer[-1] == ("", "[DONE]")
    chunks = [data for _, data in answer[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    assert chunks[-1]["choices"] == []
    return chunks[-1]["usage"]


def responses_answer(answer, stream):
    """The usage a Responses answer reports, after checking it is one: a response, or named events from
    response.created to response.completed whose names are their types, each output item added, filled and done in
    order (a function call's arguments whole JSON), the last event's output the items done."""
    if not stream:
        assert answer["object"] == "response" and answer["status"] == "completed"
        assert isinstance(answer["output"], list)
        for item in answer["output"]:
            if item["type"] == "function_call":
                assert isinstance(json.loads(item["arguments"]), dict) and item["call_id"]
        return answer["usage"]
    assert all(name == data["type"] for name, data in answer), answer
    assert answer[0][0] == "response.created" and answer[-1][0] == "response.completed"
    open_item, done = None, []
    for name, event in answer[1:-1]:
        if name == "response.output_item.added":
            assert open_item is None and event["output_index"] == len(done)
            open_item = event["item"]
        elif name == "response.output_item.done":
            assert open_item is not None and event["output_index"] == len(done)
            assert event["item"]["id"] == open_item["id"] and event["item"]["type"] == open_item["type"]
            if event["item"]["type"] == "function_call":
                assert isinstance(json.loads(event["item"]["arguments"]), dict)
            open_item = done.append(event["item"])
        elif "item_id" in event:
            assert open_item is not None and event["item_id"] == open_item["id"]
    assert open_item is None and answer[-1][1]["response"]["output"] == done
    return answer[-1][1]["response"]["usage"]


def row_figures(usage, api):
    """The usage row's (prompt, completion, cached) from what the client was told."""
    if api == "messages":
        read, written = usage.get("cache_read_input_tokens") or 0, usage.get("cache_creation_input_tokens") or 0
        return usage["input_tokens"] + read + written, usage["output_tokens"], read
    if api == "chat":
        return (usage["prompt_tokens"], usage["completion_tokens"],
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return usage["input_tokens"], usage["output_tokens"], usage["input_tokens_details"]["cached_tokens"]


def check_row(row, usage, api, endpoint, stream, channel):
    assert (row.endpoint, row.outcome, row.status_code, row.stream, row.channel) == (endpoint, "ok", 200, stream,
                                                                                      channel)
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == row_figures(usage, api)
    assert row.prompt_tokens > 0 and row.completion_tokens > 0 and not row.tokens_estimated


# ------------------------------------------------------------------------------------------------- the clients

@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("captured", MESSAGES)
def test_a_messages_clients_captured_request_passes_through_as_sent_and_is_translated_to_a_chat_channel(
        gateway, setup, anthropic_fake, chat_fake, captured, stream):
    shape = client_shapes.load(captured)
    body = dict(shape["body"], stream=stream)

    # A channel that speaks Messages gets the body as the client wrote it, with the betas it was written for.
    status, headers, answer = ask(gateway, setup["raw"], shape, "claude", stream)
    assert status == 200, answer
    sent = anthropic_fake.requests[-1]
    assert sent.path == "/v1/messages" and sent.json == dict(body, model="claude-fake")
    assert sent.headers.get("anthropic-beta") == shape["headers"].get("anthropic-beta")
    assert "x-tokenwise-adapted" not in headers
    passed = messages_answer(answer, stream)

    # A chat-only channel: translated; what steers only an Anthropic model dropped, deferred tools not yet found
    # held, and both named.
    status, headers, answer = ask(gateway, setup["raw"], shape, "local", stream)
    assert status == 200, answer
    sent = chat_fake.requests[-1].json
    assert sent["model"] == "chat-fake" and not set(STEERING) & set(sent)
    held = deferred_tools.held(body)
    assert [tool["function"]["name"] for tool in sent.get("tools", [])] == [
        tool["name"] for tool in body.get("tools", []) if tool["name"] not in held]
    called = [call["id"] for message in sent["messages"] for call in message.get("tool_calls") or []]
    assert [message["tool_call_id"] for message in sent["messages"] if message["role"] == "tool"] == called
    assert [message["role"] for message in sent["messages"]][:3] == (
        ["system", "user", "system"] if captured.startswith("claude_code") else ["system", "user", "assistant"])
    changes = [f"{name} dropped" for name in dropped_for_chat(body)] + deferred_tools.held_words(body)
    assert headers.get("x-tokenwise-adapted") == ("; ".join(changes) or None)
    translated = messages_answer(answer, stream)

    rows = records(2)
    check_row(rows[0], passed, "messages", "messages", stream, setup["cloud"])
    check_row(rows[1], translated, "messages", "messages", stream, setup["chat"])
    if captured.startswith("claude_code"):  # one session, by metadata.user_id
        assert rows[0].session_id and rows[0].session_id == rows[1].session_id


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("captured", CHAT)
def test_a_chat_clients_captured_request_passes_through_as_sent_and_is_translated_to_a_messages_channel(
        gateway, setup, anthropic_fake, chat_fake, captured, stream):
    shape = client_shapes.load(captured)
    body = dict(shape["body"], stream=stream)

    # Passed through: the body as sent; the gateway asks for a stream with usage itself, whatever the client asked.
    status, headers, answer = ask(gateway, setup["raw"], shape, "local", stream)
    assert status == 200, answer
    sent = chat_fake.requests[-1].json
    assert {name: value for name, value in sent.items() if name not in ("stream", "stream_options")} == {
        name: value for name, value in dict(body, model="chat-fake").items() if name not in ("stream",
                                                                                         "stream_options")}
    passed = chat_answer(answer, stream)

    # A Messages-only channel: translated, the tool call and its result as tool_use and tool_result.
    status, headers, answer = ask(gateway, setup["raw"], shape, "claude", stream)
    assert status == 200, answer
    sent = anthropic_fake.requests[-1].json
    assert sent["model"] == "claude-fake" and sent["max_tokens"] == body["max_completion_tokens"]
    calls = [block for message in sent["messages"] for block in message["content"] if block["type"] == "tool_use"]
    results = [block for message in sent["messages"] for block in message["content"]
               if block["type"] == "tool_result"]
    assert [call["id"] for call in calls] == [result["tool_use_id"] for result in results] != []
    translated = chat_answer(answer, stream)

    rows = records(2)
    check_row(rows[0], passed, "chat", "chat", stream, setup["chat"])
    check_row(rows[1], translated, "chat", "chat", stream, setup["cloud"])


@pytest.fixture
def chat_only(setup):
    """A provider that speaks chat completions without the Responses API (its /v1/responses answers 404), on route
    "chat-only" through a channel set to chat completions only."""
    with FakeMessagesUpstream(models=("plain-fake",), api_key="sk-plain-2222", apis="chat", responses=False,
                              chunks=6, cached_tokens=2) as fake:
        plain = channel(setup["team"], "plain", fake, "plain-fake", key="sk-plain-2222", apis="chat_only",
                        price_input_per_million=Decimal("1.25"), price_output_per_million=Decimal("10"),
                        price_cached_per_million=Decimal("0.125"))
        route_to(setup["team"], "chat-only", plain)
        yield fake, plain


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("captured", RESPONSES)
def test_a_responses_clients_captured_request_is_translated_for_a_channel_without_the_responses_api(
        gateway, setup, chat_only, captured, stream):
    fake, plain = chat_only
    shape = client_shapes.load(captured)
    body = dict(shape["body"], stream=stream)
    chat, changes = responses_request_to_chat(body)

    status, headers, answer = ask(gateway, setup["raw"], shape, "chat-only", stream)
    assert status == 200, answer
    [sent] = fake.requests
    assert sent.path == "/v1/chat/completions" and sent.json["model"] == "plain-fake"
    assert sent.json["messages"] == chat["messages"] and sent.json.get("tools") == chat.get("tools")
    assert not {"input", "instructions", "include", "reasoning", "store", "client_metadata"} & set(sent.json)
    called = [call["id"] for message in sent.json["messages"] for call in message.get("tool_calls") or []]
    assert [message["tool_call_id"] for message in sent.json["messages"] if message["role"] == "tool"] == called
    assert headers.get("x-tokenwise-adapted") == ("; ".join(changes) or None)
    if captured.startswith("codex"):  # its web_search tool, reasoning and include named, never silently dropped
        assert "web_search tool dropped" in headers["x-tokenwise-adapted"]
    usage = responses_answer(answer, stream)
    output = answer["output"] if not stream else answer[-1][1]["response"]["output"]
    # The provider calls the first tool when no tool's output is in the conversation yet, else answers in text.
    expected = "function_call" if not called and body.get("tools") else "message"
    assert [item["type"] for item in output] == [expected]

    [row] = records(1)
    check_row(row, usage, "responses", "responses", stream, plain)
    # the provider's cached tokens reach the row, billed at the cached price
    assert row.cached_tokens == 2 and row.cost == plain.cost(row.prompt_tokens, row.completion_tokens, 2) > 0


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("captured", RESPONSES)
def test_a_responses_clients_captured_request_passes_through_to_an_openai_channel_and_skips_a_messages_one(
        gateway, setup, anthropic_fake, chat_fake, captured, stream):
    shape = client_shapes.load(captured)
    body = dict(shape["body"], stream=stream)
    route_to(setup["team"], "mixed", setup["cloud"], setup["chat"])

    status, _, answer = ask(gateway, setup["raw"], shape, "local", stream)
    assert status == 200, answer
    sent = chat_fake.requests[-1]
    assert sent.path == "/v1/responses" and sent.json == dict(body, model="chat-fake")
    passed = responses_answer(answer, stream)

    # A route whose first channel speaks only Messages: that one is passed over, the OpenAI one answers.
    status, _, answer = ask(gateway, setup["raw"], shape, "mixed", stream)
    assert status == 200, answer
    skipped = responses_answer(answer, stream)
    assert not anthropic_fake.requests

    # Its only channel speaks Messages: refused in words, in the OpenAI error shape.
    status, _, answer = ask(gateway, setup["raw"], shape, "claude", stream)
    assert status == 400 and "only to channels that speak the OpenAI API" in answer["error"]["message"]

    rows = records(3)
    check_row(rows[0], passed, "responses", "responses", stream, setup["chat"])
    check_row(rows[1], skipped, "responses", "responses", stream, setup["chat"])
    assert (rows[2].status_code, rows[2].error_kind) == (400, "not_translatable")


@pytest.fixture
def engine(setup):
    """A local engine's channel on route "engine": a ready deployment whose profile has 256 tokens of context and
    tool calling, its engine a fake that speaks both APIs (as vLLM does: /v1/messages beside the OpenAI ones)."""
    with FakeMessagesUpstream(models=("tiny-served",), apis="both", chunks=6) as fake:
        deployment = make_deployment(setup["team"], setup["alice"], "engine", served="tiny-served", state="ready",
                                     port=fake.port)
        Deployment.objects.filter(pk=deployment.pk).update(base_url=fake.base_url)
        ServingProfile.objects.filter(pk=deployment.profile_id).update(max_model_len=256, tool_call_parser="hermes")
        local = channel(setup["team"], "engine", fake, "tiny-served", kind="local", apis="both")
        Channel.objects.filter(pk=local.pk).update(deployment=deployment)
        route_to(setup["team"], "engine", local)
        yield fake


@pytest.mark.parametrize("stream", [True, False])
def test_a_local_engine_gets_deferred_tools_and_tool_references_as_sent_and_every_answer_limit_fitted_to_it(
        gateway, setup, engine, stream):
    # vLLM 0.32's /v1/messages takes defer_loading and tool_reference blocks and hands them to the chat template:
    # passed through as Claude Code wrote them, only its 32,000-token answer limit lowered to the context.
    shape = client_shapes.load("claude_code_2_1_332_tool_search")
    status, headers, answer = ask(gateway, setup["raw"], shape, "engine", stream)
    assert status == 200, answer
    sent = engine.requests[-1]
    assert sent.path == "/v1/messages" and sent.json == dict(shape["body"], model="tiny-served", stream=stream,
                                                             max_tokens=256)
    assert headers["x-tokenwise-adapted"] == "max_tokens lowered from 32000 to 256 (the model's context)"
    messages_answer(answer, stream)

    # A Responses request's limit is max_output_tokens, which vLLM refuses over its context as well.
    shape = client_shapes.load("openai_python_3_57_0_responses")
    status, headers, answer = ask(gateway, setup["raw"], shape, "engine", stream)
    assert status == 200, answer
    sent = engine.requests[-1]
    assert sent.path == "/v1/responses" and sent.json == dict(shape["body"], model="tiny-served", stream=stream,
                                                              max_output_tokens=256)
    assert headers["x-tokenwise-adapted"] == "max_output_tokens lowered from 512 to 256 (the model's context)"
    responses_answer(answer, stream)
    assert [(row.endpoint, row.outcome) for row in records(2)] == [("messages", "ok"), ("responses", "ok")]
