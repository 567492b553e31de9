"""Translation between Anthropic Messages and OpenAI chat completions, both ways, streams included, and the checks
on a Messages request: what translates, what is refused in words (never dropped), and usage with cached tokens."""
import json
from types import SimpleNamespace

import pytest

from panel.channels.routing import Target
from panel.gateway import deferred_tools
from panel.gateway.apis import Passage, clamp_to_context, messages_usage
from panel.gateway.messages_api import MessagesRequestError, error_body, parse_messages_request, sse_event
from panel.gateway.translation import (
    ChatStreamToMessages,
    MalformedAnswer,
    MessagesStreamToChat,
    NotTranslatable,
    chat_request_to_messages,
    chat_response_to_messages,
    dropped_for_chat,
    messages_request_to_chat,
    messages_response_to_chat,
)
from tests.support import client_shapes

WEATHER_TOOL = {"name": "get_weather", "description": "Weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
AGENT_TURNS = {
    "model": "claude-sonnet", "max_tokens": 256, "system": [{"type": "text", "text": "You review code."},
                                                           {"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, dry"},
                                     {"type": "text", "text": "And tomorrow?"}]},
    ],
    "tools": [WEATHER_TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"], "temperature": 0.2, "top_k": 40, "metadata": {"user_id": "dev-42"},
}


def test_a_messages_request_becomes_a_chat_request_with_its_tools():
    chat = messages_request_to_chat(AGENT_TURNS, model_id="qwen-local")
    assert chat["model"] == "qwen-local" and chat["max_tokens"] == 256
    assert chat["messages"] == [
        {"role": "system", "content": "You review code.\n\nBe brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, dry"},  # right after the call
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER_TOOL["input_schema"], "description": "Weather in a city"}}]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    assert (chat["stop"], chat["temperature"], chat["top_k"], chat["user"]) == (["END"], 0.2, 40, "dev-42")
    assert "stream" not in chat


def test_images_errors_and_choices_translate_to_chat():
    body = {"model": "m", "max_tokens": 8, "stream": True, "tool_choice": {"type": "tool", "name": "get_weather"},
            "tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                {"type": "tool_result", "tool_use_id": "toolu_9", "is_error": True,
                 "content": [{"type": "text", "text": "timeout"}]}]}]}
    chat = messages_request_to_chat(body, model_id="m")
    assert chat["messages"][0] == {"role": "tool", "tool_call_id": "toolu_9", "content": "Error: timeout"}
    assert chat["messages"][1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert messages_request_to_chat({**body, "tool_choice": {"type": "any"}}, model_id="m")["tool_choice"] == "required"


@pytest.mark.parametrize("change, words", [
    ({"container": "container_01"}, "'container'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}]}, "'document' block"),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}]}]},
     "'server_tool_use' block"),
    ({"system": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}]},
     "the system prompt"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "'file'"),
])
def test_what_chat_cannot_express_is_refused_in_words(change, words):
    with pytest.raises(NotTranslatable) as refused:
        messages_request_to_chat({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                                  **change}, model_id="m")
    assert words in str(refused.value)


def test_claude_codes_request_is_accepted_and_reaches_chat_with_what_was_dropped_named():
    body = client_shapes.load("claude_code_2_1_332")["body"]
    assert parse_messages_request(body) is body  # a mid-conversation system message, adaptive thinking, effort...
    assert dropped_for_chat(body) == ["thinking", "output_config", "context_management"]
    chat = messages_request_to_chat(body, model_id="m")
    # The system prompt first, the user's turn, then Claude Code's context as a system message where it was sent.
    assert [message["role"] for message in chat["messages"]] == ["system", "user", "system"]
    assert chat["messages"][2]["content"] == body["messages"][1]["content"][0]["text"]
    assert not {"thinking", "output_config", "context_management"} & set(chat) and chat["max_tokens"] == 32000
    # Every tool but its DeferredToolPlaceholder (deferred, and never found by a search: held).
    assert [tool["function"]["name"] for tool in chat["tools"]] == [
        tool["name"] for tool in body["tools"] if tool["name"] != "DeferredToolPlaceholder"]
    assert json.loads(chat["user"])["session_id"] == "00000000-0000-4000-8000-000000000001"

    # A later turn after a cloud model thought: its thinking is the model's own and a chat model takes none.
    later = dict(body, thinking={"type": "disabled"}, output_config=None, context_management=None, messages=[
        *body["messages"], {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants a greeting.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "Hi!"}]},
        {"role": "user", "content": "Thanks"}])
    assert dropped_for_chat(later) == ["thinking blocks of earlier turns"]  # "disabled" changes nothing
    assert messages_request_to_chat(later, model_id="m")["messages"][3] == {"role": "assistant", "content": "Hi!"}


