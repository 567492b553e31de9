"""Traffic samples through a real gateway process: off by default; once a route keeps them, answered requests of every
API (chat whole and streamed, Messages streamed with a tool turn) are kept redacted and encrypted with the answer the
client got; a failed request is not kept; the day's allowance holds across requests."""
import anthropic
import openai

from panel.channels.models import Route
from panel.core import crypto
from panel.usage.models import TrafficSample
from panel.usage.samples import sample_content
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.fake_upstream import content_text
from tests.support.gateway import (  # noqa: F401 (fixtures)
    CHAT,
    channel,
    fallback,
    gateway,
    post,
    primary,
    records,
    route_to,
    setup,
)
from tests.support.waiting import wait_until

# A gateway process per test (tests/support/gateway.py): samples are written after the answer, past a test
GATEWAY_PER_TEST = True

SECRET_ASK = ("Customer CUST-123456 (jane.doe@example.com, card 4111 1111 1111 1111) asks why key "
              "sk-live-abcdefghijklmnop1234 was refused.")


def keep(route, per_day=1000, redactions=""):
    Route.objects.filter(pk=route.pk).update(samples_per_day=per_day, sample_redactions=redactions)


def samples(count):
    wait_until(lambda: TrafficSample.objects.count() >= count, seconds=20, message=f"{count} samples")
    return list(TrafficSample.objects.order_by("created_at", "pk"))


def test_a_route_keeps_no_samples_until_it_opts_in(gateway, setup):
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    records(1)
    assert not TrafficSample.objects.exists()


def test_answered_requests_are_kept_redacted_and_encrypted_with_the_answer_the_client_got(gateway, setup, primary):
    keep(setup["route"], redactions=r"CUST-\d{6}")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    whole = client.chat.completions.create(model="chat", max_tokens=5, messages=[
        {"role": "system", "content": "You are the support desk."}, {"role": "user", "content": SECRET_ASK}])
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="chat", max_tokens=5, stream=True, messages=[{"role": "user", "content": "Say three words."}])
        if chunk.choices)
    primary.behave("status_500", times=10)  # both tries of the local channel fail: the cloud answers
    fell_back = client.chat.completions.create(model="chat", max_tokens=5, messages=[{"role": "user",
                                                                                    "content": "Fall back."}])
    records(3)
    first, second, third = samples(3)
    asked = sample_content(first)
    assert asked["messages"] == [
        {"role": "system", "content": "You are the support desk."},
        {"role": "user", "content": "Customer [redacted] ([redacted], card [redacted]) asks why key [redacted] was "
                                    "refused."}]
    assert asked["answer"] == whole.choices[0].message.content and first.redacted == 4
    assert (first.endpoint, first.model, first.channel_id) == ("chat", "chat", setup["local"].pk)
    assert sample_content(second)["answer"] == streamed == content_text(5)
    assert sample_content(third)["answer"] == fell_back.choices[0].message.content
    assert third.channel_id == setup["cloud"].pk
    # Stored encrypted: nothing of the conversation in the row as written.
    assert "support desk" not in first.payload and crypto.decrypt(first.payload).startswith("{")


def test_a_messages_agent_turn_is_kept_as_text_and_a_failed_request_is_not(gateway, setup):
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-ant-0000", apis="messages") as claude:
        route = route_to(setup["team"], "claude", channel(setup["team"], "claude", claude, "claude-fake",
                                                          key="sk-ant-0000", apis="messages", retries=0))
        keep(route)
        client = anthropic.Anthropic(base_url=gateway.url, api_key=setup["raw"], max_retries=0)
        history = [{"role": "user", "content": "Read app.py"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                                      "input": {"path": "app.py"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                 "content": "print('hello')"}]}]
        with client.messages.stream(model="claude", max_tokens=8, system="Be brief.", messages=history) as stream:
            answer = stream.get_final_message()
        claude.behave("status_500")
        try:
            client.messages.create(model="claude", max_tokens=8, messages=[{"role": "user", "content": "fail"}])
        except anthropic.InternalServerError:
            pass
        records(2)
    [sample] = samples(1)
    content = sample_content(sample)
    assert content["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Read app.py"},
        {"role": "assistant", "content": '[tool call read_file {"path": "app.py"}]'},
        {"role": "user", "content": "[tool result] print('hello')"}]
    assert content["answer"] == answer.content[0].text and sample.endpoint == "messages"
    assert TrafficSample.objects.count() == 1  # the failed request was not kept


def test_the_days_allowance_holds_across_requests(gateway, setup):
    keep(setup["route"], per_day=1)
    for _ in range(3):
        assert post(gateway, setup["raw"], CHAT).status_code == 200
    records(3)
    assert len(samples(1)) == 1
