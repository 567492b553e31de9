"""Anthropic's deferred tools on their way to a channel that speaks only chat completions.

A Messages tool may carry `defer_loading: true` (Anthropic's advanced-tool-use beta): the model does not see it
until a tool search finds it. Claude Code 2.1.332 marks tools so (NotebookEdit among them, and a
`DeferredToolPlaceholder` that keeps the search on) and searches with its own ToolSearch tool, whose result names
each tool found in a `tool_reference` block; from then on the request lists the found tool (the key still on it)
and carries that result in its history. Anthropic's API loads a deferred tool where a reference names it; vLLM 0.32's
own /v1/messages takes the key and the references and hands both to the model's chat template.

Chat completions has neither, so the gateway does with the history it is given what the Anthropic API does: a
deferred tool is sent, as an ordinary tool without the key, once the conversation has loaded it (a tool_reference
names it, an earlier turn called it, or tool_choice names it), and held until then. The agent keeps working as it
does at Anthropic (its search finds the tool, the next request carries it), a placeholder is never offered to the
model as a tool to call, and a client's tens of deferred tools cost no prompt until one is used. When every tool
is deferred none is held: no search tool would be left to find them. A tool_reference reaches the chat model as
text in the tool's result (`reference_text`); the held tools are counted in the x-tokenwise-adapted header."""

REFERENCE = "tool_reference"


def _references(content):
    """The tool names the tool_reference blocks in a tool result's content name."""
    if not isinstance(content, list):
        return []
    return [block.get("tool_name") for block in content if isinstance(block, dict) and block.get("type") == REFERENCE]


def loaded(body):
    """The names of tools the conversation has loaded: referenced by a tool result, called, or chosen."""
    names = set()
    for message in body.get("messages") or ():
        for block in message.get("content") if isinstance(message.get("content"), list) else ():
            if block.get("type") == "tool_result":
                names.update(_references(block.get("content")))
            elif block.get("type") == "tool_use":
                names.add(block.get("name"))
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        names.add(choice.get("name"))
    return names


def held(body):
    """The names of the deferred tools a chat channel is not sent yet, in the order the client listed them."""
    tools = body.get("tools") or []
    deferred = [tool["name"] for tool in tools if tool.get("defer_loading")]
    if len(deferred) == len(tools):
        return []  # nothing left to search with: send them all
    found = loaded(body)
    return [name for name in deferred if name not in found]


def held_words(body):
    """The x-tokenwise-adapted entry for the held tools, or []."""
    count = len(held(body))
    if not count:
        return []
    return [f"{count} deferred tool{'s' if count > 1 else ''} held until tool search finds "
            f"{'them' if count > 1 else 'it'}"]


def reference_text(content):
    """The text a chat model reads for the tool_reference blocks of a tool result ("" when there are none)."""
    names = [name for name in _references(content) if name]
    if not names:
        return ""
    return f"Tool{'s' if len(names) > 1 else ''} found and now available: {', '.join(names)}"
