"""The Responses API in front of the real local engine (the tests' shared engine: the demo model under vLLM 0.32 on
the CPU, 4,096 tokens of context, no tool calling), and Codex on the same route: a rule sends a request whose input
is over the engine's context to a cloud channel that speaks chat completions only.

A short request from the OpenAI SDK is answered by the engine, passed through to vLLM's own /v1/responses while the
channel speaks it and translated to its chat completions when the channel is set to chat completions only; whole
and streamed. Codex's requests (its instructions and tools alone are about 10,000 tokens) go by the rule to the cloud
channel, translated: the CLI runs the command the provider asks for and answers. Every request leaves one usage row
naming its channel and, for Codex's, the rule; Codex's turns are one session; cost and cached tokens are the
provider's."""
from decimal import Decimal

import openai
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route
from panel.channels.rules import rule_save
from panel.usage.models import RequestLog
from tests.support.codex_cli import run_codex
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.fake_upstream import content_text
from tests.support.gateway import channel
from tests.support.gateway_server import GatewayServer
from tests.support.shared_engine import SHARED_ENGINE_FILES
from tests.support.waiting import wait_until

if "tests/system/test_codex_vllm.py" not in SHARED_ENGINE_FILES:
    # The suite refuses a shared-engine test outside that list (xdist keeps them on one worker, one engine).
    pytest.skip("add tests/system/test_codex_vllm.py to SHARED_ENGINE_FILES (tests/support/shared_engine.py)",
                allow_module_level=True)

pytestmark = pytest.mark.client
NOTES = "The deploy freeze starts on Friday at 16:00."
CONTEXT = 4096  # the shared engine's max_model_len (tests/support/shared_engine.py)


def speak(local, apis):
    Channel.objects.filter(pk=local.pk).update(apis=apis)  # the test gateway caches no route


def ask_engine(client):
    """A short Responses request, whole and streamed; (the whole one's raw reply, the streamed events' types)."""
    raw = client.responses.with_raw_response.create(model="tiny-chat", input="Say hello.", max_output_tokens=8,
                                                    instructions="Be brief.")
    reply = raw.parse()
    assert reply.status in ("completed", "incomplete") and reply.usage.output_tokens > 0, reply
    assert reply.model == "tiny-chat" and isinstance(reply.output_text, str)
    events = list(client.responses.create(model="tiny-chat", input="Say hello.", max_output_tokens=8, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert "response.output_text.delta" in kinds and events[-1].response.usage.output_tokens > 0
    return raw, kinds


def test_short_requests_reach_the_engine_both_ways_and_codex_goes_past_its_context_to_the_cloud(
        shared_deployment, team_setup, tmp_path):
    from django.db import connection

    team = team_setup["team_a"]
    deployment = shared_deployment(team)
    local = Channel.objects.get(deployment=deployment)
    assert local.apis == "both" and local.speaks("responses")  # vLLM serves /v1/responses
    route = Route.objects.get(team=team, model_name="tiny-chat")
    (tmp_path / "notes.txt").write_text(NOTES + "\n")
    _, raw = key_issue(team=team, user=team_setup["alice"], name="codex")
    with FakeMessagesUpstream(models=("cloud-fake",), api_key="sk-cloud-0000", apis="chat", responses=False,
                              chunks=5, cached_tokens=4, tool_call=("exec_command", {"cmd": "cat notes.txt"})) as fake:
        cloud = channel(team, "cloud", fake, "cloud-fake", key="sk-cloud-0000", timeout=30, apis="chat_only",
                        price_input_per_million=Decimal("2"), price_output_per_million=Decimal("8"),
                        price_cached_per_million=Decimal("0.5"))
        rule = rule_save(route=route, name="past the engine's context", tokens_over=CONTEXT, channels=[cloud])
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
            passed, _ = ask_engine(client)
            assert "x-tokenwise-adapted" not in passed.headers
            speak(local, "chat_only")  # now translated: Responses in, vLLM's chat completions out
            translated, _ = ask_engine(client)
            assert translated.parse().id.startswith("resp_")
            speak(local, "both")

            events = run_codex(gateway, raw, "tiny-chat", tmp_path, "What do my notes in notes.txt say?")
            wait_until(lambda: RequestLog.objects.count() >= 6, seconds=60, message="usage records")
        finally:
            gateway.stop()
        sent = list(fake.requests)

    items = [event["item"] for event in events if event["type"] == "item.completed"]
    [command] = [item for item in items if item["type"] == "command_execution"]
    assert command["exit_code"] == 0 and command["aggregated_output"] == NOTES + "\n"
    assert items[-1]["type"] == "agent_message" and items[-1]["text"] == content_text(5)
    assert [request.path for request in sent] == ["/v1/chat/completions"] * 2

    rows = list(RequestLog.objects.order_by("created_at"))
    assert len(rows) == 6 and all(row.outcome == "ok" and row.endpoint == "responses" for row in rows), [
        (row.outcome, row.error_kind) for row in rows]
    engine_rows, codex_rows = rows[:4], rows[4:]
    assert all(row.channel_id == local.pk and row.route_rule_id is None and row.prompt_tokens > 0
               and row.completion_tokens > 0 for row in engine_rows)
    assert [row.stream for row in engine_rows] == [False, True, False, True]
    assert all(row.channel_id == cloud.pk and row.route_rule_id == rule.pk and row.stream for row in codex_rows)
    assert codex_rows[0].session_id == codex_rows[1].session_id and codex_rows[0].session_id != ""
    assert [row.session_turn for row in codex_rows] == [1, 2]
    assert all(row.prompt_tokens > 0 and row.cached_tokens == 4 for row in codex_rows)
    assert all(row.cost == cloud.cost(row.prompt_tokens, row.completion_tokens, 4) > 0 for row in codex_rows)