def test_deferred_tools_reach_chat_once_the_conversation_has_loaded_them_and_the_held_ones_are_counted():
    # Claude Code's ToolSearch found NotebookEdit: the tool joins the list (still deferred) and a tool_reference
    # names it in the search's result.
    body = client_shapes.load("claude_code_2_1_332_tool_search")["body"]
    assert parse_messages_request(body) is body
    assert [tool["name"] for tool in body["tools"] if tool.get("defer_loading")] == [
        "NotebookEdit", "DeferredToolPlaceholder"]
    chat = messages_request_to_chat(body, model_id="m")
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert "NotebookEdit" in names and "DeferredToolPlaceholder" not in names
    assert not any("defer_loading" in json.dumps(tool) for tool in chat["tools"])
    assert chat["messages"][-1] == {"role": "tool", "tool_call_id": "toolu_01",
                                    "content": "Tool found and now available: NotebookEdit"}
    assert deferred_tools.held(body) == ["DeferredToolPlaceholder"]
    assert deferred_tools.held_words(body) == ["1 deferred tool held until tool search finds it"]

    deferred = [dict(WEATHER_TOOL, name=name, defer_loading=True) for name in ("forecast", "radar", "tides")]
    search = dict(WEATHER_TOOL, name="search_tools")
    asked = {"model": "m", "max_tokens": 64, "tools": [search, *deferred], "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "radar", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "Rain."}, {"type": "tool_reference", "tool_name": "forecast"},
            {"type": "tool_reference", "tool_name": "tides"}]}]}]}
    chat = messages_request_to_chat(asked, model_id="m")  # radar was called, forecast and tides were found
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["search_tools", "forecast", "radar", "tides"]
    assert chat["messages"][-1]["content"] == "Rain.\n\nTools found and now available: forecast, tides"
    fresh = dict(asked, messages=[{"role": "user", "content": "Weather?"}])
    assert deferred_tools.held_words(fresh) == ["3 deferred tools held until tool search finds them"]
    chosen = dict(fresh, tool_choice={"type": "tool", "name": "tides"})
    assert deferred_tools.held(chosen) == ["forecast", "radar"]
    assert deferred_tools.held(dict(fresh, tools=deferred)) == []  # no search tool left: all are sent
    passage = Passage("messages", fresh)
    passage.choose([SimpleNamespace(id=1, name="chat", loopback_ok=False, tool_calling=None, context_tokens=None,
                                    model_id="m", channel=SimpleNamespace(speaks=lambda api: api == "chat"))])
    passage.request(passage.targets[0], stream=False)
    assert passage.adapted[1] == ["3 deferred tools held until tool search finds them"]


def test_a_messages_answers_thinking_tokens_are_its_reasoning_tokens():
    usage = {"input_tokens": 5, "output_tokens": 10, "cache_read_input_tokens": 3,
             "output_tokens_details": {"thinking_tokens": 4}}  # Anthropic's thinking-token-count beta
    assert messages_usage(usage) == {"prompt_tokens": 8, "completion_tokens": 10, "cached_tokens": 3,
                                     "cache_write_tokens": 0, "reasoning_tokens": 4, "server_tool_calls": None}
    assert messages_usage({"input_tokens": 5, "output_tokens": 10})["reasoning_tokens"] is None  # not said


def test_an_answer_longer_than_a_local_engines_context_is_lowered_to_it_and_said():
    class Engine:
        context_tokens = 8192

    payload = {"max_tokens": 32000}
    assert clamp_to_context(payload, Engine) == ["max_tokens lowered from 32000 to 8192 (the model's context)"]
    assert payload == {"max_tokens": 8192}
    assert clamp_to_context({"max_completion_tokens": 100}, Engine) == []
    responses = {"max_output_tokens": 10000}  # a Responses request's limit, which vLLM refuses over its context too
    assert clamp_to_context(responses, Engine) == [
        "max_output_tokens lowered from 10000 to 8192 (the model's context)"] and responses["max_output_tokens"] == 8192
    Engine.context_tokens = None  # a cloud channel: its provider says what it allows
    assert clamp_to_context(payload := {"max_tokens": 32000}, Engine) == [] and payload["max_tokens"] == 32000


