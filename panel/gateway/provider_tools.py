"""What a client may have a provider do with the channel's key beyond answering: a channel's key is the operator's,
shared by every team routed to it. A request that would make the provider connect to servers the client names (MCP
servers), run code (code execution, a code interpreter, a container), fetch pages (web fetch) or search the account's
stored files is refused with a 400 naming the field, unless the operator allows it
(TOKENWISE_GATEWAY_PROVIDER_TOOLS). Web search stays allowed: it reaches only the provider's own search, and its
calls are priced (decision 0058). Of the client's `anthropic-beta` header only the betas listed here go on; the
others are dropped and named in the x-tokenwise-adapted header (decision 0084)."""
import re

from django.conf import settings

REFUSED_FIELDS = {
    "mcp_servers": "it makes the provider connect to the MCP servers it names",
    "container": "it runs the request in a code execution container of the provider's",
}
# Tool types the provider runs itself (a type equal to one of these, or with it and "_" in front of a version)
REFUSED_TOOL_TYPES = {
    "mcp": "connects the provider to the MCP server it names",
    "mcp_toolset": "connects the provider to an MCP server",
    "code_execution": "runs code at the provider",
    "code_interpreter": "runs code at the provider",
    "web_fetch": "makes the provider fetch pages",
    "file_search": "searches the files stored in the provider account",
}
# The betas passed on (their names without the date): what Claude Code and the Anthropic SDKs send for features
# that reach nothing but the model.
PASSED_BETAS = ("claude-code", "interleaved-thinking", "context-management", "mid-conversation-tool-changes",
                "thinking-token-count", "advanced-tool-use", "effort", "fine-grained-tool-streaming",
                "prompt-caching", "token-efficient-tools", "output-128k", "context-1m", "extended-cache-ttl",
                "token-counting", "web-search", "tool-search-tool", "structured-outputs", "computer-use")
DATE = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


def _refused_type(tool_type):
    for name, words in REFUSED_TOOL_TYPES.items():
        if tool_type == name or tool_type.startswith(name + "_"):
            return words
    return ""


def body_refusal(body):
    """Why the gateway does not send this request body on, in words; "" when it may."""
    if settings.GATEWAY_PROVIDER_TOOLS:
        return ""
    allow = " (an operator can allow it for the whole installation with TOKENWISE_GATEWAY_PROVIDER_TOOLS=1)"
    for field, words in REFUSED_FIELDS.items():
        if body.get(field) is not None:
            return f"'{field}' is not accepted here: {words}{allow}"
    tools = body.get("tools")
    for position, tool in enumerate(tools if isinstance(tools, list) else ()):
        tool_type = tool.get("type") if isinstance(tool, dict) else None
        words = _refused_type(tool_type) if isinstance(tool_type, str) else ""
        if words:
            return f"tools.{position}: a tool of type '{tool_type}' is not accepted here: it {words}{allow}"
    return ""


def betas_passed(header):
    """(the anthropic-beta value to send on, [the betas dropped])."""
    betas = [beta.strip() for beta in header.split(",") if beta.strip()]
    if settings.GATEWAY_PROVIDER_TOOLS:
        return ",".join(betas), []
    kept = [beta for beta in betas if DATE.sub("", beta) in PASSED_BETAS]
    return ",".join(kept), [beta for beta in betas if beta not in kept]
