"""Between OpenAI's Responses API (Codex speaks nothing else) and OpenAI chat completions, for a channel that does not
serve /v1/responses (docs/decisions/0093-responses-translation.md).

- The request: `responses_request_to_chat(body)` gives the chat body and, in words, what it changed (the
  x-tokenwise-adapted header). `instructions` become the first system message; input items become messages (a
  developer message a system one, `function_call` items an assistant turn's tool calls, `function_call_output` a
  tool message, `custom_tool_call` and its output likewise); function tools become chat tools, a namespace's tools
  are named `namespace__tool` (and split again in the answer), a custom (free-form) tool becomes a function with one
  string argument, `input`; `tool_choice`, `parallel_tool_calls`, `max_output_tokens` (as max_tokens),
  `temperature`, `top_p`, `user` and `text.format` (as response_format) carry over.
- What has no counterpart is dropped and named when the answer does not depend on it: reasoning items of earlier
  turns and `reasoning` itself (chat completions take no reasoning settings), the web_search tool (Codex always
  offers it; the model answers without searching, as any chat model does), `include`, `store` (the gateway keeps
  no responses; false is what it does anyway), `prompt_cache_key`, `client_metadata`, `metadata`, `truncation`...
  What would change the answer and cannot be done is refused (`NotTranslatable`, a 400 when no channel is left):
  `previous_response_id` and `conversation` (the gateway stores no responses), the other built-in tools, files,
  item references, a stored prompt. A field this module does not know is carried to chat as it is, never dropped.
- The answer: `chat_response_to_responses` turns a chat completion into a response object, `ChatStreamToResponses`
  a chat stream into the Responses events (response.created, each output item added, its deltas, done, then
  response.completed or response.incomplete with the usage). The reasoning a chat answer carries (vLLM's reasoning
  parsers, DeepSeek: `reasoning_content`) comes back as a reasoning item with its text; the client sends it back on
  its next turn, where it is dropped and named as any reasoning item."""
import json
import time
import uuid

from panel.gateway.translation import MalformedAnswer, NotTranslatable

# Fields whose chat counterpart has the same name and meaning.
SAME_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "user", "service_tier")
# Fields read by the translation itself (not carried as they are).
READ_FIELDS = ("model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "text", "stream",
               "reasoning", "store", "include", "previous_response_id", "conversation", "prompt", "background")
# Fields that steer only OpenAI's own service or the client's bookkeeping: dropped on the way to chat, and named.
DROPPED_FIELDS = ("prompt_cache_key", "prompt_cache_retention", "client_metadata", "metadata", "safety_identifier",
                  "max_tool_calls", "truncation", "stream_options", "top_logprobs")
# The Responses tools a provider runs itself; web_search is dropped (Codex offers it on every request), the others
# would change what the answer is and are refused.
DROPPED_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
NAMESPACE_JOIN = "__"  # chat function names allow [A-Za-z0-9_-]: a namespace's tool is namespace__tool there
CUSTOM_ARGUMENT = "input"  # a custom tool's free-form input, as the one string argument of a chat function
FINISH_TO_STATUS = {"length": ("incomplete", {"reason": "max_output_tokens"}),
                    "content_filter": ("incomplete", {"reason": "content_filter"})}


def _refuse(what):
    raise NotTranslatable(f"{what} cannot be translated to chat completions, which this route's channel speaks")


# ------------------------------------------------------------------------------------------------- the request

def responses_request_to_chat(body):
    """(the chat body without its model, the changes in words) of a Responses request; NotTranslatable when it uses
    what chat completions cannot do."""
    for name in ("previous_response_id", "conversation"):
        if body.get(name) not in (None, "", {}):
            raise NotTranslatable(f"'{name}' names a response stored elsewhere, and the gateway stores none (its "
                                  "channels may differ from one request to the next): send the whole conversation "
                                  "as input items, with store: false, as Codex does")
    if body.get("prompt") not in (None, {}):
        _refuse("'prompt' (a prompt template stored at OpenAI)")
    changes = []
    chat = {"messages": _instructions(body.get("instructions")) + _input_to_messages(body["input"], changes)}
    tools, namespaces = _tools_to_chat(body.get("tools") or [], changes)
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice_to_chat(body["tool_choice"], namespaces)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in SAME_FIELDS:
        if body.get(name) is not None:
            chat[name] = body[name]
    chat.update(_text_to_chat(body.get("text"), changes))
    changes += _dropped_fields(body)
    for name, value in body.items():  # what this module does not know goes on as it is: never silently dropped
        if name not in (*READ_FIELDS, *SAME_FIELDS, *DROPPED_FIELDS) and value is not None:
            chat[name] = value
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat, changes


