"""OpenAI's Codex CLI (the pinned npm package; `make test` installs it under .node/) through the gateway, as a user
runs it: `codex exec --json` with a custom model provider at the panel and a team key.

Codex speaks only the Responses API, which the gateway passes through to channels that speak it, and translates to
chat completions for a channel set to chat completions only (decision 0093). The upstream is the fake provider,
scripted to answer a first turn with a call of Codex's exec_command tool (`cat notes.txt` in the working folder) and
the next one, which carries the command's output, in text: the CLI runs the command, sends its output and prints the
answer. Two runs are two sessions of two turns each (Codex's session-id header names them), and the usage rows carry
the provider's figures: the web searches it reports counted as its billed tool calls, the cached tokens at their
price."""
import json
from decimal import Decimal

import pytest

from panel.accounts.keys import key_issue
from tests.support.codex_cli import run_codex
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.fake_upstream import content_text
from tests.support.gateway import channel, gateway, records, route_to  # noqa: F401 (fixtures)

# A gateway process per test (tests/support/gateway.py): the CLI's session outlives its checks
GATEWAY_PER_TEST = True

pytestmark = pytest.mark.client
NOTES = "The deploy freeze starts on Friday at 16:00."


def test_the_real_cli_runs_a_command_and_answers_through_the_gateway_each_run_a_session(gateway, team_setup,
                                                                                        tmp_path):
    (tmp_path / "notes.txt").write_text(NOTES + "\n")
    team = team_setup["team_a"]
    with FakeMessagesUpstream(models=("gpt-fake",), api_key="sk-fake-0000", apis="chat", chunks=5, cached_tokens=2,
                              tool_call=("exec_command", {"cmd": "cat notes.txt"})) as fake:
        cloud = channel(team, "openai", fake, "gpt-fake", key="sk-fake-0000", timeout=30,
                        price_input_per_million=Decimal("1.25"), price_output_per_million=Decimal("10"))
        route_to(team, "coder", cloud)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="codex")
        runs = [run_codex(gateway, raw, "coder", tmp_path, "What do my notes in notes.txt say?") for _ in range(2)]
        sent = [request.json for request in fake.requests if request.path == "/v1/responses"]

    for events in runs:
        items = [event["item"] for event in events if event["type"] == "item.completed"]
        assert events[-1]["type"] == "turn.completed", events
        [command] = [item for item in items if item["type"] == "command_execution"]
        assert command["exit_code"] == 0 and command["aggregated_output"] == NOTES + "\n"
        assert items[-1]["type"] == "agent_message" and items[-1]["text"] == content_text(5)
    # The CLI really ran the command: its second request carries the output as the call's result.
    assert len(sent) == 4 and all(body["model"] == "gpt-fake" and body["stream"] for body in sent)
    [output] = [item for item in sent[1]["input"] if item.get("type") == "function_call_output"]
    assert NOTES in output["output"]

    rows = records(4)
    assert all((row.endpoint, row.outcome, row.stream, row.channel) == ("responses", "ok", True, cloud)
               for row in rows)
    assert rows[0].session_id == rows[1].session_id != rows[2].session_id == rows[3].session_id
    assert [row.session_turn for row in rows] == [1, 2, 1, 2] and rows[1].repeated_share > 0.9
    assert rows[0].system_prompt_hash and len({row.system_prompt_hash for row in rows}) == 1  # its developer items
    # Codex offers its web_search tool; the fake provider runs two searches for each answer.
    assert all(row.server_tool_calls == 2 and row.cached_tokens == 2 and row.completion_tokens in (9, 5)
               for row in rows)
    assert all(row.cost > 0 for row in rows)


def test_the_real_cli_runs_a_command_through_a_provider_without_the_responses_api(gateway, team_setup, tmp_path):
    # The provider speaks chat completions only (its /v1/responses answers 404): every turn is translated there and
    # its answer, streamed, back into the Responses events the CLI reads.
    (tmp_path / "notes.txt").write_text(NOTES + "\n")
    team = team_setup["team_a"]
    with FakeMessagesUpstream(models=("chat-fake",), api_key="sk-fake-0000", apis="chat", responses=False, chunks=5,
                              cached_tokens=3, tool_call=("exec_command", {"cmd": "cat notes.txt"})) as fake:
        plain = channel(team, "plain", fake, "chat-fake", key="sk-fake-0000", timeout=30, apis="chat_only",
                        price_input_per_million=Decimal("1"), price_output_per_million=Decimal("4"),
                        price_cached_per_million=Decimal("0.1"))
        route_to(team, "coder", plain)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="codex")
        runs = [run_codex(gateway, raw, "coder", tmp_path, "What do my notes in notes.txt say?") for _ in range(2)]
        sent = list(fake.requests)

    for events in runs:
        items = [event["item"] for event in events if event["type"] == "item.completed"]
        assert events[-1]["type"] == "turn.completed", events
        [command] = [item for item in items if item["type"] == "command_execution"]
        assert command["exit_code"] == 0 and command["aggregated_output"] == NOTES + "\n"
        assert items[-1]["type"] == "agent_message" and items[-1]["text"] == content_text(5)
        # the chat usage's cached tokens, as Responses says them: the CLI adds up its two requests' 3 each
        assert events[-1]["usage"]["cached_input_tokens"] == 6
    # Only chat completions reached the provider; the second turn carries the command's output as a tool message
    # answering the call the provider made.
    assert [request.path for request in sent] == ["/v1/chat/completions"] * 4
    second = sent[1].json
    assert all(body.json["stream"] and body.json["model"] == "chat-fake" for body in sent)
    [call] = [call for message in second["messages"] for call in message.get("tool_calls") or []]
    [result] = [message for message in second["messages"] if message["role"] == "tool"]
    assert result["tool_call_id"] == call["id"] and NOTES in result["content"]
    assert call["function"]["name"] == "exec_command" and json.loads(call["function"]["arguments"]) == {
        "cmd": "cat notes.txt"}
    assert "web_search" not in json.dumps(second["tools"])  # Codex's web_search tool: dropped, and named

    rows = records(4)
    assert all((row.endpoint, row.outcome, row.stream, row.channel) == ("responses", "ok", True, plain)
               for row in rows)
    # Codex's session-id header: one session per run, its turns 1 and 2, named by the CLI (not chained by prefix)
    assert rows[0].session_id == rows[1].session_id != rows[2].session_id == rows[3].session_id
    assert [row.session_turn for row in rows] == [1, 2, 1, 2] and not rows[0].session_id.startswith("p-")
    assert all(row.cached_tokens == 3 and row.server_tool_calls is None for row in rows)
    assert all(row.cost == plain.cost(row.prompt_tokens, row.completion_tokens, 3) > 0 for row in rows)
