"""What a client may have a provider do with the channel's key beyond answering (panel/gateway/provider_tools.py):
MCP servers, code execution, web fetch and file search are refused with a 400 naming the field, nothing sent; only
the betas that reach nothing but the model go on in anthropic-beta, the others dropped and named."""
import httpx
import pytest

from tests.support.gateway import gateway_for, records
from tests.support.messages_gateway import anthropic_fake, chat_fake, client_for, gateway, setup  # noqa: F401 (fixtures)

ASK = {"model": "claude", "max_tokens": 20, "messages": [{"role": "user", "content": "hello"}]}
REFUSED = [
    ("messages", {"mcp_servers": [{"type": "url", "url": "http://169.254.169.254/mcp", "name": "x"}]},
     "'mcp_servers' is not accepted here"),
    ("messages", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
     "tools.0: a tool of type 'web_fetch_20250910'"),
    ("messages", {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
     "tools.0: a tool of type 'code_execution_20250825'"),
    ("messages", {"container": "container_011"}, "'container' is not accepted here"),
    ("responses", {"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://10.0.0.5/mcp"}]},
     "tools.0: a tool of type 'mcp'"),
    ("responses", {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
     "tools.0: a tool of type 'file_search'"),
]


def send(gateway, raw, endpoint, body, **headers):
    return httpx.post(f"{gateway.url}/v1/{endpoint}", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {raw}", **headers})


@pytest.mark.parametrize("endpoint, extra, words", REFUSED, ids=[case[2][:30] for case in REFUSED])
def test_a_request_that_would_have_the_provider_reach_out_is_refused_and_nothing_is_sent(
        gateway, setup, anthropic_fake, chat_fake, endpoint, extra, words):
    body = dict(ASK, **extra) if endpoint == "messages" else {"model": "local", "input": "hello", **extra}
    response = send(gateway, setup["raw"], endpoint, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert words in message and "TOKENWISE_GATEWAY_PROVIDER_TOOLS" in message
    assert anthropic_fake.requests == [] and chat_fake.requests == []
    [row] = records()
    assert (row.status_code, row.error_kind) == (400, "provider_tool_refused")


def test_web_search_and_the_client_side_tools_still_go_through(gateway, setup, anthropic_fake):
    body = dict(ASK, tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 1},
                            {"name": "read_file", "input_schema": {"type": "object"}}])
    assert send(gateway, setup["raw"], "messages", body).status_code == 200
    assert anthropic_fake.requests[-1].json["tools"] == body["tools"]


def test_only_the_betas_that_reach_nothing_else_go_on_and_the_others_are_named(gateway, setup, anthropic_fake):
    betas = "interleaved-thinking-2025-05-14,mcp-client-2025-04-04,files-api-2025-04-14,claude-code-20250219"
    response = send(gateway, setup["raw"], "messages", ASK, **{"anthropic-beta": betas})
    assert response.status_code == 200, response.text
    passed = anthropic_fake.requests[-1].headers["anthropic-beta"]
    assert passed == "interleaved-thinking-2025-05-14,claude-code-20250219"
    dropped = "anthropic-beta mcp-client-2025-04-04, files-api-2025-04-14 dropped"
    assert response.headers["x-tokenwise-adapted"] == dropped


@pytest.fixture
def allowing(transactional_db, request):
    yield from gateway_for(request, TOKENWISE_GATEWAY_PROVIDER_TOOLS="1", TOKENWISE_BUDGET_CACHE_SECONDS="0")


def test_the_operator_can_allow_provider_tools(allowing, setup, anthropic_fake):
    body = dict(ASK, mcp_servers=[{"type": "url", "url": "https://mcp.example.com/sse", "name": "x"}])
    response = send(allowing, setup["raw"], "messages", body, **{"anthropic-beta": "mcp-client-2025-04-04"})
    assert response.status_code == 200, response.text
    sent = anthropic_fake.requests[-1]
    assert sent.json["mcp_servers"] == body["mcp_servers"]
    assert sent.headers["anthropic-beta"] == "mcp-client-2025-04-04"