def _dropped_fields(body):
    """In words, the fields left out of the chat request because nothing in chat completions does what they ask."""
    words = [f"{name} dropped" for name in DROPPED_FIELDS if body.get(name) not in (None, "", {}, [])]
    if body.get("reasoning") not in (None, {}):
        words.append("reasoning dropped (chat completions take no reasoning settings)")
    if body.get("include"):
        words.append(f"include {', '.join(map(str, body['include']))} dropped (a chat answer has none)")
    if body.get("store") is True:
        words.append("store ignored (the gateway keeps no responses)")
    return words


def _instructions(instructions):
    if instructions in (None, ""):
        return []
    if isinstance(instructions, list):  # the instructions of a stored prompt, as input items
        return _input_to_messages(instructions, [])
    return [{"role": "system", "content": instructions}]


def _input_to_messages(items, changes):
    """The chat messages of a Responses input: a string is one user message; items in order, consecutive tool
    calls joined into the assistant turn before them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages, reasoning = [], 0
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise NotTranslatable(f"input item {position} is not an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            messages.append(_message_to_chat(item, position))
        elif kind in ("function_call", "custom_tool_call"):
            _assistant_turn(messages)["tool_calls"].append(_call_to_chat(item, position))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                             "content": _output_text(item.get("output"), position, changes)})
        elif kind == "reasoning":
            reasoning += 1  # the model's own earlier reasoning, often encrypted: a chat model takes none
        elif kind in ("web_search_call",):
            changes.append(f"a web_search_call item of an earlier turn dropped (input item {position})")
        else:
            _refuse(f"a {kind!r} input item (item {position})")
    if reasoning:
        changes.append(f"{reasoning} reasoning item{'s' if reasoning > 1 else ''} of earlier turns dropped")
    return messages


def _assistant_turn(messages):
    """The assistant turn a tool call joins: the one just before, or a new one."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": None}
        messages.append(last)
    last.setdefault("tool_calls", [])
    return last


def _message_to_chat(item, position):
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        _refuse(f"a message with role {role!r} (input item {position})")
    role = "system" if role == "developer" else role
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise NotTranslatable(f"the content of input item {position} is neither text nor a list of parts")
    parts = [_part_to_chat(part, position) for part in content]
    if all(part["type"] == "text" for part in parts):
        return {"role": role, "content": "\n\n".join(part["text"] for part in parts)}
    if role != "user":
        _refuse(f"an image in a {role} message (input item {position})")
    return {"role": role, "content": parts}


