"""Attack tests: an upstream's redirect must not carry a request (its body and its key) past the outbound policy.

The attacker owns a channel's upstream (127.0.0.2 stands in for a public address the operator allows) and answers
`307 Location: http://127.0.0.1:<another team's engine port>/invocations`; a 307 keeps the method, the body and the
credential header, and an address written in a URL is connected to without asking any resolver. The victim (a fake
engine on 127.0.0.1, a range nobody allowed) must receive nothing, from the gateway, the benchmark runner or the
channel's Test button."""
import asyncio

import aiohttp
import httpx
import pytest

from panel.accounts.keys import key_issue
from panel.benchmarks import runner
from panel.channels.models import Channel, ChannelKind, CredentialKind, Route, RouteChannel
from panel.channels.services import channel_test
from panel.core import crypto, outbound
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import run_coroutine, wait_until

ATTACKER_RANGE = "127.0.0.2/32"


@pytest.fixture
def victim():
    with FakeUpstream(models=("m",)) as engine:  # another team's engine on this machine, reached by address
        yield engine


@pytest.fixture
def attacker(victim):
    with FakeUpstream(models=("m",), host="127.0.0.2") as upstream:
        upstream.behave("redirect", location=f"http://127.0.0.1:{victim.port}/invocations")
        yield upstream


def attacker_channel(team, attacker):
    channel = Channel.objects.create(team=team, name="attacker", kind=ChannelKind.REMOTE, base_url=attacker.base_url,
                                     model_id="m", credential_kind=CredentialKind.STORED, max_retries=2,
                                     timeout_seconds=5, credential_ciphertext=crypto.encrypt("sk-team-a-key-1234"))
    route = Route.objects.create(team=team, model_name="m", strategy="priority")
    RouteChannel.objects.create(route=route, channel=channel, position=0)
    return channel


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_does_not_follow_a_redirect_to_another_teams_engine(transactional_db, team_setup, victim,
                                                                         attacker, stream):
    from django.db import connection

    attacker_channel(team_setup["team_a"], attacker)
    _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="app")
    server = GatewayServer(connection.settings_dict["NAME"], TOKENWISE_OUTBOUND_ALLOW=ATTACKER_RANGE)
    try:
        answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, headers={"Authorization": f"Bearer {raw}"},
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "upstream_redirect"
        assert "never followed" in answer.json()["error"]["message"]
        assert victim.requests == []
        assert len(attacker.requests) == 1  # a redirect is not retried either
        wait_until(lambda: RequestLog.objects.count() == 1, seconds=30, message="the usage record")
        assert RequestLog.objects.get().error_kind == "upstream_redirect"
    finally:
        server.stop()


def test_an_address_in_the_url_is_checked_when_the_connection_is_made(settings, victim):
    """aiohttp connects to an address written in the URL without asking the resolver: the connector checks it."""
    settings.OUTBOUND_ALLOW_CIDRS = [ATTACKER_RANGE]

    async def post(**policy):
        async with aiohttp.ClientSession(connector=outbound.PolicyConnector(**policy)) as session:
            async with session.post(f"http://127.0.0.1:{victim.port}/invocations", json={"prompt": "x"},
                                    allow_redirects=False) as response:
                return response.status

    with pytest.raises(aiohttp.ClientConnectorError) as caught:
        run_coroutine(post())
    refusal = caught.value.os_error
    assert isinstance(refusal, outbound.OutboundRefused) and "loopback" in str(refusal)
    assert victim.requests == []
    assert run_coroutine(post(loopback_ok=True)) == 404  # the panel's own engines may be reached
    assert run_coroutine(post(engine_hosts={"127.0.0.1"})) == 404  # the engines' advertised address
    assert len(victim.requests) == 2


def test_a_benchmark_does_not_follow_a_redirect(settings, victim, attacker):
    settings.OUTBOUND_ALLOW_CIDRS = [ATTACKER_RANGE]
    endpoint = runner.Endpoint(base_url=attacker.base_url, api_key="sk-team-a-key-1234", model="m")
    samples, _ = run_coroutine(runner.run_load(pick=lambda: endpoint, prompts=[[{"role": "user", "content": "hi"}]],
                                               max_tokens=4, requests=2, timeout=10))
    assert [sample.ok for sample in samples] == [False, False]
    assert all("redirect" in sample.error for sample in samples)
    assert victim.requests == []


def test_the_test_button_says_the_channel_redirects(team_setup, settings, victim, attacker):
    settings.OUTBOUND_ALLOW_CIDRS = [ATTACKER_RANGE]
    channel = attacker_channel(team_setup["team_a"], attacker)
    attacker.behave("redirect", location=f"http://127.0.0.1:{victim.port}/v1/models")  # the models step too
    result = channel_test(channel)
    assert not result["ok"]
    assert "never follows a redirect" in result["diagnosis"]
    assert victim.requests == []


def test_a_redirect_is_an_upstream_error_that_is_not_retried():
    from panel.gateway.upstream import error_from_response

    error = error_from_response(307, b"", {"location": "http://127.0.0.1:9/invocations"})
    assert error.kind == "upstream_redirect" and not error.retryable and error.status == 307
    assert asyncio.iscoroutinefunction(outbound.PolicyConnector._resolve_host)
