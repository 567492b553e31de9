"""What a request is charged when its usage never arrives: a client that hangs up mid-stream is charged its prompt
(estimated from its text) and every content piece relayed to it, the row says which figures are estimated, the
charge counts against its key's budget; a client that leaves while the upstream reads its prompt pays the prompt; a
request every channel refused pays nothing; work the gateway could neither stop nor charge is refused."""
import json
from decimal import Decimal

import httpx
import pytest

from panel.budgets.reservations import prompt_bound
from panel.budgets.services import budget_set
from panel.channels.rules import input_token_estimate
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)

MESSAGES = {"model": "chat", "max_tokens": 20, "messages": [{"role": "user", "content": "one two three four"}]}


def read_then_hang_up(gateway, setup, path, body, events):
    """Stream `body` to `path`, read `events` content events, then close the connection."""
    headers = {"Authorization": f"Bearer {setup['raw']}", "x-api-key": setup["raw"]}
    seen = 0
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{gateway.url}{path}", json=dict(body, stream=True), headers=headers) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                event = json.loads(line[6:]) if line.startswith("data: {") else {}
                chat_piece = [(choice.get("delta") or {}).get("content") for choice in event.get("choices") or []]
                if any(chat_piece) or (event.get("delta") or {}).get("type") == "text_delta":
                    seen += 1
                    if seen == events:
                        break
    return seen


def local_cost(prompt, completion):
    return (prompt * Decimal("0.10") + completion * Decimal("0.20")) / 1_000_000


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)],
                         ids=["chat", "messages"])
def test_a_client_that_hangs_up_mid_stream_pays_its_prompt_and_what_reached_it(gateway, setup, primary, path, body):
    primary.behave("slow_drip", delay=0.3, chunks=20)
    assert read_then_hang_up(gateway, setup, path, body, 3) == 3
    primary.wait_for_disconnects(1, timeout=5)
    [row] = records()
    assert (row.outcome, row.channel) == ("client_closed", setup["local"])
    assert row.tokens_estimated == "prompt+completion"
    assert row.prompt_tokens == input_token_estimate(body) > 0
    assert 3 <= row.completion_tokens < 20  # the pieces relayed before the hang-up, not the whole answer
    assert row.cost == local_cost(row.prompt_tokens, row.completion_tokens) > 0


def test_a_hang_up_counts_against_the_key_budget(gateway, setup, primary):
    most = prompt_bound(CHAT).tokens + CHAT["max_tokens"]  # what a request holds while it runs
    # Room for one request and a prompt: a hang-up charged nothing would leave room for the next one
    budget_set(team=setup["team"], key=setup["key"], tokens_per_month=most + input_token_estimate(CHAT))
    primary.behave("slow_drip", delay=0.3, chunks=20)
    read_then_hang_up(gateway, setup, "/v1/chat/completions", CHAT, 3)
    [row] = records()
    assert row.prompt_tokens + row.completion_tokens > input_token_estimate(CHAT)
    refused = post(gateway, setup["raw"], CHAT)
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "budget_exceeded"


def test_a_client_that_leaves_while_the_upstream_reads_its_prompt_pays_the_prompt(gateway, setup, primary):
    primary.behave("hang_before_headers")
    with pytest.raises(httpx.ReadTimeout):
        post(gateway, setup["raw"], CHAT, timeout=1)
    primary.wait_for_disconnects(1, timeout=5)
    [row] = records()
    assert (row.outcome, row.tokens_estimated) == ("client_closed", "prompt")
    assert (row.prompt_tokens, row.completion_tokens) == (input_token_estimate(CHAT), 0)
    assert row.cost == local_cost(row.prompt_tokens, 0)


def test_a_client_that_leaves_during_a_retry_backoff_pays_nothing(gateway, setup, primary, fallback):
    primary.behave("status_429", retry_after=3)  # answered (refused) at once: no upstream holds the prompt
    with pytest.raises(httpx.ReadTimeout):
        post(gateway, setup["raw"], CHAT, timeout=1)
    [row] = records()
    assert (row.outcome, row.prompt_tokens, row.completion_tokens, row.cost) == ("client_closed", 0, 0, 0)
    assert row.tokens_estimated is None


def test_a_request_every_channel_refused_pays_nothing(gateway, setup, primary, fallback):
    primary.behave("status_500")
    fallback.behave("status_500")
    assert post(gateway, setup["raw"], CHAT).status_code == 502
    [row] = records()
    assert (row.prompt_tokens, row.completion_tokens, row.cost, row.tokens_estimated) == (0, 0, 0, None)


def test_a_finished_answer_keeps_the_upstreams_own_figures(gateway, setup, primary):
    assert post(gateway, setup["raw"], dict(CHAT, stream=True)).status_code == 200
    [row] = records()
    assert row.outcome == "ok" and row.tokens_estimated is None and row.completion_tokens > 0


def test_a_background_response_is_refused_and_nothing_is_sent(gateway, setup, primary, fallback):
    refused = httpx.post(f"{gateway.url}/v1/responses", timeout=30, headers={"Authorization": f"Bearer {setup['raw']}"},
                         json={"model": "chat", "input": "one two three", "background": True})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "background_not_supported" and "neither stopped nor charged" in error["message"]
    assert primary.requests == [] and fallback.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_tokens_are_recorded_where_the_upstream_reports_them(gateway, setup, primary, stream):
    primary.reasoning_tokens = 7
    assert post(gateway, setup["raw"], dict(CHAT, stream=stream)).status_code == 200
    [row] = records()
    assert (row.reasoning_tokens, row.completion_tokens) == (7, 20)  # part of the completion, priced with it
    assert row.cost == local_cost(row.prompt_tokens, 20)
