"""A fake provider that speaks Anthropic's Messages API, OpenAI chat completions, or both, with tool calls: the
stand-in for Anthropic (or TaoToken's Anthropic endpoint) and for a chat provider that calls tools, in the tests of
the gateway's Messages endpoint. It is `FakeUpstream` (tests/support/fake_upstream.py: same server, behaviours, recorded
requests) with these paths added:

- POST /v1/messages: Anthropic's request checks (x-api-key, anthropic-version, max_tokens) and answer, whole or as
  Anthropic's stream (message_start, ping, content_block_start/delta/stop, message_delta with usage, message_stop).
  With `tools` and no tool_result in the last turn it calls the first tool with `TOOL_INPUT` (or, given
  `tool_call=(name, input)`, that tool where the request offers it: a real agent then runs it); otherwise it
  answers `chunks` words. Usage reports `cached_tokens` as cache reads and `cache_write_tokens` as cache writes.
- POST /v1/messages/count_tokens: {"input_tokens": the words of the system prompt and the messages}.
- POST /v1/chat/completions with `tools` and no tool message last: a tool call (whole or streamed in pieces).
- POST /v1/responses (whole or streamed as OpenAI streams it: each output item added, filled and done; usage with
  input_tokens_details.cached_tokens): with function tools and no function_call_output in its input, a function
  call (the first function with `TOOL_INPUT`, or `tool_call`'s); and POST /v1/embeddings (three numbers per input,
  usage with prompt_tokens only), the OpenAI API's other two.

`apis` ("chat", "messages" or "both") says which of the two APIs it serves; the other answers 404. `responses=False`
makes it a chat provider without the Responses API (most of them): /v1/responses answers 404 as well.
"""
import json

from tests.support import fake_upstream
from tests.support.fake_upstream import CHAT_PATH, FakeUpstream, _error_reply, _Reply, content_text

MESSAGES_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
MESSAGES_PATHS = (MESSAGES_PATH, COUNT_PATH)
RESPONSES_PATH = "/v1/responses"
EMBEDDINGS_PATH = "/v1/embeddings"
OPENAI_PATHS = (RESPONSES_PATH, EMBEDDINGS_PATH)
TOOL_INPUT = {"path": "src/app.py", "line": 42}


def _anthropic_error(status, kind, message):
    return _Reply(status, json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode())


def _texts(content):
    if isinstance(content, str):
        return [content]
    texts = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        if block.get("type") == "tool_result":
            texts += _texts(block.get("content"))
    return texts


def messages_prompt_words(body):
    """The input tokens the fake reports for a Messages request: the words of its system prompt and messages."""
    texts = _texts(body.get("system"))
    for message in body.get("messages") or ():
        texts += _texts(message.get("content")) if isinstance(message, dict) else []
    return sum(len(text.split()) for text in texts)


def _wants_tool(body, api, chosen=None):
    """(name, input) of the tool call the fake answers with, or None for a text answer."""
    if not body.get("tools"):
        return None
    last = (body.get("messages") or [{}])[-1]
    names = [tool["function"]["name"] if api == "chat" else tool.get("name") for tool in body["tools"]]
    if api == "chat" and last.get("role") == "tool":
        return None
    content = last.get("content")
    if api != "chat" and isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result"
                                                           for b in content):
        return None
    if chosen is not None:
        return chosen if chosen[0] in names else None
    return names[0], TOOL_INPUT


