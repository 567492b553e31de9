"""A budget holds exactly under load: 16 concurrent streams, spread over two gateway processes on one database and
one Redis, against a provider that bills prompts as a real chat template does (more than the gateway's estimate),
end with the key's usage rows at or under its budget, in tokens and in money; the rest are refused with 402 and
words, and no hold is left."""
import concurrent.futures
from decimal import Decimal

import httpx
import pytest
import redis
from django.conf import settings
from django.db.models import Sum

from panel.accounts.keys import key_issue
from panel.budgets.counters import held_keys, month_of
from panel.budgets.services import budget_set
from panel.channels.rules import input_token_estimate
from panel.usage.models import RequestLog
from tests.support.fake_provider import GOOD_KEY, FakeProvider
from tests.support.gateway import channel, route_to
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 20,
        "stream": True}
STREAMS = 16
PRICE = Decimal("10000")  # per million tokens, in and out: a cent a token


@pytest.fixture
def two_gateways(transactional_db):
    from django.db import connection

    servers = [GatewayServer(connection.settings_dict["NAME"], TOKENWISE_BUDGET_CACHE_SECONDS="0",
                             TOKENWISE_GATEWAY_ADVANCE_IDLE_SECONDS="1") for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def templated(team_setup):
    """A route to a provider that bills SmolLM2's chat template (its default system prompt included), each token of
    its answers 10 ms apart."""
    provider = FakeProvider()
    provider.behaviour, provider.chunk_delay = "template", 0.01
    team = team_setup["team_a"]
    smol = channel(team, "smol", f"{provider.url}/v1", "tiny", key=GOOD_KEY, timeout=20, retries=0,
                   price_input_per_million=PRICE, price_output_per_million=PRICE)
    route_to(team, "chat", smol)
    key, raw = key_issue(team=team, user=team_setup["alice"], name="app")
    yield {**team_setup, "team": team, "provider": provider, "key": key, "raw": raw}
    provider.close()


def stream(url, raw):
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=CHAT, timeout=60,
                      headers={"Authorization": f"Bearer {raw}"}) as response:
        return response.status_code, b"".join(response.iter_bytes())


def until_refused(servers, raw, first):
    """One client's requests, each to the next gateway process in turn, until one is refused: [(status, body)]."""
    answers = []
    while not answers or answers[-1][0] == 200:
        answers.append(stream(servers[(first + len(answers)) % len(servers)].url, raw))
        assert len(answers) < 100, "never refused"
    return answers


@pytest.mark.parametrize("budget", ["tokens", "money"])
def test_sixteen_streams_over_two_gateway_processes_spend_at_most_the_budget(two_gateways, templated, budget):
    team, key, raw = templated["team"], templated["key"], templated["raw"]
    if budget == "tokens":
        budget_set(team=team, key=key, tokens_per_month=2000, user=templated["alice"])
    else:
        budget_set(team=team, key=key, money_per_month=Decimal("20.00"), user=templated["alice"])
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        answers = [answer for client in pool.map(lambda first: until_refused(two_gateways, raw, first),
                                                 range(STREAMS)) for answer in client]
    wait_until(lambda: RequestLog.objects.filter(key=key).count() == len(answers), seconds=20,
               message=f"{len(answers)} usage rows from both processes")
    served = RequestLog.objects.filter(key=key, status_code=200)
    assert served.count() == sum(1 for status, _ in answers if status == 200) >= 10
    # The provider billed more than the gateway's estimate of each prompt: the template's tokens
    assert {row.prompt_tokens for row in served} == {35} and input_token_estimate(CHAT) < 35
    spent = served.aggregate(tokens=Sum("prompt_tokens") + Sum("completion_tokens"), money=Sum("cost"))
    if budget == "tokens":
        assert spent["tokens"] <= 2000
    else:
        assert spent["money"] <= Decimal("20.00")
    refusals = [body.decode() for status, body in answers if status == 402]
    assert len(refusals) == STREAMS  # every client ended on one
    assert all("lower max_tokens or raise the budget" in said and "this key's monthly budget of" in said
               for said in refusals)
    # Every hold released at the end, the processes' advances on the key (gateway/advances.py) once idle
    client = redis.Redis.from_url(settings.REDIS_URL)
    wait_until(lambda: [int(value) for value in client.mget(held_keys(month_of(), "key", key.id))] == [0, 0],
               seconds=10, message="every hold and advance given back")
