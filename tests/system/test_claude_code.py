"""Claude Code's own CLI (the pinned npm package; `make test` installs it under .node/) through the gateway, as a
user runs it: `claude -p ... --output-format json` with ANTHROPIC_BASE_URL at the panel and a team key.

The upstream is the fake provider, scripted to answer the CLI's first turn with a call of its Read tool on a file
in the working folder, and the next one (which carries the tool's result) in text: the CLI runs the tool, sends its
result and prints the answer. Once to a channel that speaks Messages (passed through), once to one that speaks only
chat completions (translated both ways). The usage rows show one session with its turns and cache figures. Its
ToolSearch the same two ways: the tool it finds reaches the next request (decision 0073)."""
import json
from decimal import Decimal

import pytest

from panel.accounts.keys import key_issue
from tests.support.claude_code import run_claude
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.fake_upstream import content_text
from tests.support.gateway import channel, records, route_to
from tests.support.gateway_server import GatewayServer

pytestmark = pytest.mark.client
NOTES = "The deploy freeze starts on Friday at 16:00."


@pytest.fixture
def gateway(transactional_db):
    from django.db import connection

    server = GatewayServer(connection.settings_dict["NAME"])
    yield server
    server.stop()


@pytest.mark.parametrize("apis", ["messages", "chat"])
def test_the_real_cli_runs_a_tool_and_answers_through_the_gateway_as_one_session(gateway, team_setup, tmp_path,
                                                                                apis):
    notes = tmp_path / "notes.txt"
    notes.write_text(NOTES + "\n")
    team = team_setup["team_a"]
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-fake-0000", apis=apis, chunks=5,
                              cached_tokens=40, cache_write_tokens=20,
                              tool_call=("Read", {"file_path": str(notes)})) as fake:
        cloud = channel(team, "cloud", fake, "claude-fake", key="sk-fake-0000", apis=apis, timeout=30,
                        price_input_per_million=Decimal("3"), price_output_per_million=Decimal("15"),
                        price_cached_per_million=Decimal("0.3"), price_cache_write_per_million=Decimal("3.75"))
        route_to(team, "agent", cloud)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="claude-code")
        result = run_claude(gateway, raw, "agent", tmp_path, "What do my notes in notes.txt say?")
        sent = [request.json for request in fake.requests if request.path.endswith(("/messages",
                                                                                    "/chat/completions"))]

    assert result["is_error"] is False and result["subtype"] == "success", result
    assert result["result"] == content_text(5) and result["num_turns"] == 2
    # The CLI really ran its Read tool: the second turn carries the file's text as the tool's result.
    last = sent[-1]["messages"][-1]
    carried = json.dumps(last["content"] if apis == "messages" else sent[-1]["messages"])
    assert NOTES in carried and (apis == "chat" or last["content"][0]["type"] == "tool_result")
    if apis == "chat":  # translated: the mid-conversation system message stayed one, the thinking settings went
        assert "system" in [message["role"] for message in sent[0]["messages"][1:]]
        assert "thinking" not in sent[0] and sent[0]["max_tokens"] == 32000

    rows = records(len(sent))
    turns = [row for row in rows if row.endpoint == "messages"]
    assert len(turns) == 2 and all(row.outcome == "ok" and row.channel == cloud for row in turns)
    assert turns[0].session_id and {row.session_id for row in turns} == {turns[0].session_id}
    assert [row.session_turn for row in turns] == [1, 2]
    if apis == "messages":  # the provider's cache reads and writes, priced as such
        assert all(row.cached_tokens == 40 and row.cache_write_tokens == 20 for row in turns)
        assert all(row.cost > 0 for row in turns)


@pytest.mark.parametrize("apis", ["messages", "chat"])
def test_the_real_clis_tool_search_finds_a_deferred_tool_through_the_gateway(gateway, team_setup, tmp_path, apis):
    """The CLI's ToolSearch runs in the CLI; its result names the tool it found in a tool_reference block, and the
    next request lists that tool, deferred. Passed through as sent; on a chat channel the tool is sent once found and
    the never-found placeholder is held (decision 0073)."""
    team = team_setup["team_a"]
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-fake-0000", apis=apis, chunks=5,
                              tool_call=("ToolSearch", {"query": "notebook"})) as fake:
        cloud = channel(team, "cloud", fake, "claude-fake", key="sk-fake-0000", apis=apis, timeout=30)
        route_to(team, "agent", cloud)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="claude-code")
        result = run_claude(gateway, raw, "agent", tmp_path, "Find a tool to edit notebooks")
        sent = [request.json for request in fake.requests if request.path.endswith(("/messages",
                                                                                    "/chat/completions"))]

    assert result["is_error"] is False and result["result"] == content_text(5), result
    first, second = sent[-2:]
    if apis == "messages":
        assert second["messages"][-1]["content"][0]["content"] == [{"type": "tool_reference",
                                                                    "tool_name": "NotebookEdit"}]
        assert {tool["name"] for tool in second["tools"] if tool.get("defer_loading")} >= {"NotebookEdit"}
    else:
        names = [[tool["function"]["name"] for tool in body["tools"]] for body in (first, second)]
        assert "ToolSearch" in names[0] and "NotebookEdit" not in names[0] and "NotebookEdit" in names[1]
        assert not any("DeferredToolPlaceholder" in turn for turn in names)
        last = second["messages"][-1]
        assert last["role"] == "tool" and last["content"] == "Tool found and now available: NotebookEdit"
    rows = records(len(sent))
    assert [row.outcome for row in rows] == ["ok"] * len(sent)
