"""What a traffic sample keeps of a request and its answer (panel/usage/samples.py keeps it): the conversation as text
chat messages of role system, user or assistant, as an evaluation case holds them, and the answer's text, whatever
API the client spoke. Tool calls and tool results become text in their turns ("[tool call read_file {...}]",
"[tool result] ..."), images and documents a marker, so that a sample can be sent again to any chat channel."""
import json

from panel.gateway.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES

SAMPLED_ENDPOINTS = (CHAT, COMPLETIONS, MESSAGES, RESPONSES)


def conversation_of(endpoint, body):
    """The request's conversation as [{"role", "content"}] of system, user and assistant text."""
    if endpoint == CHAT:
        messages = [_chat_message(message) for message in body.get("messages") or []]
    elif endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else json.dumps(prompt)}]
    elif endpoint == MESSAGES:
        system = body.get("system")
        messages = [{"role": "system", "content": _blocks_text(system)}] if system else []
        messages += [{"role": "user" if message.get("role") == "user" else "assistant",
                      "content": _blocks_text(message.get("content"))} for message in body.get("messages") or []]
    else:
        messages = _responses_conversation(body)
    return [message for message in messages if message["content"].strip()]


def answer_of(endpoint, data):
    """The text of a whole answer in the client's API (tool calls as text, as in the conversation)."""
    if not isinstance(data, dict):
        return ""
    if endpoint == MESSAGES:
        return _blocks_text(data.get("content"))
    if endpoint == RESPONSES:
        return "".join(_blocks_text(item.get("content")) for item in data.get("output") or []
                       if isinstance(item, dict) and item.get("type") == "message")
    choices = data.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    if endpoint == COMPLETIONS:
        return choice.get("text") or ""
    return _chat_message(choice.get("message") or {})["content"]


def _chat_message(message):
    role = message.get("role")
    content = _blocks_text(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        content += f"\n[tool call {function.get('name', '?')} {function.get('arguments', '')}]"
    if role == "tool":
        return {"role": "user", "content": "[tool result] " + content}
    return {"role": role if role in ("system", "assistant") else "system" if role == "developer" else "user",
            "content": content.strip()}


def _blocks_text(content):
    """The text of a string or a list of content blocks of any API."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "tool_use":
            parts.append(f"[tool call {block.get('name', '?')} {json.dumps(block.get('input'), ensure_ascii=False)}]")
        elif kind == "tool_result":
            parts.append("[tool result] " + _blocks_text(block.get("content")))
        elif kind in ("image", "image_url", "input_image", "document", "input_file"):
            parts.append(f"[{kind.replace('_', ' ')}]")
    return "\n".join(part for part in parts if part)


def _responses_conversation(body):
    messages = [{"role": "system", "content": body["instructions"]}] if isinstance(body.get("instructions"),
                                                                                  str) else []
    given = body.get("input")
    if isinstance(given, str):
        return messages + [{"role": "user", "content": given}]
    for item in given or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            messages.append({"role": "assistant",
                             "content": f"[tool call {item.get('name', '?')} {item.get('arguments', '')}]"})
        elif item.get("type") == "function_call_output":
            messages.append({"role": "user", "content": f"[tool result] {item.get('output', '')}"})
        elif "role" in item:
            messages.append(_chat_message(item))
    return messages
