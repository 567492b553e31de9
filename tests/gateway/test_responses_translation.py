"""The Responses API (Codex's only API) translated to chat completions and back, whole and streamed: every input
item type, the tools (function, namespace, custom; web_search dropped and named, the other built-in ones refused),
the settings that carry over, what is dropped and named, what is refused in words, a field it does not know carried;
which channels get it translated and which passed through; Codex's session header."""
import json

import pytest

from panel.channels.models import Channel, ChannelApis
from panel.channels.routing import Target
from panel.gateway import sessions
from panel.gateway.apis import CHAT, RESPONSES, ChatToResponses, Passage
from panel.gateway.responses_translation import (
    ChatStreamToResponses,
    chat_response_to_responses,
    responses_request_to_chat,
)
from panel.gateway.translation import MalformedAnswer, NotTranslatable
from panel.gateway.upstream import UpstreamError
from tests.support import client_shapes

READ_FILE = {"type": "function", "name": "read_file", "description": "Read a file.", "strict": False,
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}]}
TOOL_TURN = {
    "model": "coder", "instructions": "You are a coding agent.", "max_output_tokens": 300, "temperature": 0.2,
    "top_p": 0.9, "tools": [READ_FILE, APPLY_PATCH, AGENTS, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."},
                                                            {"type": "input_text", "text": "More rules."}]},
        {"role": "user", "content": "Fix app.py"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading it."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
         "arguments": '{"path": "app.py"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "spawn_agent",
         "namespace": "multi_agent_v1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "print('hi')"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "agent 7 started"}]},
        {"type": "custom_tool_call", "id": "ctc_3", "call_id": "call_3", "name": "apply_patch",
         "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done."},
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                                      "detail": "low"}]},
    ]}


def test_every_input_item_becomes_its_chat_message_in_order():
    chat, changes = responses_request_to_chat(TOOL_TURN)
    assert chat["messages"] == [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "system", "content": "Rules.\n\nMore rules."},  # a developer message
        {"role": "user", "content": "Fix app.py"},
        {"role": "assistant", "content": "Reading it.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "app.py"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent",
                                                              "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"},
        {"role": "tool", "tool_call_id": "call_2", "content": "agent 7 started"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "apply_patch",
                                                              "arguments": '{"input": "*** Begin Patch"}'}}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "Done."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                                         "detail": "low"}}]},
    ]
    assert changes == ["1 reasoning item of earlier turns dropped",
                       "web_search tool dropped (the channel cannot search the web)"]


def test_tools_and_settings_carry_over_and_the_stream_asks_for_usage():
    chat, _ = responses_request_to_chat(TOOL_TURN)
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["read_file", "apply_patch",
                                                                    "multi_agent_v1__spawn_agent"]
    assert chat["tools"][0] == {"type": "function", "function": {
        "name": "read_file", "parameters": READ_FILE["parameters"], "description": "Read a file.", "strict": False}}
    assert chat["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {"input": {"type": "string"}},
                                                          "required": ["input"]}  # a free-form tool's text
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["max_tokens"], chat["temperature"],
            chat["top_p"]) == ("auto", False, 300, 0.2, 0.9)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert not {"input", "instructions", "store", "max_output_tokens", "model"} & set(chat)


@pytest.mark.parametrize("text, response_format", [
    ({"format": {"type": "json_schema", "name": "answer", "strict": True,
                 "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}},
     {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
         "type": "object", "properties": {"ok": {"type": "boolean"}}}}}),
    ({"format": {"type": "json_object"}}, {"type": "json_object"}),
    ({"format": {"type": "text"}}, None),
])
def test_text_format_becomes_response_format(text, response_format):
    chat, changes = responses_request_to_chat({"model": "m", "input": "hi", "text": text})
    assert chat.get("response_format") == response_format and changes == []
    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_codexs_request_is_translated_with_every_field_it_drops_named():
    body = client_shapes.load("codex_0_171_0")["body"]
    chat, changes = responses_request_to_chat(body)
    assert changes == ["web_search tool dropped (the channel cannot search the web)", "prompt_cache_key dropped",
                       "client_metadata dropped", "reasoning dropped (chat completions take no reasoning settings)",
                       "include reasoning.encrypted_content dropped (a chat answer has none)"]
    assert [message["role"] for message in chat["messages"]] == ["system", "system", "user", "user"]
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert "multi_agent_v1__spawn_agent" in names and "exec_command" in names and len(names) == len(set(names))
    assert set(chat) == {"messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options"}
    # every field of Codex's body is read, carried or named: none is silently lost
    named = {"prompt_cache_key", "client_metadata", "reasoning", "include"}
    assert set(body) - named - {"model", "input", "tools", "store"} <= set(chat)


