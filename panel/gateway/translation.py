"""Between the two chat APIs the gateway speaks: OpenAI chat completions and Anthropic Messages.

A client's request goes to a channel unchanged when the channel speaks the client's API; otherwise it is translated
here, and the answer (a body, or a stream event by event) is translated back. Both directions:

- a Messages client (a coding agent) on a channel that speaks only chat completions: `messages_request_to_chat`,
  `chat_response_to_messages`, `ChatStreamToMessages`;
- a chat client on a channel that speaks only Messages: `chat_request_to_messages`, `messages_response_to_chat`,
  `MessagesStreamToChat`.

Text, images, tools (definitions, calls, results, the choice of tool), stop sequences, sampling and usage (cached
input tokens included) translate; a system message in the middle of a conversation (Claude Code sends its context
that way) stays a system message where it was. What has no counterpart on the other side raises `NotTranslatable`
naming the feature, which the gateway answers with a 400. What only steers how an Anthropic model works, and whose
loss a client cannot tell apart in its answer, is dropped and named (`dropped_for_chat`, a response header):
`thinking` (none of it comes back: a chat answer has no thinking blocks), `output_config` (its effort),
`context_management` (it clears thinking from the history) and thinking blocks in earlier assistant turns. Two
hints that change nothing the model sees pass without a counterpart: Anthropic's `cache_control` (vLLM caches
prefixes by itself) and OpenAI's `stream_options` (the gateway asks for usage on its own). A tool result marked
`is_error` reaches a chat model as a tool message whose text starts with "Error:", the nearest thing chat has.

Deferred tools (`defer_loading: true`, panel/gateway/deferred_tools.py): a chat channel is sent such a tool, as an
ordinary one, once the conversation has loaded it (a tool search's `tool_reference` names it, an earlier turn called
it, or tool_choice names it), as Anthropic's API does, and is not sent it until then; the tool_reference reaches the
chat model as words in the tool's result, and the held tools are counted in the x-tokenwise-adapted header. The
search runs in the client, so holding costs the agent nothing, and it keeps Claude Code's placeholder tool from
being offered to the model and unused schemas out of the prompt. When every tool is deferred, all are sent. A
channel that speaks Messages (Anthropic, vLLM's own /v1/messages) gets them as the client wrote them.

Usage: Anthropic counts `input_tokens` without the cache reads (`cache_read_input_tokens`) and writes
(`cache_creation_input_tokens`); OpenAI's `prompt_tokens` includes them and `prompt_tokens_details.cached_tokens`
says how many were read from the cache."""
import json
import time
import uuid

from panel.core import safejson
from panel.gateway import deferred_tools

CHAT_FINISH_TO_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                              "function_call": "tool_use", "content_filter": "refusal"}
STOP_REASON_TO_CHAT_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                              "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
# Chat request fields that change what the model does and that the Messages API has no counterpart for.
CHAT_ONLY_FIELDS = ("n", "logprobs", "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "seed",
                    "response_format", "audio", "modalities", "prediction", "web_search_options", "functions",
                    "function_call", "reasoning_effort")
# Messages request fields with no counterpart in chat completions (refused).
MESSAGES_ONLY_FIELDS = ("container", "mcp_servers", "service_tier")
# Messages request fields that only steer an Anthropic model's own work: dropped on the way to chat, and named.
STEERING_FIELDS = ("thinking", "output_config", "context_management")
THINKING_BLOCKS = ("thinking", "redacted_thinking")
DEFAULT_CHAT_FIELDS_PASSED = ("temperature", "top_p")


class NotTranslatable(ValueError):
    """The request uses something the channel's API cannot express; the message names it (a 400 to the client)."""


class MalformedAnswer(ValueError):
    """The channel's answer cannot be expressed in the client's API (e.g. tool arguments that are not JSON)."""


# ------------------------------------------------------------------------------------------------- Messages -> chat

def dropped_for_chat(body):
    """What `messages_request_to_chat` leaves out of `body`, in words for the client (a response header)."""
    dropped = [name for name in STEERING_FIELDS
               if body.get(name) not in (None, {}, [], "") and (body[name] or {}).get("type") != "disabled"]
    if any(isinstance(message.get("content"), list) and any(block.get("type") in THINKING_BLOCKS
                                                            for block in message["content"])
           for message in body["messages"] if message.get("role") == "assistant"):
        dropped.append("thinking blocks of earlier turns")
    return dropped