def test_a_request_that_lets_the_model_call_tools_skips_an_engine_without_tool_calling_and_says_why():
    def target(ident, **facts):
        return Target(id=ident, name=f"c{ident}", base_url="", model_id="m", api_key=None, credential_error="",
                      timeout=5.0, max_retries=0, backoff=1.0, channel=SimpleNamespace(speaks=lambda api: True),
                      **facts)

    engine = target(1, loopback_ok=True, tool_calling=False, engine_words="deployment #3 (profile tiny-cpu)")
    equipped, cloud = target(2, loopback_ok=True, tool_calling=True), target(3)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    asked = Passage("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    asked.choose([engine, equipped, cloud])
    assert asked.targets == [equipped, cloud]
    with pytest.raises(NotTranslatable, match=r"deployment #3 \(profile tiny-cpu\) runs without tool calling"):
        asked.choose([engine])
    for quiet in ({"tool_choice": "none"}, {"tools": []}):  # tools the model may not call: vLLM needs nothing
        passage = Passage("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                                   **quiet})
        passage.choose([engine])
        assert passage.targets == [engine]
    agent = Passage("messages", dict(AGENT_TURNS, tool_choice={"type": "none"}))
    agent.choose([engine])
    assert agent.targets == [engine]
    with pytest.raises(NotTranslatable):
        Passage("messages", AGENT_TURNS).choose([engine])


def test_a_chat_answer_becomes_a_messages_answer_with_cached_tokens():
    data = {"id": "chatcmpl-7", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Oslo"}'}}]}}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 12,
                      "prompt_tokens_details": {"cached_tokens": 768}}}
    answer = chat_response_to_messages(data, model="claude-sonnet")
    assert answer["id"] == "msg_chatcmpl-7" and answer["type"] == "message" and answer["model"] == "claude-sonnet"
    assert answer["content"] == [{"type": "text", "text": "Checking."},
                                 {"type": "tool_use", "id": "call_1", "name": "get_weather",
                                  "input": {"city": "Oslo"}}]
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("tool_use", None)
    assert answer["usage"] == {"input_tokens": 132, "output_tokens": 12, "cache_creation_input_tokens": 0,
                               "cache_read_input_tokens": 768}
    # vLLM names the stop string that ended the answer; a length cut is max_tokens.
    stopped = {"choices": [{"finish_reason": "stop", "stop_reason": "END", "message": {"content": "x"}}]}
    assert chat_response_to_messages(stopped, model="m")["stop_sequence"] == "END"
    cut = {"choices": [{"finish_reason": "length", "message": {"content": "x"}}]}
    assert chat_response_to_messages(cut, model="m")["stop_reason"] == "max_tokens"
    bad = {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{not json"}}]}}]}
    with pytest.raises(MalformedAnswer):
        chat_response_to_messages(bad, model="m")


def chunk(delta=None, finish=None, usage=None):
    data = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if usage is None else []}
    if usage is not None:
        data["usage"] = usage
    return data


def test_a_chat_stream_becomes_anthropics_event_sequence():
    stream = ChatStreamToMessages(model="claude-sonnet", message_id="msg_1")
    events = stream.start()
    for piece in (chunk({"role": "assistant", "content": ""}), chunk({"content": "Let "}), chunk({"content": "me"}),
                  chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}]}),
                  chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
                  chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Rome"}'}}]}),
                  chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                         "function": {"name": "get_time", "arguments": "{}"}}]}),
                  chunk(finish="tool_calls"),
                  chunk(usage={"prompt_tokens": 50, "completion_tokens": 9,
                               "prompt_tokens_details": {"cached_tokens": 32}})):
        events += stream.feed(piece)
    events += stream.finish()
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(start["index"], start["content_block"]["type"]) for start in starts] == [
        (0, "text"), (1, "tool_use"), (2, "tool_use")]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}
    partial = "".join(data["delta"]["partial_json"] for name, data in events
                      if name == "content_block_delta" and data["index"] == 1)
    assert json.loads(partial) == {"city": "Rome"}
    delta = dict(events)["message_delta"]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 18, "output_tokens": 9, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 32}
    # A tool call's arguments arriving after the next call began cannot be put back into its closed block.
    late = ChatStreamToMessages(model="m")
    late.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]}))
    late.feed(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}}]}))
    with pytest.raises(MalformedAnswer):
        late.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))


CHAT_AGENT = {
    "model": "gpt-4o", "temperature": 0.5, "stop": "END", "user": "dev-7", "parallel_tool_calls": False,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": WEATHER_TOOL["input_schema"]}}],
    "tool_choice": "required",
    "messages": [
        {"role": "system", "content": "You review code."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "24 C"},
        {"role": "user", "content": "Which is warmer?"},
    ],
}


