"""The Anthropic Messages API as the gateway receives it: the request checked before anything is sent (400 with
Anthropic's error shape, naming the field), the key from `x-api-key` (as Anthropic clients send it) or `Bearer`,
and the wire format of errors and stream events.

Anthropic's error body is {"type": "error", "error": {"type": ..., "message": ...}} and the SDKs map the status
code to their exception (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error, 529 overloaded_error). A spent
budget answers 402 like the chat endpoints do (the SDKs raise it as an APIStatusError and do not retry it)."""
import json

from django.conf import settings

ROLES = ("user", "assistant")
# A message with role "system" in the middle of a conversation (Claude Code sends its context that way): text only.
SYSTEM_ROLE = "system"
THINKING_TYPES = ("enabled", "disabled", "adaptive")
BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "document", "thinking", "redacted_thinking",
               "server_tool_use", "web_search_tool_result", "search_result", "container_upload")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 499: "invalid_request_error",
               502: "api_error", 503: "overloaded_error", 504: "api_error"}


class MessagesRequestError(ValueError):
    """A Messages request the gateway refuses before sending it anywhere (400); the message names the field."""


def parse_messages_request(body, *, count_only=False):
    """Check a Messages request body (already a dict) and return it. `count_only`: the count_tokens endpoint,
    which takes no max_tokens and no sampling."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise MessagesRequestError("model: a string is required")
    if not count_only:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not (
                1 <= max_tokens <= settings.GATEWAY_MAX_TOKENS):
            raise MessagesRequestError(f"max_tokens: a whole number from 1 to {settings.GATEWAY_MAX_TOKENS} is "
                                       "required")
        if "stream" in body and not isinstance(body["stream"], bool):
            raise MessagesRequestError("stream: must be true or false")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesRequestError("messages: a non-empty list is required")
    for position, message in enumerate(messages):
        _check_message(message, f"messages.{position}")
    _check_system(body.get("system"))
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise MessagesRequestError("tools: must be a list")
        for position, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
                raise MessagesRequestError(f"tools.{position}: each tool needs a name")
            if tool.get("type") in (None, "custom") and not isinstance(tool.get("input_schema"), dict):
                raise MessagesRequestError(f"tools.{position}.input_schema: an object (a JSON schema) is required")
    choice = body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict)
                               or choice.get("type") not in ("auto", "any", "tool", "none")
                               or (choice.get("type") == "tool" and not isinstance(choice.get("name"), str))):
        raise MessagesRequestError("tool_choice: one of {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                                   "{\"type\": \"none\"} or {\"type\": \"tool\", \"name\": ...}")
    for name, low, high in (("temperature", 0, 1), ("top_p", 0, 1)):
        value = body.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not low <= value <= high):
            raise MessagesRequestError(f"{name}: a number from {low} to {high}")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops)):
        raise MessagesRequestError("stop_sequences: a list of strings")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise MessagesRequestError("metadata: must be an object")
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES):
        raise MessagesRequestError("thinking: {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": "
                                   "\"adaptive\"} or {\"type\": \"disabled\"}")
    for name in ("output_config", "context_management"):
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise MessagesRequestError(f"{name}: must be an object")
    return body


def _check_message(message, where):
    if isinstance(message, dict) and message.get("role") == SYSTEM_ROLE:
        _check_system(message.get("content"), f"{where}.content")
        return
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise MessagesRequestError(f"{where}.role: must be \"user\", \"assistant\" or \"system\"")
    content = message.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise MessagesRequestError(f"{where}.content: a string or a list of content blocks")
    for position, block in enumerate(content):
        _check_block(block, f"{where}.content.{position}")


def _check_block(block, where):
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        raise MessagesRequestError(f"{where}.type: a content block type such as \"text\", \"image\", "
                                   "\"tool_use\" or \"tool_result\"")
    kind = block["type"]
    if kind == "text" and not isinstance(block.get("text"), str):
        raise MessagesRequestError(f"{where}.text: a string is required")
    if kind == "tool_use" and not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
                                   and isinstance(block.get("input", {}), dict)):
        raise MessagesRequestError(f"{where}: a tool_use block needs an id, a name and an input object")
    if kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise MessagesRequestError(f"{where}.tool_use_id: a string is required")
        content = block.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise MessagesRequestError(f"{where}.content: a string or a list of content blocks")
        for position, inner in enumerate(content if isinstance(content, list) else []):
            if isinstance(inner, dict) and inner.get("type") == "tool_reference":  # a tool search found a tool
                if not isinstance(inner.get("tool_name"), str):
                    raise MessagesRequestError(f"{where}.content.{position}.tool_name: a string is required")
                continue
            _check_block(inner, f"{where}.content.{position}")


def _check_system(system, where="system"):
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list) or not all(isinstance(block, dict) and block.get("type") == "text"
                                               and isinstance(block.get("text"), str) for block in system):
        raise MessagesRequestError(f"{where}: a string or a list of text blocks")


def api_key(scope):
    """The key an Anthropic client sends (x-api-key), or None to look for a Bearer one."""
    for name, value in scope["headers"]:
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


def error_body(status, message):
    return json.dumps({"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                                  "message": message}}).encode()


def sse_event(name, data):
    """One server-sent event in Anthropic's framing: its name and its JSON data."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