def messages_request_to_chat(body, *, model_id):
    """A Messages request body (already validated by `messages_api.parse_messages_request`) as a chat request."""
    for name in MESSAGES_ONLY_FIELDS:
        if body.get(name) not in (None, {}, [], ""):
            raise NotTranslatable(f"'{name}' has no counterpart in chat completions, which this route's channel "
                                  "speaks: send the request without it")
    chat = {"model": model_id, "messages": _system_to_chat(body.get("system")), "max_tokens": body["max_tokens"]}
    for message in body["messages"]:
        chat["messages"] += _message_to_chat(message)
    for name in DEFAULT_CHAT_FIELDS_PASSED:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("top_k") is not None:
        chat["top_k"] = body["top_k"]  # vLLM reads it; a provider that does not answers 400 itself
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    user_id = (body.get("metadata") or {}).get("user_id")
    if user_id:
        chat["user"] = str(user_id)
    if body.get("tools"):
        held = deferred_tools.held(body)
        chat["tools"] = [_tool_to_chat(tool) for tool in body["tools"] if tool["name"] not in held]
    choice = body.get("tool_choice")
    if choice:
        chat.update(_tool_choice_to_chat(choice))
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _text_of(blocks, where):
    """The text of a string or a list of text blocks; anything else in it is not translatable."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for block in blocks:
        if block.get("type") != "text":
            raise NotTranslatable(f"a {block.get('type')!r} block in {where} cannot be translated to chat "
                                  "completions (only text can)")
        texts.append(block.get("text", ""))
    return "\n\n".join(texts)


def _system_to_chat(system):
    if system in (None, "", []):
        return []
    return [{"role": "system", "content": _text_of(system, "the system prompt")}]


def _image_to_chat(block):
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        raise NotTranslatable(f"an image whose source is {source.get('type')!r} cannot be translated to chat "
                              "completions (base64 and url images can)")
    return {"type": "image_url", "image_url": {"url": url}}


def _message_to_chat(message):
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "system":
        return [{"role": "system", "content": _text_of(content, "a system message")}]
    if role == "assistant":
        texts, calls = [], []
        for block in content:
            kind = block.get("type")
            if kind in THINKING_BLOCKS:
                continue  # the model's own earlier reasoning: a chat model takes none (dropped_for_chat names it)
            if kind == "text":
                texts.append(block.get("text", ""))
            elif kind == "tool_use":
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            else:
                raise NotTranslatable(f"a {kind!r} block in an assistant turn cannot be translated to chat "
                                      "completions (text and tool_use can)")
        turn = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        return [turn]
    tool_messages, parts = [], []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append(_image_to_chat(block))
        elif kind == "tool_result":
            result = _tool_result_text(block.get("content") or "")
            if block.get("is_error"):
                result = f"Error: {result}"
            tool_messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            raise NotTranslatable(f"a {kind!r} block in a user turn cannot be translated to chat completions "
                                  "(text, image and tool_result can)")
    # Chat wants a tool's result right after the assistant turn that called it, before anything the user adds.
    turns = list(tool_messages)
    if parts:
        only_text = all(part["type"] == "text" for part in parts)
        turns.append({"role": "user", "content": "".join(part["text"] for part in parts) if only_text else parts})
    return turns


def _tool_result_text(content):
    """A tool result's text; the tools a tool search found (its tool_reference blocks) named in words."""
    if isinstance(content, str):
        return content
    found = deferred_tools.reference_text(content)
    text = _text_of([block for block in content if block.get("type") != deferred_tools.REFERENCE], "a tool result")
    return "\n\n".join(part for part in (text, found) if part)


def _tool_to_chat(tool):
    if tool.get("type") not in (None, "custom"):
        raise NotTranslatable(f"the server tool {tool.get('type')!r} runs at Anthropic and cannot be translated to "
                              "chat completions (only tools you define, with an input_schema, can)")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice_to_chat(choice):
    kind = choice.get("type")
    chosen = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        chosen = {"type": "function", "function": {"name": choice["name"]}}
    if chosen is None:
        raise NotTranslatable(f"tool_choice {kind!r} cannot be translated to chat completions")
    translated = {"tool_choice": chosen}
    if choice.get("disable_parallel_tool_use"):
        translated["parallel_tool_calls"] = False
    return translated


def chat_usage_to_messages(usage):
    """Anthropic's usage object from an OpenAI one (either may be missing parts)."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = int((details or {}).get("cached_tokens") or 0) if isinstance(details, dict) else 0
    prompt = int(usage.get("prompt_tokens") or 0)
    return {"input_tokens": max(prompt - cached, 0), "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _stop_of(choice):
    """(stop_reason, stop_sequence) of a chat choice; vLLM names the stop string that ended it in `stop_reason`."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return CHAT_FINISH_TO_STOP_REASON.get(finish, "end_turn"), None


def _arguments(text, name):
    try:
        value = safejson.loads(text or "{}")
    except ValueError:
        raise MalformedAnswer(f"the channel called tool {name!r} with arguments that are not JSON") from None
    if not isinstance(value, dict):
        raise MalformedAnswer(f"the channel called tool {name!r} with arguments that are not a JSON object")
    return value