def test_a_chat_request_becomes_a_messages_request_with_alternating_turns():
    translated = chat_request_to_messages(CHAT_AGENT, model_id="claude-sonnet", default_max_tokens=4096)
    assert translated["system"] == "You review code." and translated["max_tokens"] == 4096
    assert [turn["role"] for turn in translated["messages"]] == ["user", "assistant", "user"]
    assert translated["messages"][0]["content"] == [
        {"type": "text", "text": "Weather in Paris and Rome?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}]
    assert translated["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}}]
    # Both tool results and the next question make one user turn, results first.
    assert translated["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "18 C"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "24 C"},
        {"type": "text", "text": "Which is warmer?"}]
    assert translated["tools"] == [WEATHER_TOOL]
    assert translated["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert (translated["stop_sequences"], translated["metadata"]) == (["END"], {"user_id": "dev-7"})
    # And back: the Messages request a chat client's request became reads as the same conversation.
    back = messages_request_to_chat({**translated, "max_tokens": 4096}, model_id="gpt-4o")
    assert [turn["role"] for turn in back["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert back["messages"][2]["tool_calls"][1]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}


@pytest.mark.parametrize("change, words", [
    ({"n": 2}, "'n'"), ({"logprobs": True}, "'logprobs'"),
    ({"response_format": {"type": "json_object"}}, "'response_format'"), ({"seed": 7}, "'seed'"),
    ({"temperature": 1.5}, "above the Messages API's largest"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]}, "system message after"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "'input_audio'"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                 "arguments": "{x"}}]}]}, "not JSON"),
])
def test_what_messages_cannot_express_is_refused_in_words(change, words):
    with pytest.raises(NotTranslatable) as refused:
        chat_request_to_messages({"model": "m", "messages": [{"role": "user", "content": "hi"}], **change},
                                 model_id="m", default_max_tokens=16)
    assert words in str(refused.value)
    # The defaults of those fields ask for nothing and pass.
    plain = chat_request_to_messages({"model": "m", "n": 1, "response_format": {"type": "text"}, "logprobs": False,
                                      "messages": [{"role": "user", "content": "hi"}]}, model_id="m",
                                     default_max_tokens=16)
    assert plain["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_a_messages_answer_and_stream_become_chat_ones():
    data = {"id": "msg_5", "type": "message", "role": "assistant", "stop_reason": "tool_use",
            "content": [{"type": "thinking", "thinking": "...", "signature": "s"}, {"type": "text", "text": "On it."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
            "usage": {"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 4}}
    chat = messages_response_to_chat(data, model="gpt-4o")
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "On it."
    assert choice["message"]["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert chat["usage"] == {"prompt_tokens": 124, "completion_tokens": 7, "total_tokens": 131,
                             "prompt_tokens_details": {"cached_tokens": 100}}
    stream = MessagesStreamToChat(model="gpt-4o")
    chunks = []
    for event in ({"type": "message_start", "message": {"usage": {"input_tokens": 20, "cache_read_input_tokens": 100}}},
                  {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "On it."}},
                  {"type": "content_block_stop", "index": 0}, {"type": "ping"},
                  {"type": "content_block_start", "index": 1, "content_block": {
                      "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}},
                  {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                                        "partial_json": '{"city": "Oslo"}'}},
                  {"type": "content_block_stop", "index": 1},
                  {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
                  {"type": "message_stop"}):
        chunks += stream.feed(event)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "On it."}
    assert deltas[2]["tool_calls"][0]["id"] == "toolu_1"
    assert deltas[3]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"] == {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127,
                                   "prompt_tokens_details": {"cached_tokens": 100}}
    with pytest.raises(MalformedAnswer):
        MessagesStreamToChat(model="m").feed({"type": "error", "error": {"type": "overloaded_error",
                                                                         "message": "Overloaded"}})


@pytest.mark.parametrize("change, field", [
    ({"model": ""}, "model"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "system", "content": [{"type": "image"}]}]}, "messages.0.content"),
    ({"thinking": {"type": "sometimes"}}, "thinking"), ({"output_config": "high"}, "output_config"),
    ({"messages": [{"role": "user", "content": [{"type": "txt", "text": "x"}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages.0.content.0.tool_use_id"),
    ({"system": [{"type": "text"}]}, "system"), ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "tool_reference", "name": "f"}]}]}]}, "messages.0.content.0.content.0.tool_name"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_reference", "tool_name": "f"}]}]},
     "messages.0.content.0.type"),  # a tool search's reference belongs in its tool result
    ({"tool_choice": {"type": "tool"}}, "tool_choice"), ({"temperature": 2}, "temperature"),
    ({"stream": "yes"}, "stream"), ({"stop_sequences": "END"}, "stop_sequences"),
])
def test_a_messages_request_is_checked_before_anything_is_sent(change, field):
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(MessagesRequestError) as refused:
        parse_messages_request(body)
    assert str(refused.value).startswith(field)
    assert parse_messages_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                  count_only=True)["model"] == "m"  # count_tokens takes no max_tokens


def test_errors_and_events_are_in_anthropics_wire_format():
    assert json.loads(error_body(429, "slow down")) == {"type": "error", "error": {"type": "rate_limit_error",
                                                                                   "message": "slow down"}}
    assert json.loads(error_body(401, "no"))["error"]["type"] == "authentication_error"
    assert sse_event("message_stop", {"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