class FakeMessagesUpstream(FakeUpstream):
    def __init__(self, *args, apis="both", cache_write_tokens=0, tool_call=None, responses=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.apis = apis
        self.responses = responses
        self.tool_call = tool_call
        self.cache_write_tokens = cache_write_tokens

    def behave(self, name, times=None, **options):
        options.setdefault("path", (*fake_upstream.INFERENCE_PATHS, MESSAGES_PATH))
        return super().behave(name, times, **options)

    def _rejection(self, request):
        chat_path = request.path in fake_upstream.INFERENCE_PATHS
        if (chat_path and self.apis == "messages") or (request.path in MESSAGES_PATHS and self.apis == "chat"):
            return _error_reply(404, f"Invalid URL ({request.method} {request.path})")
        if request.path in OPENAI_PATHS:
            if self.apis == "messages" or (request.path == RESPONSES_PATH and not self.responses):
                return _error_reply(404, f"Invalid URL ({request.method} {request.path})")
            if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return _error_reply(401, "Incorrect API key provided.", code="invalid_api_key")
            body = request.json
            if not isinstance(body, dict) or body.get("model") not in self.models or "input" not in body:
                return _error_reply(400, "a model this server has and an input are required")
            return None
        if request.path not in MESSAGES_PATHS:
            return super()._rejection(request)
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return _anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _anthropic_error(400, "invalid_request_error", "messages: Field required")
        if body.get("model") not in self.models:
            return _anthropic_error(404, "not_found_error", f"model: {body.get('model')}")
        if request.path == MESSAGES_PATH and not isinstance(body.get("max_tokens"), int):
            return _anthropic_error(400, "invalid_request_error", "max_tokens: Field required")
        return None

    def _reply(self, request, behaviour):
        body = request.json if isinstance(request.json, dict) else {}
        if request.path == COUNT_PATH:
            return _Reply(body=json.dumps({"input_tokens": messages_prompt_words(body)}).encode())
        if request.path == MESSAGES_PATH:
            return self._messages_reply(body, behaviour)
        if request.path == RESPONSES_PATH:
            return self._responses_reply(body, behaviour)
        if request.path == EMBEDDINGS_PATH:
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            words = sum(len(str(item).split()) for item in inputs)
            document = {"object": "list", "model": body["model"],
                        "usage": {"prompt_tokens": words, "total_tokens": words},
                        "data": [{"object": "embedding", "index": index, "embedding": [0.25, -0.5, 0.125]}
                                 for index in range(len(inputs))]}
            return _Reply(body=json.dumps(document).encode())
        if request.path == CHAT_PATH and _wants_tool(body, "chat", self.tool_call):
            return self._chat_tool_reply(body)
        return super()._reply(request, behaviour)

    def _numbers(self, body, behaviour):
        chunks = self.chunks if behaviour.options["chunks"] is None else behaviour.options["chunks"]
        cached = behaviour.options["cached_tokens"]
        cached = self.cached_tokens if cached is None else cached
        return chunks, cached

    def _messages_reply(self, body, behaviour):
        chunks, cached = self._numbers(body, behaviour)
        prompt = messages_prompt_words(body)
        cached = min(cached, prompt)
        written = min(self.cache_write_tokens, prompt - cached)
        tool = _wants_tool(body, "messages", self.tool_call)
        if tool:
            blocks, stop, output = [{"type": "tool_use", "id": "toolu_fake1", "name": tool[0], "input": tool[1]}], \
                "tool_use", 9
        else:
            count = min(chunks, body["max_tokens"])
            blocks, stop, output = [{"type": "text", "text": content_text(count)}], (
                "max_tokens" if count < chunks else "end_turn"), count
        usage = {"input_tokens": prompt - cached - written, "output_tokens": output,
                 "cache_creation_input_tokens": written, "cache_read_input_tokens": cached}
        searches = web_searches(body)
        if searches is not None:  # Anthropic reports the server tools it ran in the usage
            usage["server_tool_use"] = {"web_search_requests": searches, "web_fetch_requests": 0}
        ident = f"msg_fake{next(self._ids)}"
        if not body.get("stream"):
            message = {"id": ident, "type": "message", "role": "assistant", "model": body["model"], "content": blocks,
                       "stop_reason": stop, "stop_sequence": None, "usage": usage}
            return _Reply(body=json.dumps(message).encode(), chunk_count=max(1, output))
        start_usage = dict(usage, output_tokens=1)
        events = [{"type": "message_start", "message": {
            "id": ident, "type": "message", "role": "assistant", "model": body["model"], "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": start_usage}}, {"type": "ping"}]
        block = blocks[0]
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            words = block["text"].split(" ")
            events += [{"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": (" " if i else "") + word}}
                       for i, word in enumerate(words)]
        else:
            events.append({"type": "content_block_start", "index": 0,
                           "content_block": dict(block, input={})})
            arguments = json.dumps(block["input"])
            half = len(arguments) // 2
            events += [{"type": "content_block_delta", "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}
                       for piece in (arguments[:half], arguments[half:])]
        events += [{"type": "content_block_stop", "index": 0},
                   {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": output,
                              **({"server_tool_use": usage["server_tool_use"]} if searches is not None else {})}},
                   {"type": "message_stop"}]
        return _Reply(events=[json.dumps(event).encode() for event in events], chunk_count=len(events), named=True)

    def _chat_tool_reply(self, body):
        name, tool_input = _wants_tool(body, "chat", self.tool_call)
        prompt = fake_upstream.prompt_tokens(body)
        usage = {"prompt_tokens": prompt, "completion_tokens": 9, "total_tokens": prompt + 9,
                 "prompt_tokens_details": {"cached_tokens": min(self.cached_tokens, prompt)}}
        ident = f"chatcmpl-fake{next(self._ids)}"
        arguments = json.dumps(tool_input)
        if not body.get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_fake1", "type": "function", "function": {"name": name, "arguments": arguments}}]}
            document = {"id": ident, "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": usage}
            return _Reply(body=json.dumps(document).encode())
        half = len(arguments) // 2
        deltas = [{"role": "assistant", "content": None},
                  {"tool_calls": [{"index": 0, "id": "call_fake1", "type": "function",
                                   "function": {"name": name, "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:half]}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}]
        chunks = [{"id": ident, "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
        chunks.append({"id": ident, "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"id": ident, "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                           "choices": [], "usage": usage})
        return _Reply(events=[json.dumps(chunk).encode() for chunk in chunks], chunk_count=len(chunks))

    def _responses_reply(self, body, behaviour):
        chunks, cached = self._numbers(body, behaviour)
        items = body["input"] if isinstance(body["input"], list) else []
        source = body["input"] if isinstance(body["input"], str) else " ".join(_texts(
            [block for item in items for block in (item.get("content") if isinstance(item, dict)
                                                   and isinstance(item.get("content"), list) else [item])]))
        prompt = len(str(source).split()) + len(str(body.get("instructions") or "").split())
        tool = _responses_tool(body, items, self.tool_call)
        output = 9 if tool else chunks
        usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": min(cached, prompt)},
                 "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": prompt + output}
        ident = f"resp_fake{next(self._ids)}"
        searches = [{"type": "web_search_call", "id": f"ws_{index}", "status": "completed",
                     "action": {"type": "search", "query": "fake"}} for index in range(web_searches(body) or 0)]
        if tool:
            answer = {"type": "function_call", "id": "fc_fake1", "call_id": "call_fake1", "name": tool[0],
                      "arguments": json.dumps(tool[1]), "status": "completed"}
        else:
            answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": content_text(chunks), "annotations": []}]}
        response = {"id": ident, "object": "response", "created_at": 0, "status": "completed", "model": body["model"],
                    "output": [*searches, answer], "usage": usage}
        if not body.get("stream"):
            return _Reply(body=json.dumps(response).encode())
        events = [{"type": "response.created", "response": dict(response, status="in_progress", output=[], usage=None)}]
        for index, item in enumerate(response["output"]):
            events += _responses_item_events(index, item)
        events.append({"type": "response.completed", "response": response})
        events = [dict(event, sequence_number=number) for number, event in enumerate(events)]
        return _Reply(events=[json.dumps(event).encode() for event in events], chunk_count=len(events), named=True)


def _responses_tool(body, items, chosen):
    """(name, input) of the function the fake calls for a Responses request that offers functions and carries no
    function's output yet (as `_wants_tool` for the other APIs), or None."""
    names = [tool.get("name") for tool in body.get("tools") or () if isinstance(tool, dict)
             and tool.get("type") == "function"]
    if not names or any(isinstance(item, dict) and item.get("type") == "function_call_output" for item in items):
        return None
    if chosen is not None:
        return chosen if chosen[0] in names else None
    return names[0], TOOL_INPUT


def _responses_item_events(index, item):
    """The stream events of one output item, as OpenAI sends them: added, its pieces, done."""
    where = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        arguments, half = item["arguments"], len(item["arguments"]) // 2
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": dict(item, arguments="", status="in_progress")},
                *[{"type": "response.function_call_arguments.delta", **where, "delta": piece}
                  for piece in (arguments[:half], arguments[half:])],
                {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
                {"type": "response.output_item.done", "output_index": index, "item": item}]
    if item["type"] != "message":
        return [{"type": "response.output_item.added", "output_index": index, "item": item},
                {"type": "response.output_item.done", "output_index": index, "item": item}]
    part = item["content"][0]
    text = part["text"]
    return [{"type": "response.output_item.added", "output_index": index,
             "item": dict(item, content=[], status="in_progress")},
            {"type": "response.content_part.added", **where, "content_index": 0, "part": dict(part, text="")},
            *[{"type": "response.output_text.delta", **where, "content_index": 0,
               "delta": (" " if position else "") + word} for position, word in enumerate(text.split(" "))],
            {"type": "response.output_text.done", **where, "content_index": 0, "text": text},
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def web_searches(body):
    """The web searches the fake "runs" for a request that offers its web search tool (Anthropic's web_search_*
    server tool, the Responses API's web_search): two, or the tool's max_uses when lower; None without the tool."""
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and str(tool.get("type", "")).startswith(("web_search", "web_search_preview")):
            return min(2, tool.get("max_uses") or 2)
    return None