def chat_response_to_messages(data, *, model):
    """A chat completion as a Messages response."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or _new_id("toolu"), "name": function.get("name"),
                        "input": _arguments(function.get("arguments"), function.get("name"))})
    stop_reason, stop_sequence = _stop_of(choice)
    return {"id": message_id(data.get("id")), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": chat_usage_to_messages(data.get("usage"))}


def _new_id(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_id(upstream_id):
    return f"msg_{upstream_id}" if upstream_id and not str(upstream_id).startswith("msg_") else (
        upstream_id or _new_id("msg"))


class ChatStreamToMessages:
    """Chat completion chunks in, Anthropic stream events out: (event name, data) pairs.

    `start()` gives message_start; `feed(chunk)` the events a chunk makes (a text block opens at the first text, a
    tool_use block at each new tool call, and the block before closes); `finish()` closes the last block and gives
    message_delta (stop reason and the whole usage) and message_stop."""

    def __init__(self, *, model, message_id=None):
        self.model = model
        self.message_id = message_id or _new_id("msg")
        self.index = -1  # the open block's index
        self.open_kind = None  # "text", or ("tool", chat tool-call index)
        self.tool_indexes_seen = set()
        self.stop = ("end_turn", None)
        self.usage = None

    def start(self):
        usage = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        return [("message_start", {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}})]

    def _close(self):
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _open(self, kind, block):
        events = self._close()
        self.index += 1
        self.open_kind = kind
        return events + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                                   "content_block": block})]

    def feed(self, chunk):
        events = []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.open_kind != "text":
                    events += self._open("text", {"type": "text", "text": ""})
                events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                       "delta": {"type": "text_delta", "text": text}}))
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self.stop = _stop_of(choice)
        return events

    def _tool_call(self, call):
        events = []
        position = call.get("index", 0)
        function = call.get("function") or {}
        if ("tool", position) != self.open_kind:
            if position in self.tool_indexes_seen:
                raise MalformedAnswer("the channel streamed a tool call's arguments after the next one began")
            self.tool_indexes_seen.add(position)
            events += self._open(("tool", position), {"type": "tool_use", "id": call.get("id") or _new_id("toolu"),
                                                      "name": function.get("name") or "", "input": {}})
        if function.get("arguments"):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": function["arguments"]}}))
        return events

    def finish(self):
        stop_reason, stop_sequence = self.stop
        usage = chat_usage_to_messages(self.usage)
        return self._close() + [
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                                  "stop_sequence": stop_sequence}, "usage": usage}),
            ("message_stop", {"type": "message_stop"})]


# ------------------------------------------------------------------------------------------------- chat -> Messages

def chat_request_to_messages(body, *, model_id, default_max_tokens):
    """A chat request body as a Messages request (for a channel that speaks only Messages)."""
    for name in CHAT_ONLY_FIELDS:
        if _asks_for(name, body.get(name)):
            raise NotTranslatable(f"'{name}' has no counterpart in the Messages API, which this route's channel "
                                  "speaks: send the request without it")
    system, messages = [], []
    for position, message in enumerate(body["messages"]):
        role = message.get("role")
        if role in ("system", "developer"):
            if messages:
                raise NotTranslatable("a system message after the conversation began cannot be translated to the "
                                      "Messages API (its system prompt comes first)")
            system.append(_chat_text(message.get("content"), f"message {position}"))
        elif role in ("user", "assistant", "tool"):
            _append_turn(messages, *_chat_message_to_messages(message, position))
        else:
            raise NotTranslatable(f"a message with role {role!r} cannot be translated to the Messages API")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or default_max_tokens
    translated = {"model": model_id, "messages": messages, "max_tokens": max_tokens}
    if system:
        translated["system"] = "\n\n".join(system)
    temperature = body.get("temperature")
    if temperature is not None:
        if temperature > 1:
            raise NotTranslatable(f"temperature {temperature:g} is above the Messages API's largest, 1")
        translated["temperature"] = temperature
    if body.get("top_p") is not None:
        translated["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        translated["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("user"):
        translated["metadata"] = {"user_id": str(body["user"])}
    if body.get("tools"):
        translated["tools"] = [_tool_to_messages(tool) for tool in body["tools"]]
    tool_choice = _tool_choice_to_messages(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if tool_choice:
        translated["tool_choice"] = tool_choice
    if body.get("stream"):
        translated["stream"] = True
    return translated


def _asks_for(name, value):
    """Whether a chat-only field asks for anything beyond the default (n=1, a plain text format...)."""
    defaults = {"n": (1,), "response_format": ({"type": "text"},)}
    return value not in (None, False) and value not in defaults.get(name, ())


def _chat_text(content, where):
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise NotTranslatable(f"a {part.get('type')!r} part in {where} cannot be translated to the Messages "
                                  "API here (only text can)")
        texts.append(part.get("text", ""))
    return "".join(texts)


def _chat_part_to_block(part, where):
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text", "")}
    if kind == "image_url":
        url = (part.get("image_url") or {}).get("url", "")
        if url.startswith("data:") and ";base64," in url:
            media_type, data = url[5:].split(";base64,", 1)
            return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise NotTranslatable(f"a {kind!r} part in {where} cannot be translated to the Messages API (text and images "
                          "can)")


def _chat_message_to_messages(message, position):
    """(role, content blocks) of one chat message in Messages terms."""
    role, content, where = message["role"], message.get("content"), f"message {position}"
    if role == "tool":
        block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id") or "",
                 "content": _chat_text(content, where)}
        return "user", [block]
    if isinstance(content, list):
        blocks = [_chat_part_to_block(part, where) for part in content]
    else:
        blocks = [{"type": "text", "text": content}] if content else []
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            try:
                arguments = safejson.loads(function.get("arguments") or "{}")
            except ValueError:
                raise NotTranslatable(f"the tool call in {where} has arguments that are not JSON") from None
            blocks.append({"type": "tool_use", "id": call.get("id") or _new_id("toolu"),
                           "name": function.get("name", ""), "input": arguments})
    return role, blocks


def _append_turn(messages, role, blocks):
    """Messages alternate user and assistant: a turn of the same role as the one before joins it."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"] += blocks
    else:
        messages.append({"role": role, "content": blocks})


