"""The APIs a request crosses on its way: the client's (chat, completions, messages, responses, embeddings) and, for
each channel, the one it is sent in (Channel.apis says what the channel speaks).

Where the channel speaks the client's API the body passes through with the channel's model id; between OpenAI chat
completions and Anthropic Messages it is translated (panel/gateway/translation.py), from the Responses API to chat
completions for a channel without it (panel/gateway/responses_translation.py), and the answer, whole or as a stream,
is translated back. Completions and embeddings pass through to channels that speak the OpenAI API only. A channel
the request cannot reach is skipped; when none is left the client gets a 400 naming the reason."""
import json

from django.conf import settings

from panel.core import safejson
from panel.gateway import deferred_tools, messages_api, provider_tools, responses_translation, translation
from panel.gateway.upstream import UpstreamError, upstream_body

CHAT, COMPLETIONS, MESSAGES, RESPONSES, EMBEDDINGS = "chat", "completions", "messages", "responses", "embeddings"
PATHS = {CHAT: "/chat/completions", COMPLETIONS: "/completions", MESSAGES: "/messages", RESPONSES: "/responses",
         EMBEDDINGS: "/embeddings"}
OPENAI_ONLY = (COMPLETIONS, EMBEDDINGS)  # passed through, never translated
# max_tokens for a chat request without one, sent to a channel that speaks only Messages (where it is required).
DEFAULT_MAX_TOKENS = 4096


def openai_error_body(message, *, kind, code):
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def speaks(target, api):
    return target.channel.speaks(CHAT if api in OPENAI_ONLY else api)


NOT_FOUND_HINT = (" If this channel's provider does not serve /v1/responses, set the channel's APIs to \"OpenAI chat "
                  "completions only\": the gateway then translates Responses requests to chat completions.")


# ------------------------------------------------------------------------------------------------- usage