def test_an_image_in_a_tools_output_is_dropped_and_named():
    chat, changes = responses_request_to_chat({"model": "m", "input": [
        {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [
            {"type": "input_text", "text": "the screenshot"}, {"type": "input_image", "image_url": "data:,"}]}]})
    assert chat["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "the screenshot"}
    assert changes == ["input_image in the output of input item 1 dropped (a chat tool message holds text only)"]


def test_a_field_the_translation_does_not_know_is_carried_and_what_only_openai_keeps_is_named():
    chat, changes = responses_request_to_chat({"model": "m", "input": "hi", "seed": 7, "top_k": 20, "store": True,
                                               "metadata": {"run": "a"}, "user": "dev-1",
                                               "text": {"verbosity": "low"}, "truncation": "auto"})
    assert (chat["seed"], chat["top_k"], chat["user"]) == (7, 20, "dev-1")
    assert "metadata" not in chat and "truncation" not in chat and "verbosity" not in chat
    assert changes == ["text.verbosity dropped", "metadata dropped", "truncation dropped",
                       "store ignored (the gateway keeps no responses)"]


@pytest.mark.parametrize("change, words", [
    ({"previous_response_id": "resp_1"}, "'previous_response_id' names a response stored elsewhere"),
    ({"conversation": "conv_1"}, "'conversation' names a response stored elsewhere"),
    ({"prompt": {"id": "pmpt_1"}}, "'prompt' (a prompt template stored at OpenAI)"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "the built-in tool 'file_search'"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "the built-in tool 'mcp'"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format 'grammar'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "a 'item_reference' input item"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
     "a 'input_file' content part"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]}, "an image by file_id"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "has no call_id"),
])
def test_what_chat_cannot_do_is_refused_in_words(change, words):
    with pytest.raises(NotTranslatable, match=words.replace("(", r"\(").replace(")", r"\)")):
        responses_request_to_chat({"model": "m", "input": "hi", **change})


def test_a_chat_answer_becomes_a_response_with_its_tool_calls_and_usage():
    data = {"id": "chatcmpl-9", "created": 1700000000, "choices": [{"index": 0, "finish_reason": "tool_calls",
                                                                    "message": {
        "role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent",
                                                              "arguments": "{}"}},
            {"id": "call_c", "type": "function", "function": {"name": "apply_patch",
                                                              "arguments": '{"input": "*** Begin"}'}}]}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 100},
                  "completion_tokens_details": {"reasoning_tokens": 4}}}
    response = chat_response_to_responses(data, TOOL_TURN, model="coder")
    assert response["id"] == "resp_chatcmpl-9" and response["object"] == "response"
    assert (response["status"], response["model"], response["created_at"]) == ("completed", "coder", 1700000000)
    text, read, spawn, patch = response["output"]
    assert text["type"] == "message" and text["content"] == [{"type": "output_text", "text": "Looking.",
                                                              "annotations": []}]
    assert (read["type"], read["call_id"], read["name"], read["arguments"]) == (
        "function_call", "call_a", "read_file", '{"path": "a"}') and "namespace" not in read
    assert (spawn["name"], spawn["namespace"]) == ("spawn_agent", "multi_agent_v1")
    assert (patch["type"], patch["call_id"], patch["name"], patch["input"]) == (
        "custom_tool_call", "call_c", "apply_patch", "*** Begin")
    assert response["usage"] == {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
                                 "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 4},
                                 "total_tokens": 150}
    cut = chat_response_to_responses({"choices": [{"finish_reason": "length", "message": {"content": "Lo"}}]},
                                     {"input": "hi"}, model="m")
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def chunk(delta=None, finish=None, usage=None):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [] if usage else [
        {"index": 0, "delta": delta or {}, "finish_reason": finish}], **({"usage": usage} if usage else {})}


STREAM = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me "}), chunk({"content": "look."}),
          chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                 "function": {"name": "read_file", "arguments": ""}}]}),
          chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path"'}}]}),
          chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "a"}'}}]}),
          chunk({"tool_calls": [{"index": 1, "id": "call_c", "function": {"name": "apply_patch",
                                                                          "arguments": '{"input": '}}]}),
          chunk({"tool_calls": [{"index": 1, "function": {"arguments": '"*** Begin"}'}}]}),
          chunk({}, finish="tool_calls"),
          chunk(usage={"prompt_tokens": 50, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 32}})]


