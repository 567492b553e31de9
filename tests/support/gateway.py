"""The gateway's test bench: a real gateway process (fixture), two fake upstreams behind a route with a fallback
(fixtures), a channel factory, and readers of the usage records and of a stream."""
import json
import time
from decimal import Decimal

import httpx
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route, RouteChannel
from panel.core import crypto
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 20}


@pytest.fixture
def gateway(transactional_db, request):
    yield from gateway_for(request)


def gateway_for(request, **env_changes):
    """A gateway process for one test (a fixture's body): the module's shared one (tests/conftest.py,
    `module_gateways`), its usage records written before the test's data is flushed; or, in a module that sets
    GATEWAY_PER_TEST (its tests leave requests running: stalls, deadlines, shadows, wakes), a process of its own."""
    from django.db import connection

    if getattr(request.module, "GATEWAY_PER_TEST", False):
        server = GatewayServer(connection.settings_dict["NAME"], **env_changes)
        yield server
        server.stop()
        return
    yield request.getfixturevalue("module_gateways").get(**env_changes)
    usage_settled()


def usage_settled(quiet=0.4, seconds=10):
    """Once no usage record has arrived for `quiet` seconds: the gateway's writer adds them every 0.2 s."""
    last, since = RequestLog.objects.count(), time.monotonic()
    deadline = time.monotonic() + seconds
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.1)
        count = RequestLog.objects.count()
        if count != last:
            last, since = count, time.monotonic()


@pytest.fixture
def primary():
    with FakeUpstream(models=("up-model",), api_key="sk-primary-0000") as fake:
        yield fake


@pytest.fixture
def fallback():
    with FakeUpstream(models=("cloud-model",), api_key="sk-cloud-1111") as fake:
        yield fake


def channel(team, name, fake_or_url, model_id, *, key=None, kind="remote", timeout=2.0, retries=1, **prices):
    base_url = fake_or_url if isinstance(fake_or_url, str) else fake_or_url.base_url
    fields = {"credential_kind": "none"}
    if key:
        fields = {"credential_kind": "stored", "credential_ciphertext": crypto.encrypt(key),
                  "credential_last4": key[-4:]}
    return Channel.objects.create(team=team, name=name, kind=kind, base_url=base_url, model_id=model_id,
                                  timeout_seconds=timeout, max_retries=retries, retry_backoff=1.0, **fields, **prices)


@pytest.fixture
def setup(team_setup, primary, fallback):
    team = team_setup["team_a"]
    local = channel(team, "local", primary, "up-model", key="sk-primary-0000", kind="local",
                    price_input_per_million=Decimal("0.10"), price_output_per_million=Decimal("0.20"))
    cloud = channel(team, "cloud", fallback, "cloud-model", key="sk-cloud-1111",
                    price_input_per_million=Decimal("1.00"), price_output_per_million=Decimal("2.00"),
                    price_cached_per_million=Decimal("0.50"))
    route = Route.objects.create(team=team, model_name="chat", strategy="local_first", fallback_on_error=True)
    RouteChannel.objects.create(route=route, channel=local, position=1)
    RouteChannel.objects.create(route=route, channel=cloud, position=2)
    key, raw = key_issue(team=team, user=team_setup["alice"], name="app")
    return {"team": team, "local": local, "cloud": cloud, "route": route, "key": key, "raw": raw, **team_setup}


def post(gateway, raw, body, timeout=30, **kwargs):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=timeout,
                      headers={"Authorization": f"Bearer {raw}"}, **kwargs)


def records(count=1):
    """The usage records, once `count` of them are written (the writer batches every 0.2 s)."""
    wait_until(lambda: RequestLog.objects.count() >= count, seconds=10, message=f"{count} usage records")
    time.sleep(0.3)  # and no extra one arrives
    rows = list(RequestLog.objects.order_by("created_at"))
    assert len(rows) == count, [(r.outcome, r.error_kind) for r in rows]
    return rows


def stream_events(response):
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def route_to(team, name, *channels):
    route = Route.objects.create(team=team, model_name=name, strategy="priority", fallback_on_error=True)
    for position, row in enumerate(channels):
        RouteChannel.objects.create(route=route, channel=row, position=position)
    return route
