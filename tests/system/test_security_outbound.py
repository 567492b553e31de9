"""Attack tests for the outbound URL policy (panel/core/outbound.py): a channel, a webhook or a benchmark target may
not reach the cloud metadata address, private ranges the operator did not allow, another team's engine on this
machine, or the panel itself; addresses are checked at request time too, and the hop header stops any loop."""
import asyncio
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.core.exceptions import ValidationError

from panel.accounts.keys import key_issue
from panel.channels.models import (
    Channel,
    ChannelKind,
    CredentialKind,
    Route,
    RouteChannel,
)
from panel.channels.services import channel_create, channel_test
from panel.channels.settings_json import settings_import
from panel.core import outbound
from panel.notifications.services import url_errors
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until


@pytest.fixture
def strict(settings):
    """The defaults of an installation: no range allowed, the panel on port 8000."""
    settings.OUTBOUND_ALLOW_CIDRS = []
    settings.PANEL_PORT = 8000
    return settings


def remote(team, base_url, **changes):
    fields = dict(name="probe", kind=ChannelKind.REMOTE, base_url=base_url, model_id="m",
                  credential_kind=CredentialKind.STORED)
    fields.update(changes)
    return channel_create(team=team, api_key="sk-team-a-key-123456", **fields)


@pytest.mark.parametrize("base_url, words", [
    ("http://169.254.169.254/latest/v1", "link-local"),
    ("http://[fe80::1]/v1", "link-local"),
    ("http://10.0.0.7:8001/v1", "private or reserved"),
    ("http://192.168.1.20/v1", "private or reserved"),
    ("http://[::ffff:10.0.0.7]/v1", "private or reserved"),
    ("http://127.0.0.1:8123/v1", "this machine (loopback)"),  # another team's engine port
    ("http://localhost:8123/v1", "this machine (loopback)"),
    ("http://0.0.0.0:8123/v1", "this machine (loopback)"),
    ("http://127.0.0.1:8000/v1", "this panel itself"),
    ("http://localhost:8000/v1", "this panel itself"),
])
def test_a_channel_to_a_refused_address_is_not_saved(team_setup, strict, base_url, words):
    with pytest.raises(ValidationError) as caught:
        remote(team_setup["team_a"], base_url)
    assert words in caught.value.message_dict["base_url"][0]
    assert not Channel.objects.exists()


def test_the_panels_public_url_is_refused(team_setup, strict):
    strict.PUBLIC_URL = "https://tokenwise.example.com"
    with pytest.raises(ValidationError) as caught:
        remote(team_setup["team_a"], "https://tokenwise.example.com/v1")
    assert "this panel itself" in caught.value.message_dict["base_url"][0]


def test_a_range_the_operator_allows_is_accepted(team_setup, strict):
    strict.OUTBOUND_ALLOW_CIDRS = ["10.0.0.0/8"]
    assert remote(team_setup["team_a"], "http://10.0.0.7:8001/v1").base_url == "http://10.0.0.7:8001/v1"
    with pytest.raises(ValidationError):
        remote(team_setup["team_a"], "http://169.254.169.254/v1", name="meta")


def test_settings_json_cannot_point_at_the_metadata_address(team_setup, strict):
    document = {"channels": {"meta": {"base_url": "http://169.254.169.254/v1", "api_key": "EMPTY",
                                      "model_id": "m"}}, "default_channel": "meta"}
    with pytest.raises(ValidationError) as caught:
        settings_import(team=team_setup["team_a"], text=json.dumps(document))
    assert any("link-local" in message for message in caught.value.messages)
    assert not Channel.objects.exists()


def test_a_webhook_to_the_metadata_address_is_refused(strict):
    assert "link-local" in url_errors("http://169.254.169.254/latest/meta-data/")[0]
    assert "panel itself" in url_errors("http://127.0.0.1:8000/api/v1/channels")[0]
    assert url_errors("https://hooks.example.com/x") == []


def test_the_test_button_sends_nothing_to_an_old_channel_on_another_teams_engine(team_setup, strict):
    with FakeUpstream(models=("m",)) as engine:  # team B's engine, without a key
        channel = Channel.objects.create(team=team_setup["team_a"], name="old", kind=ChannelKind.LOCAL,
                                         base_url=engine.base_url, model_id="m",
                                         credential_kind=CredentialKind.NONE)
        result = channel_test(channel)
        assert not result["ok"] and "this machine (loopback)" in result["diagnosis"]
        assert engine.requests == []
        assert "does not call its base URL" in Channel.objects.get(pk=channel.pk).misconfigured


def test_a_name_is_checked_when_the_connection_is_made(strict):
    async def resolve(name):
        return await outbound.PolicyResolver().resolve(name, 80)

    with pytest.raises(outbound.OutboundRefused, match="loopback"), ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, resolve("localhost")).result(timeout=30)  # its own loop, whatever this thread runs
    with pytest.raises(outbound.OutboundRefused, match="loopback"):
        outbound.pinned(f"http://{socket.gethostname()}:9/v1")  # a name no list holds: refused by where it resolves
    url, headers, extensions = outbound.pinned("http://93.184.215.14/v1")
    assert url == "http://93.184.215.14/v1" and headers[outbound.HOP_HEADER] == "1"


# ------------------------------------------------------------------------------------------------ the gateway

def gateway_route(team, base_url, name="loop"):
    channel = Channel.objects.create(team=team, name=name, kind=ChannelKind.REMOTE, base_url=base_url,
                                     model_id="m", credential_kind=CredentialKind.NONE, max_retries=0,
                                     timeout_seconds=5)
    route = Route.objects.create(team=team, model_name="m", strategy="priority")
    RouteChannel.objects.create(route=route, channel=channel, position=0)
    return channel


def ask(gateway, raw, **headers):
    return httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                      headers={"Authorization": f"Bearer {raw}", **headers})


def test_the_gateway_does_not_call_another_teams_engine_port(transactional_db, team_setup):
    from django.db import connection

    with FakeUpstream(models=("m",)) as engine:
        for name, url in (("by-address", engine.base_url),
                          ("by-name", engine.base_url.replace("127.0.0.1", socket.gethostname()))):
            Channel.objects.all().delete()
            Route.objects.all().delete()
            gateway_route(team_setup["team_a"], url, name=name)
            server = GatewayServer(connection.settings_dict["NAME"], TOKENWISE_OUTBOUND_ALLOW="")
            try:
                _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name=f"k-{name}")
                answer = ask(server, raw)
                assert answer.status_code >= 500, answer.text
            finally:
                server.stop()
        assert engine.requests == []


def test_a_channel_pointed_at_the_gateway_itself_stops_after_one_hop(transactional_db, team_setup):
    from django.db import connection

    server = GatewayServer(connection.settings_dict["NAME"])
    try:
        gateway_route(team_setup["team_a"], server.url + "/v1")  # the own-origin check missed it: another port
        _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="app")
        hop = ask(server, raw, **{outbound.HOP_HEADER: "1"})
        assert hop.status_code == 508 and hop.json()["error"]["code"] == "loop_detected"
        answer = ask(server, raw)
        assert answer.status_code >= 400
        wait_until(lambda: RequestLog.objects.count() >= 3, seconds=10, message="usage records")
        assert RequestLog.objects.count() == 3  # the hop request, then one outer and one refused inner request
    finally:
        server.stop()