def test_a_chat_stream_becomes_the_responses_event_sequence():
    converter = ChatStreamToResponses(TOOL_TURN, model="coder")
    events = converter.start()
    for piece in STREAM:
        events += converter.feed(piece)
    events += converter.finish()
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.output_item.done",  # a free-form tool's call, whole at its end
        "response.completed"]
    created, completed = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["id"] == completed["id"] and created["output"] == []
    done = [event for event in events if event["type"] == "response.output_item.done"]
    assert [event["output_index"] for event in done] == [0, 1, 2]
    assert done[0]["item"]["content"][0]["text"] == "Let me look."
    assert (done[1]["item"]["arguments"], done[1]["item"]["call_id"]) == ('{"path": "a"}', "call_a")
    assert events[12]["arguments"] == '{"path": "a"}' and events[12]["item_id"] == done[1]["item"]["id"]
    assert (done[2]["item"]["type"], done[2]["item"]["input"]) == ("custom_tool_call", "*** Begin")
    assert completed["output"] == [event["item"] for event in done] and completed["status"] == "completed"
    assert completed["usage"]["input_tokens_details"] == {"cached_tokens": 32}
    assert completed["usage"]["total_tokens"] == 62


def test_the_reasoning_a_chat_answer_carries_comes_back_as_a_reasoning_item_whole_and_streamed():
    whole = chat_response_to_responses({"choices": [{"finish_reason": "stop", "message": {
        "reasoning_content": "The user greets me.", "content": "Hello!"}}]}, {"input": "hi"}, model="m")
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "The user greets me."}]
    converter = ChatStreamToResponses({"input": "hi"}, model="m")
    events = converter.start()
    for delta in ({"reasoning_content": "The user "}, {"reasoning_content": "greets me."}, {"content": "Hello!"}):
        events += converter.feed(chunk(delta))
    events += converter.finish()
    assert [event["type"] for event in events[2:7]] == [
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done"]
    streamed = events[-1]["response"]["output"]
    assert events[5]["text"] == "The user greets me." and [item["type"] for item in streamed] == ["reasoning",
                                                                                                   "message"]
    assert streamed[0]["content"] == whole["output"][0]["content"] and streamed[1]["content"][0]["text"] == "Hello!"
    # The client sends it back on its next turn: dropped there, and named.
    _, changes = responses_request_to_chat({"model": "m", "input": [{"role": "user", "content": "hi"},
                                                                    whole["output"][0], whole["output"][1]]})
    assert changes == ["1 reasoning item of earlier turns dropped"]


def test_a_stream_cut_by_the_answer_limit_ends_incomplete_and_a_broken_one_is_malformed():
    converter = ChatStreamToResponses({"input": "hi"}, model="m")
    events = converter.start() + converter.feed(chunk({"content": "Lo"})) + converter.feed(chunk({}, "length"))
    last = (events + converter.finish())[-1]
    assert last["type"] == "response.incomplete" and last["response"]["incomplete_details"] == {
        "reason": "max_output_tokens"}
    broken = ChatStreamToResponses({"input": "hi"}, model="m")
    broken.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}))
    broken.feed(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}))
    with pytest.raises(MalformedAnswer):
        broken.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}))


class Recorder:
    """The parts of an Exchange the stream adapter writes: usage and content pieces."""

    def __init__(self):
        self.usage, self.pieces = None, []

    def take_usage(self, usage):
        self.usage = usage

    def content_arrived(self, text=""):
        self.pieces.append(text)


def test_the_stream_adapter_sends_named_events_and_counts_the_usage_and_the_content():
    exchange = Recorder()
    adapter = ChatToResponses(exchange, "coder", TOOL_TURN)
    sent = b"".join(piece for line in [f"data: {json.dumps(piece)}" for piece in STREAM] + ["", "data: [DONE]"]
                    for piece in adapter.feed(line))
    blocks = [block for block in sent.decode().split("\n\n") if block]
    names = [block.split("\n")[0][len("event: "):] for block in blocks]
    datas = [json.loads(block.split("\n")[1][len("data: "):]) for block in blocks]
    assert names == [data["type"] for data in datas] and names[0] == "response.created"
    assert adapter.finished and names[-1] == "response.completed"
    assert exchange.usage["prompt_tokens"] == 50 and exchange.usage["cached_tokens"] == 32
    assert "Let me " in exchange.pieces and "" in exchange.pieces  # the text, and the tool calls as content
    failure = adapter.failure(UpstreamError("cut", "the channel's stream broke"))
    assert failure.startswith(b"event: error\ndata: ") and b'"code": "cut"' in failure