def _reasoning(details, name="reasoning_tokens"):
    """The reasoning tokens of a usage's completion or output details (OpenAI's reasoning_tokens, Anthropic's
    thinking_tokens); None where the upstream does not say."""
    value = details.get(name) if isinstance(details, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def openai_usage(usage):
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    return {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
            "reasoning_tokens": _reasoning(usage.get("completion_tokens_details"))}


def messages_usage(usage):
    """Anthropic counts input_tokens without the cache reads and writes; the usage record's prompt_tokens has them
    all (as OpenAI's does), cached_tokens the reads and cache_write_tokens the writes."""
    usage = usage if isinstance(usage, dict) else {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    return {"prompt_tokens": int(usage.get("input_tokens") or 0) + read + written,
            "completion_tokens": int(usage.get("output_tokens") or 0), "cached_tokens": read,
            "cache_write_tokens": written,
            "reasoning_tokens": _reasoning(usage.get("output_tokens_details"), "thinking_tokens"),  # a beta's
            "server_tool_calls": _web_searches(usage.get("server_tool_use"))}


def _web_searches(server_tool_use):
    """The web searches Anthropic ran for the answer, billed per search (web fetches and code execution are not
    billed per call); None when the answer says nothing of its server tools."""
    if not isinstance(server_tool_use, dict):
        return None
    count = server_tool_use.get("web_search_requests")
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


PER_CALL_TOOLS = ("web_search_call", "file_search_call")  # the Responses tools OpenAI bills per call


def responses_usage(response):
    """A Responses answer's usage, and the tool calls OpenAI ran for it and bills per call (its output items)."""
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    details = usage.get("input_tokens_details")
    output = response.get("output") if isinstance(response.get("output"), list) else []
    calls = sum(1 for item in output if isinstance(item, dict) and item.get("type") in PER_CALL_TOOLS)
    return {"prompt_tokens": int(usage.get("input_tokens") or 0),
            "completion_tokens": int(usage.get("output_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
            "reasoning_tokens": _reasoning(usage.get("output_tokens_details")),
            "server_tool_calls": calls or None}


# ------------------------------------------------------------------------------------------------- one request

class Passage:
    """One request's way to its channels: for each channel the API it is sent in, the body, and the answer turned
    back into the client's API."""

    def __init__(self, client_api, body, betas=""):
        self.client_api = client_api
        self.body = body
        # a Messages client's anthropic-beta header, passed on with its body: the betas that reach nothing else
        self.betas, self.betas_dropped = provider_tools.betas_passed(betas)
        self.model = body["model"]
        self.stream = bool(body.get("stream"))
        self._translated = {}  # upstream API -> the translated body (the model id set per channel)
        self._responses_changes = []  # what translating a Responses request to chat changed, in words
        self.targets = []  # the route's channels this request can go to, in order (`choose`)
        self.adapted = {}  # target id -> what was changed for it, in words (the x-tokenwise-adapted header)

    def upstream_api(self, target):
        """The API to call `target` in; NotTranslatable when the request cannot go to it."""
        if speaks(target, self.client_api):
            return self.client_api
        if self.client_api in (*OPENAI_ONLY, RESPONSES):
            if self.client_api == RESPONSES and speaks(target, CHAT):
                return CHAT
            raise translation.NotTranslatable(
                f"/v1/{self.client_api} is passed only to channels that speak the OpenAI API; this route's channel "
                f"{target.name} speaks only the Anthropic Messages API")
        return MESSAGES if self.client_api == CHAT else CHAT

    def _body_in(self, api):
        if api not in self._translated:
            if self.client_api == RESPONSES:  # what it changed is kept beside it, for the adapted header
                self._translated[api], self._responses_changes = responses_translation.responses_request_to_chat(
                    self.body)
            elif self.client_api == MESSAGES:
                self._translated[api] = translation.messages_request_to_chat(self.body, model_id="")
            else:
                self._translated[api] = translation.chat_request_to_messages(
                    self.body, model_id="", default_max_tokens=min(DEFAULT_MAX_TOKENS, settings.GATEWAY_MAX_TOKENS))
        return self._translated[api]

    def choose(self, targets):
        """Keep the targets the request can be sent to, in order; NotTranslatable (the last reason) when none."""
        usable, refusal = [], None
        for target in targets:
            try:
                if target.tool_calling is False and lets_model_call_tools(self.body):
                    raise translation.NotTranslatable(
                        f"this request lets the model call tools, and {target.engine_words} runs without tool "
                        "calling: choose its profile's Tool calling parser and relaunch it, or route tool requests "
                        "to another channel")
                api = self.upstream_api(target)
                if api != self.client_api:
                    self._body_in(api)
            except translation.NotTranslatable as error:
                refusal = error
                continue
            usable.append(target)
        if not usable and refusal is not None:
            raise refusal
        self.targets = usable

    def request(self, target, *, stream):
        """(upstream API, path, payload) for one attempt on `target`; what was changed for it in `adapted`."""
        api = self.upstream_api(target)
        changes = []
        if api in (CHAT, COMPLETIONS) and api == self.client_api:
            payload = upstream_body(self.body, target, stream=stream)
        elif api == self.client_api:
            payload = dict(self.body, model=target.model_id)
        else:
            payload = dict(self._body_in(api), model=target.model_id)
            if self.client_api == RESPONSES:
                changes += self._responses_changes
            if self.client_api == MESSAGES:
                changes += [f"{name} dropped" for name in translation.dropped_for_chat(self.body)]
                changes += deferred_tools.held_words(self.body)
        if api == MESSAGES and self.client_api == MESSAGES and self.betas_dropped:
            changes.append(f"anthropic-beta {', '.join(self.betas_dropped)} dropped")
        changes += clamp_to_context(payload, target)
        self.adapted[target.id] = changes
        if stream and self.continuous_usage(target, api):
            # The engine's own counts on every chunk: a client that leaves mid-stream is charged measured figures
            payload["stream_options"] = {**(payload.get("stream_options") or {}), "continuous_usage_stats": True}
        return api, PATHS[api], payload

    def upstream_headers(self, api):
        """Headers of the client's that go with its body: a Messages body passed through keeps the betas it was
        written for (Claude Code's context_management needs its beta at Anthropic's API)."""
        if api == MESSAGES and self.client_api == MESSAGES and self.betas:
            return {"anthropic-beta": self.betas}
        return {}

    def continuous_usage(self, target, api=None):
        """Whether the gateway asks `target` for usage on every chunk: a local vLLM engine in chat or completions
        (a cloud API may refuse the option)."""
        return target.loopback_ok and (api or self.upstream_api(target)) in (CHAT, COMPLETIONS)

    def client_wants_every_usage(self):
        return bool((self.body.get("stream_options") or {}).get("continuous_usage_stats"))

    def answer(self, target, data):
        """(the client's body, the usage fields) of a channel's whole answer; UpstreamError("malformed") when it is
        not an answer of the API it was asked in or cannot be translated."""
        api = self.upstream_api(target)
        if not isinstance(data, dict):
            raise UpstreamError("malformed", "the channel's answer is not a JSON object")
        if api in (CHAT, COMPLETIONS) and "choices" not in data:
            raise UpstreamError("malformed", "the channel's answer has no choices")
        if api == MESSAGES and (data.get("type") != "message" or not isinstance(data.get("content"), list)):
            raise UpstreamError("malformed", "the channel's answer is not a Messages response")
        if api == RESPONSES and not isinstance(data.get("output"), list):
            raise UpstreamError("malformed", "the channel's answer has no output")
        if api == EMBEDDINGS and not isinstance(data.get("data"), list):
            raise UpstreamError("malformed", "the channel's answer has no embeddings")
        usage = (messages_usage(data.get("usage")) if api == MESSAGES else responses_usage(data) if api == RESPONSES
                 else openai_usage(data.get("usage")))
        try:
            if api == CHAT and self.client_api == RESPONSES:
                data = responses_translation.chat_response_to_responses(data, self.body, model=self.model)
            elif api == CHAT and self.client_api == MESSAGES:
                data = translation.chat_response_to_messages(data, model=self.model)
            elif api == MESSAGES and self.client_api == CHAT:
                data = translation.messages_response_to_chat(data, model=self.model)
            elif api == MESSAGES:
                data["id"] = translation.message_id(data.get("id"))  # vLLM's Messages ids are chatcmpl-...
        except translation.MalformedAnswer as error:
            raise UpstreamError("malformed", str(error)) from None
        data["model"] = self.model
        return data, usage

    def stream_adapter(self, target, exchange):
        """How the channel's stream reaches the client; None for chat or completions passed through (the relay of
        panel/gateway/responses.py does that itself)."""
        api = self.upstream_api(target)
        if api == self.client_api and api in (CHAT, COMPLETIONS):
            return None
        if api == MESSAGES and self.client_api == MESSAGES:
            return MessagesPassthrough(exchange, self.model)
        if api == CHAT and self.client_api == RESPONSES:
            return ChatToResponses(exchange, self.model, self.body)
        if api == CHAT:
            return ChatToMessages(exchange, self.model)
        if api == MESSAGES:
            return MessagesToChat(exchange, self.model,
                                  wants_usage=bool((self.body.get("stream_options") or {}).get("include_usage")))
        return ResponsesPassthrough(exchange, self.model)

    def error_body(self, status, message, *, kind, code):
        """An error body in the client's API."""
        if self.client_api == MESSAGES:
            return messages_api.error_body(status, message)
        if self.client_api == RESPONSES and code == "upstream_not_found" and any(
                speaks(target, RESPONSES) for target in self.targets):
            message += NOT_FOUND_HINT
        return openai_error_body(message, kind=kind, code=code)


def lets_model_call_tools(body):
    """Whether a chat or Messages request offers tools and lets the model choose to call them (vLLM needs its auto
    tool choice for that; a tool_choice of "none" does not)."""
    if not body.get("tools"):
        return False
    choice = body.get("tool_choice")
    return not (choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"))


def clamp_to_context(payload, target):
    """Lower an answer's limit that a local engine would refuse (vLLM answers 400 to max_tokens, or a Responses
    request's max_output_tokens, over its context; Claude Code asks for 32,000) to the engine's context, in place; the
    change in words, or []."""
    if not target.context_tokens:
        return []
    changes = []
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        asked = payload.get(name)
        if isinstance(asked, int) and asked > target.context_tokens:
            payload[name] = target.context_tokens
            changes.append(f"{name} lowered from {asked} to {target.context_tokens} (the model's context)")
    return changes


def adapted_header(changes):
    """The response header that names what the gateway changed in a request for the channel that answered."""
    return [(b"x-tokenwise-adapted", "; ".join(changes).encode("ascii", "replace"))] if changes else []


# ------------------------------------------------------------------------------------------------- streams

def _event_of(line):
    """The JSON object of an SSE data line, None for any other line or [DONE]."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        event = safejson.loads(data)
    except ValueError:
        raise UpstreamError("malformed", "the channel's stream has an event that is not JSON") from None
    if not isinstance(event, dict):
        raise UpstreamError("malformed", "an event that is not a JSON object")
    return event


def _is_done(line):
    return line.startswith("data:") and line[5:].strip() == "[DONE]"


class StreamAdapter:
    """One channel stream on its way to the client: `feed(line)` gives what to send for one upstream line (and
    sets the exchange's usage and first-token time), `finished` once the stream's last event was seen, and
    `failure(error)` the error event in the client's API."""

    def __init__(self, exchange, model):
        self.exchange = exchange
        self.model = model
        self.finished = False

    def content_arrived(self, text=""):
        self.exchange.content_arrived(text)

    def failure(self, error):
        event = {"error": {"message": str(error), "type": "upstream_error", "code": error.kind}}
        return b"data: " + safejson.dumps(event) + b"\n\n"


def _messages_failure(error):
    return messages_api.sse_event("error", {"type": "error", "error": {"type": "api_error", "message": str(error)}})


def _raise_error_event(event):
    error = event.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    raise UpstreamError("error_event", f"the channel sent an error event mid-stream: {message or 'no message'}")


class MessagesPassthrough(StreamAdapter):
    """A Messages stream to a Messages client: the events as they come, the model renamed, the usage read."""

    def __init__(self, exchange, model):
        super().__init__(exchange, model)
        self.usage = {}

    def feed(self, line):
        event = _event_of(line)
        if event is None:
            return []
        kind = event.get("type")
        if kind == "error":
            _raise_error_event(event)
        if kind == "message_start" and isinstance(event.get("message"), dict):
            event["message"]["model"] = self.model
            event["message"]["id"] = translation.message_id(event["message"].get("id"))
            self.usage.update(event["message"].get("usage") or {})
        elif kind == "message_delta":
            self.usage.update(event.get("usage") or {})
        elif kind == "content_block_delta":
            self.content_arrived((event.get("delta") or {}).get("text") or "")
        self.exchange.take_usage(messages_usage(self.usage))
        self.finished = kind == "message_stop"
        return [messages_api.sse_event(kind or "message", event)]

    failure = staticmethod(_messages_failure)


class ChatToMessages(StreamAdapter):
    """A chat completions stream to a Messages client, translated event by event."""

    def __init__(self, exchange, model):
        super().__init__(exchange, model)
        self.converter = translation.ChatStreamToMessages(model=model)
        self.started = False

    def feed(self, line):
        if not line.startswith("data:"):
            return []
        events = []
        if not self.started:
            self.started = True
            events += self.converter.start() + [("ping", {"type": "ping"})]
        if _is_done(line):
            self.finished = True
            events += self.converter.finish()
        elif (chunk := _event_of(line)) is not None:
            if "error" in chunk:
                _raise_error_event(chunk)
            if chunk.get("usage"):
                self.exchange.take_usage(openai_usage(chunk["usage"]))
            try:
                translated = self.converter.feed(chunk)
            except translation.MalformedAnswer as error:
                raise UpstreamError("malformed", str(error)) from None
            for name, data in translated:
                if name == "content_block_delta":
                    self.content_arrived((data.get("delta") or {}).get("text") or "")
            events += translated
        return [messages_api.sse_event(name, data) for name, data in events]

    failure = staticmethod(_messages_failure)


class MessagesToChat(StreamAdapter):
    """A Messages stream to a chat client, translated into chat completion chunks and [DONE]."""

    def __init__(self, exchange, model, *, wants_usage):
        super().__init__(exchange, model)
        self.converter = translation.MessagesStreamToChat(model=model)
        self.wants_usage = wants_usage
        self.usage = {}

    def feed(self, line):
        event = _event_of(line)
        if event is None:
            return []
        kind = event.get("type")
        if kind == "error":
            _raise_error_event(event)
        if kind == "message_start":
            self.usage.update((event.get("message") or {}).get("usage") or {})
        elif kind == "message_delta":
            self.usage.update(event.get("usage") or {})
        self.exchange.take_usage(messages_usage(self.usage))
        out = []
        for chunk in self.converter.feed(event):
            choices = chunk.get("choices")
            if not choices and not self.wants_usage:
                continue  # the usage chunk the client did not ask for
            delta = (choices[0].get("delta") or {}) if choices else {}
            if delta.get("content") or delta.get("tool_calls"):
                self.content_arrived(delta.get("content") or "")
            out.append(b"data: " + safejson.dumps(chunk) + b"\n\n")
        if kind == "message_stop":
            self.finished = True
            out.append(b"data: [DONE]\n\n")
        return out


class ChatToResponses(StreamAdapter):
    """A chat completions stream to a Responses client (Codex), translated into the Responses API's named events."""

    def __init__(self, exchange, model, body):
        super().__init__(exchange, model)
        self.converter = responses_translation.ChatStreamToResponses(body, model=model)
        self.started = False

    def feed(self, line):
        if not line.startswith("data:"):
            return []
        events = []
        if not self.started:
            self.started = True
            events += self.converter.start()
        try:
            if _is_done(line):
                self.finished = True
                events += self.converter.finish()
            elif (chunk := _event_of(line)) is not None:
                if "error" in chunk:
                    _raise_error_event(chunk)
                if chunk.get("usage"):
                    self.exchange.take_usage(openai_usage(chunk["usage"]))
                events += self.converter.feed(chunk)
        except translation.MalformedAnswer as error:
            raise UpstreamError("malformed", str(error)) from None
        for event in events:
            if event["type"] == "response.output_text.delta":
                self.content_arrived(event["delta"])
            elif event["type"] == "response.output_item.added" and event["item"]["type"] != "message":
                self.content_arrived()  # a tool call is the answer's first content too
        return [_named_event(event) for event in events]

    def failure(self, error):
        return _responses_failure(error)


def _named_event(event):
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _responses_failure(error):
    return _named_event({"type": "error", "code": error.kind, "message": str(error), "param": None})


class ResponsesPassthrough(StreamAdapter):
    """A /v1/responses stream passed through: its named events as they come, the usage read from the last one."""

    ENDS = ("response.completed", "response.failed", "response.incomplete")

    def feed(self, line):
        event = _event_of(line)
        if event is None:
            return []
        kind = event.get("type") or "message"
        if kind == "error":
            _raise_error_event(event)
        if kind == "response.output_text.delta":
            self.content_arrived(event.get("delta") or "")
        response = event.get("response")
        if isinstance(response, dict):
            response["model"] = self.model
            if kind in self.ENDS:
                self.exchange.take_usage(responses_usage(response))
        self.finished = kind in self.ENDS
        return [f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()]

    def failure(self, error):
        return _responses_failure(error)