def _tool_to_messages(tool):
    if tool.get("type") != "function":
        raise NotTranslatable(f"a tool of type {tool.get('type')!r} cannot be translated to the Messages API")
    function = tool.get("function") or {}
    translated = {"name": function.get("name", ""), "input_schema": function.get("parameters") or
                  {"type": "object", "properties": {}}}
    if function.get("description"):
        translated["description"] = function["description"]
    return translated


def _tool_choice_to_messages(choice, parallel):
    if choice is None and parallel is not False:
        return None
    if choice is None or choice == "auto":
        translated = {"type": "auto"}
    elif choice == "none":
        translated = {"type": "none"}
    elif choice == "required":
        translated = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        translated = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    else:
        raise NotTranslatable(f"tool_choice {choice!r} cannot be translated to the Messages API")
    if parallel is False and translated["type"] != "none":
        translated["disable_parallel_tool_use"] = True
    return translated


def messages_usage_to_chat(usage):
    usage = usage if isinstance(usage, dict) else {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + int(usage.get("cache_creation_input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}}


def messages_response_to_chat(data, *, model):
    """A Messages response as a chat completion. Thinking blocks the channel volunteered are not part of a chat
    answer and are left out (a chat client cannot have asked for them)."""
    texts, calls = [], []
    for block in data.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}})
    message = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    finish = STOP_REASON_TO_CHAT_FINISH.get(data.get("stop_reason"), "stop")
    return {"id": f"chatcmpl-{data.get('id') or uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": messages_usage_to_chat(data.get("usage"))}


class MessagesStreamToChat:
    """Anthropic stream events in, chat completion chunks out. `feed(event)` takes one event's data (its "type"
    says which event) and returns the chunks it makes; the last chunk (after message_stop) carries the finish
    reason, then a usage chunk."""

    def __init__(self, *, model):
        self.model = model
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tool_index = {}  # Anthropic block index -> chat tool-call index
        self.usage = {}
        self.stop_reason = None

    def _chunk(self, delta=None, finish=None, usage=None):
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": [] if usage is not None else [{"index": 0, "delta": delta or {},
                                                           "finish_reason": finish}]}
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def feed(self, event):
        kind = event.get("type")
        if kind == "message_start":
            self.usage.update((event.get("message") or {}).get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self.tool_index[event.get("index")] = len(self.tool_index)
                return [self._chunk({"tool_calls": [{"index": index, "id": block.get("id"), "type": "function",
                                                     "function": {"name": block.get("name"), "arguments": ""}}]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta" and event.get("index") in self.tool_index:
                return [self._chunk({"tool_calls": [{"index": self.tool_index[event["index"]],
                                                     "function": {"arguments": delta.get("partial_json", "")}}]})]
            return []  # thinking and signature deltas: not part of a chat answer
        if kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
            self.usage.update(event.get("usage") or {})
            return []
        if kind == "message_stop":
            return [self._chunk({}, finish=STOP_REASON_TO_CHAT_FINISH.get(self.stop_reason, "stop")),
                    self._chunk(usage=messages_usage_to_chat(self.usage))]
        if kind == "error":
            error = event.get("error") or {}
            raise MalformedAnswer(f"the channel sent an error event: {error.get('message', 'no message')}")
        return []  # ping