def target(ident, apis):
    return Target(id=ident, name=f"c{ident}", base_url="", model_id=f"model-{ident}", api_key=None,
                  credential_error="", timeout=5.0, max_retries=0, backoff=1.0, channel=Channel(apis=apis))


def test_a_channel_that_speaks_responses_gets_it_passed_through_and_a_chat_only_one_translated():
    speaks, chat_only, anthropic = target(1, ChannelApis.CHAT), target(2, ChannelApis.CHAT_ONLY), target(
        3, ChannelApis.MESSAGES)
    passage = Passage(RESPONSES, dict(TOOL_TURN))
    passage.choose([anthropic, speaks, chat_only])
    assert passage.targets == [speaks, chat_only]  # a Messages-only channel cannot take it
    api, path, payload = passage.request(speaks, stream=True)
    assert (api, path, payload) == (RESPONSES, "/responses", dict(TOOL_TURN, model="model-1"))
    assert passage.adapted[1] == []
    api, path, payload = passage.request(chat_only, stream=True)
    assert (api, path, payload["model"]) == (CHAT, "/chat/completions", "model-2") and "messages" in payload
    assert passage.adapted[2] == ["1 reasoning item of earlier turns dropped",
                                  "web_search tool dropped (the channel cannot search the web)"]
    assert isinstance(passage.stream_adapter(chat_only, Recorder()), ChatToResponses)
    body, usage = passage.answer(chat_only, {"id": "x", "choices": [{"finish_reason": "stop", "message": {
        "content": "Done."}}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    assert body["object"] == "response" and body["model"] == "coder" and usage["prompt_tokens"] == 9


def test_previous_response_id_skips_a_translating_channel_and_is_refused_when_none_is_left():
    stored = dict(TOOL_TURN, previous_response_id="resp_1")
    passage = Passage(RESPONSES, stored)
    passage.choose([target(2, ChannelApis.CHAT_ONLY), target(1, ChannelApis.CHAT)])
    assert [each.id for each in passage.targets] == [1]  # a provider that speaks Responses may keep it
    with pytest.raises(NotTranslatable, match="the gateway stores none"):
        Passage(RESPONSES, stored).choose([target(2, ChannelApis.CHAT_ONLY)])
    with pytest.raises(NotTranslatable, match="speaks only the Anthropic Messages API"):
        Passage(RESPONSES, dict(TOOL_TURN)).choose([target(3, ChannelApis.MESSAGES)])


def test_a_404_from_a_channel_that_was_said_to_speak_responses_names_the_setting_that_fixes_it():
    passage = Passage(RESPONSES, dict(TOOL_TURN))
    passage.choose([target(1, ChannelApis.CHAT)])
    error = json.loads(passage.error_body(502, "Invalid URL (POST /v1/responses)", kind="upstream_error",
                                          code="upstream_not_found"))
    assert "OpenAI chat completions only" in error["error"]["message"]
    other = json.loads(passage.error_body(502, "boom", kind="upstream_error", code="upstream_error"))
    assert other["error"]["message"] == "boom"


@pytest.mark.parametrize("apis, spoken", [
    ("chat", {"chat", "responses"}), ("chat_only", {"chat"}), ("messages", {"messages"}),
    ("both", {"chat", "responses", "messages"})])
def test_each_choice_of_a_channels_apis_says_what_it_speaks(apis, spoken):
    channel = Channel(apis=apis)
    assert {api for api in ("chat", "responses", "messages") if channel.speaks(api)} == spoken


def test_codexs_session_header_names_the_session():
    headers = [(b"session-id", b"01a249d5-554c-7803-b05e-5dea15dcc725"), (b"originator", b"codex_exec")]
    assert sessions.declared_session({}, headers) == "01a249d5-554c-7803-b05e-5dea15dcc725"
    both = [(b"x-session-id", b"mine"), *headers]  # the gateway's own header first
    assert sessions.declared_session({}, both) == "mine"
    assert sessions.declared_session({}, [(b"originator", b"codex_exec")]) == ""


def test_a_stream_without_a_tool_name_is_malformed():
    converter = ChatStreamToResponses({"input": "hi"}, model="m")
    converter.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"arguments": "{}"}}]}))
    with pytest.raises(MalformedAnswer):
        converter.finish()