def _part_to_chat(part, position):
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text", "summary_text"):
        return {"type": "text", "text": part.get("text") or ""}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal") or ""}
    if kind == "input_image" and part.get("image_url"):
        image = {"url": part["image_url"]}
        if part.get("detail") in ("low", "high", "auto"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_image":
        _refuse(f"an image by file_id (input item {position}; an image_url can be)")
    _refuse(f"a {kind!r} content part (input item {position}; text and images can be)")


def _output_text(output, position, changes):
    """A tool's output as a tool message's text (its text parts joined); a chat tool message takes nothing else, so
    an image or a file in it is dropped and named."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        return json.dumps(output)
    texts = [part for part in output if isinstance(part, dict) and part.get("type") in ("input_text", "output_text",
                                                                                        "text")]
    others = [part.get("type") if isinstance(part, dict) else type(part).__name__ for part in output
              if not any(part is text for text in texts)]
    if others:
        changes.append(f"{', '.join(map(str, others))} in the output of input item {position} dropped (a chat "
                       "tool message holds text only)")
    return "".join(part.get("text") or "" for part in texts)


def _call_to_chat(item, position):
    name = item.get("name") or ""
    if item.get("namespace"):
        name = f"{item['namespace']}{NAMESPACE_JOIN}{name}"
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({CUSTOM_ARGUMENT: item.get("input") or ""})
    else:
        arguments = item.get("arguments") or "{}"
    if not item.get("call_id"):
        raise NotTranslatable(f"the tool call of input item {position} has no call_id")
    return {"id": str(item["call_id"]), "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_to_chat(tool, name):
    function = {"name": name, "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _custom_to_chat(tool, name):
    """A free-form tool (its input is any text, e.g. a patch) as a function with one string argument."""
    described = tool.get("description") or ""
    function = {"name": name, "description": described, "parameters": {
        "type": "object", "properties": {CUSTOM_ARGUMENT: {"type": "string"}}, "required": [CUSTOM_ARGUMENT]}}
    return {"type": "function", "function": function}


def _tools_to_chat(tools, changes):
    """(chat tools, the names of the namespaces seen) of a Responses request's tools."""
    chat, namespaces = [], set()
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            chat.append(_function_to_chat(tool, tool.get("name") or ""))
        elif kind == "custom":
            chat.append(_custom_to_chat(tool, tool.get("name") or ""))
        elif kind == "namespace":
            namespaces.add(tool.get("name") or "")
            for inner in tool.get("tools") or []:
                name = f"{tool.get('name')}{NAMESPACE_JOIN}{inner.get('name')}"
                chat.append(_custom_to_chat(inner, name) if inner.get("type") == "custom"
                            else _function_to_chat(inner, name))
        elif kind in DROPPED_TOOLS:
            changes.append(f"{kind} tool dropped (the channel cannot search the web)")
        else:
            _refuse(f"the built-in tool {kind!r} (it runs at OpenAI; function tools can be)")
    return chat, namespaces


def _tool_choice_to_chat(choice, namespaces):
    if choice in ("auto", "none", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom"):
        name = choice.get("name") or ""
        if choice.get("namespace"):
            name = f"{choice['namespace']}{NAMESPACE_JOIN}{name}"
        return {"type": "function", "function": {"name": name}}
    _refuse(f"tool_choice {choice!r}")


def _text_to_chat(text, changes):
    """response_format from `text.format`; `text.verbosity` dropped and named."""
    if not isinstance(text, dict):
        return {}
    if text.get("verbosity") is not None:
        changes.append("text.verbosity dropped")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        changes.append(f"text.{', text.'.join(unknown)} dropped")
    form = text.get("format") or {}
    kind = form.get("type")
    if kind in (None, "text"):
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        schema = {name: form[name] for name in ("name", "schema", "strict", "description") if name in form}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    _refuse(f"text.format {kind!r}")


# ------------------------------------------------------------------------------------------------- the answer

def new_id(prefix):
    return f"{prefix}_{uuid.uuid4().hex}"


def responses_usage(usage):
    """The Responses API's usage object from a chat completion's."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") if isinstance(
        usage.get("prompt_tokens_details"), dict) else 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") if isinstance(
        usage.get("completion_tokens_details"), dict) else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(cached or 0)},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": int(reasoning or 0)},
            "total_tokens": prompt + completion}


def response_object(body, *, model, response_id, created_at, status="completed", output=(), usage=None,
                    incomplete=None):
    """A response object, with the request's settings echoed as OpenAI does."""
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "error": None, "incomplete_details": incomplete, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": model, "output": list(output),
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "reasoning": body.get("reasoning"), "store": False, "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": body.get("top_p"), "metadata": body.get("metadata") or {},
            "usage": usage}


def _reasoning_of(message):
    """The reasoning text of a chat message or delta (vLLM's reasoning parsers and DeepSeek name it
    reasoning_content, newer vLLM reasoning), or ""."""
    text = message.get("reasoning_content") or message.get("reasoning")
    return text if isinstance(text, str) else ""


def _reasoning_item(text, item_id=None, status="completed"):
    """The model's reasoning as the Responses API shows it: a reasoning item with its text, no summary."""
    return {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def _message_item(text, item_id=None, status="completed"):
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def tool_namespaces(body):
    """The names of a request's tool namespaces."""
    return {tool.get("name") for tool in body.get("tools") or []
            if isinstance(tool, dict) and tool.get("type") == "namespace"}


def call_item(call_id, name, arguments, namespaces, status="completed"):
    """The output item of a tool call the chat model made: a function_call, its namespace split off the name again
    where the name starts with one of the request's (`namespaces`)."""
    item = {"type": "function_call", "id": new_id("fc"), "call_id": call_id or new_id("call"), "name": name,
            "arguments": arguments, "status": status}
    namespace, _, bare = name.partition(NAMESPACE_JOIN)
    if bare and namespace in namespaces:
        item.update(name=bare, namespace=namespace)
    return item


def custom_item(item, custom_names):
    """`item` (a whole function_call) as a custom_tool_call when its tool was a free-form one."""
    full = f"{item['namespace']}{NAMESPACE_JOIN}{item['name']}" if item.get("namespace") else item["name"]
    if full not in custom_names:
        return item
    try:
        value = json.loads(item["arguments"] or "{}")
    except ValueError:
        raise MalformedAnswer(f"the channel called tool {item['name']!r} with arguments that are not JSON") from None
    text = value.get(CUSTOM_ARGUMENT) if isinstance(value, dict) else None
    custom = {"type": "custom_tool_call", "id": item["id"].replace("fc_", "ctc_", 1), "call_id": item["call_id"],
              "name": item["name"], "input": text if isinstance(text, str) else item["arguments"],
              "status": item["status"]}
    if item.get("namespace"):
        custom["namespace"] = item["namespace"]
    return custom


def custom_tool_names(body):
    """The chat names of a request's free-form tools (their calls go back as custom_tool_call items)."""
    names = set()
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "custom":
            names.add(tool.get("name"))
        for inner in tool.get("tools") or [] if tool.get("type") == "namespace" else []:
            if inner.get("type") == "custom":
                names.add(f"{tool.get('name')}{NAMESPACE_JOIN}{inner.get('name')}")
    return names


def _status_of(finish):
    return FINISH_TO_STATUS.get(finish, ("completed", None))


def chat_response_to_responses(data, body, *, model):
    """A chat completion (whole) as a response object of the Responses API."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output = []
    if _reasoning_of(message):
        output.append(_reasoning_item(_reasoning_of(message)))
    if message.get("content"):
        output.append(_message_item(message["content"]))
    custom, namespaces = custom_tool_names(body), tool_namespaces(body)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(custom_item(call_item(call.get("id"), function.get("name") or "",
                                            function.get("arguments") or "{}", namespaces), custom))
    status, incomplete = _status_of(choice.get("finish_reason"))
    return response_object(body, model=model, response_id=response_id(data.get("id")),
                           created_at=int(data.get("created") or time.time()), status=status, output=output,
                           usage=responses_usage(data.get("usage")), incomplete=incomplete)


def response_id(upstream_id):
    return f"resp_{upstream_id}" if upstream_id and not str(upstream_id).startswith("resp_") else (
        upstream_id or new_id("resp"))


class ChatStreamToResponses:
    """Chat completion chunks in, Responses stream events out (dicts whose "type" is the event's name).

    `start()` gives response.created and response.in_progress; `feed(chunk)` the events a chunk makes (a message
    item opens at the first text, a function_call item at each new tool call, and the item before is done);
    `finish()` closes the last item and gives response.completed (or response.incomplete) with the usage."""

    def __init__(self, body, *, model):
        self.body = body
        self.model = model
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.sequence = 0
        self.output = []  # the items done
        self.open = None  # the open item: {"item", "text" or "arguments", and a tool call's chat index}
        self.tool_indexes_seen = set()
        self.custom = custom_tool_names(body)
        self.namespaces = tool_namespaces(body)
        self.finish_reason = None
        self.usage = None

    def _event(self, kind, **fields):
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, **fields):
        return response_object(self.body, model=self.model, response_id=self.id, created_at=self.created_at,
                               **fields)

    def start(self):
        response = self._response(status="in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def feed(self, chunk):
        events = []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if _reasoning_of(delta):
                events += self._reasoning(_reasoning_of(delta))
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _where(self):
        return {"item_id": self.open["item"]["id"], "output_index": len(self.output)}

    def _reasoning(self, text):
        events = []
        if self.open is None or "reasoning" not in self.open:
            events += self._close()
            item = _reasoning_item("", status="in_progress")
            self.open = {"item": item, "reasoning": []}
            events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        self.open["reasoning"].append(text)
        return events + [self._event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]

    def _text(self, text):
        events = []
        if self.open is None or "text" not in self.open:
            events += self._close()
            item = _message_item("", status="in_progress")
            self.open = {"item": item, "text": []}
            events += [self._event("response.output_item.added", output_index=len(self.output), item=item),
                       self._event("response.content_part.added", **self._where(), content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": []})]
        self.open["text"].append(text)
        return events + [self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                     logprobs=[])]

    def _tool_call(self, call):
        """A chat tool call's piece: its item opened at the first piece, announced (added) once its name is known,
        its arguments as deltas from then on (a free-form tool's at once when it closes)."""
        events = []
        position = call.get("index", 0)
        function = call.get("function") or {}
        if self.open is None or self.open.get("index") != position:
            if position in self.tool_indexes_seen:
                raise MalformedAnswer("the channel streamed a tool call's arguments after the next one began")
            self.tool_indexes_seen.add(position)
            events += self._close()
            self.open = {"id": call.get("id"), "name": "", "arguments": [], "index": position, "item": None}
        self.open["id"] = self.open["id"] or call.get("id")
        self.open["name"] += function.get("name") or ""
        if function.get("arguments"):
            self.open["arguments"].append(function["arguments"])
        if self.open["item"] is None and self.open["name"]:
            item = call_item(self.open["id"], self.open["name"], "", self.namespaces, status="in_progress")
            self.open["item"] = item
            if not self._is_custom(item):
                events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
                pieces = self.open["arguments"]
            else:
                pieces = []
        else:
            pieces = [function["arguments"]] if function.get("arguments") and self.open["item"] else []
        if self.open["item"] is not None and not self._is_custom(self.open["item"]):
            events += [self._event("response.function_call_arguments.delta", **self._where(), delta=piece)
                       for piece in pieces]
        return events

    def _is_custom(self, item):
        full = f"{item['namespace']}{NAMESPACE_JOIN}{item['name']}" if item.get("namespace") else item["name"]
        return full in self.custom

    def _close(self):
        """The events that finish the open item (none when no item is open)."""
        if self.open is None:
            return []
        if self.open["item"] is None:
            raise MalformedAnswer("the channel streamed a tool call without a name")
        item, where, events = self.open["item"], self._where(), []
        if item["type"] == "reasoning":
            text = "".join(self.open["reasoning"])
            item = _reasoning_item(text, item["id"])
            events.append(self._event("response.reasoning_text.done", **where, content_index=0, text=text))
        elif item["type"] == "message":
            text = "".join(self.open["text"])
            part = {"type": "output_text", "text": text, "annotations": []}
            item = _message_item(text, item["id"])
            events += [self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                       self._event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            arguments = "".join(self.open["arguments"]) or "{}"
            item = dict(item, arguments=arguments, status="completed")
            if self._is_custom(item):  # a free-form tool's call: added and done at once, its input whole
                item = custom_item(item, self.custom)
                events.append(self._event("response.output_item.added", output_index=where["output_index"],
                                          item=dict(item, input="", status="in_progress")))
            else:
                events.append(self._event("response.function_call_arguments.done", **where, arguments=arguments))
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=item))
        self.output.append(item)
        self.open = None
        return events

    def finish(self):
        events = self._close()
        status, incomplete = _status_of(self.finish_reason)
        response = self._response(status=status, output=self.output, usage=responses_usage(self.usage),
                                  incomplete=incomplete)
        return events + [self._event(f"response.{status}", response=response)]
