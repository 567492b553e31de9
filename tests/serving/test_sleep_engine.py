"""Sleep when idle on the real CPU engine: a deployment whose profile sleeps after 6 idle seconds stops its engine
(the process is gone, the channel stays on the route); a request finds it asleep, wakes it and is answered by the
cloud channel meanwhile (the route says fall back); the next one, with the route set to wait, waits for the
engine and is answered by it; the nap is recorded and its hours are not GPU hours."""
import os
import time

import openai
from django.utils import timezone

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route, RouteChannel
from panel.dashboards.cost import deployment_asleep_hours, deployment_up_hours
from panel.jobs.models import JobEvent
from panel.serving.models import Deployment, DeploymentState, Nap
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream, content_text
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_idle_engine_sleeps_and_a_request_wakes_it(launch_tiny, team_setup):
    from django.db import connection

    team = team_setup["team_a"]
    deployment = launch_tiny(team, sleep_after_minutes=0.1)
    engine_pid = deployment.pid
    assert engine_pid and alive(engine_pid)
    local = Channel.objects.get(deployment=deployment)
    route = Route.objects.get(team=team, model_name="tiny-chat")
    Route.objects.filter(pk=route.pk).update(deadline_seconds=180, while_waking="fallback")
    with FakeUpstream(models=("cloud-model",), chunks=4) as cloud_fake:
        cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url=cloud_fake.base_url,
                                       model_id="cloud-model", credential_kind="none")
        RouteChannel.objects.create(route=route, channel=cloud, position=10)

        # Idle for 6 s (the supervisor looks every 5 s), a drain of 2 s: asleep, and the engine's process gone.
        wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == DeploymentState.ASLEEP, seconds=60,
                   interval=0.5, message="the deployment to fall asleep")
        wait_until(lambda: not alive(engine_pid), seconds=60, interval=0.5, message="the engine to stop")
        local.refresh_from_db()
        assert local.enabled  # still on the route: a request wakes it

        _, raw = key_issue(team=team, user=None, name="app")
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw, max_retries=0, timeout=240)
            first = client.chat.completions.create(model="tiny-chat", max_tokens=4,
                                                   messages=[{"role": "user", "content": "Hello"}])
            assert first.choices[0].message.content == content_text(4)  # the cloud answered meanwhile
            assert Deployment.objects.get(pk=deployment.pk).state in (DeploymentState.WAKING,
                                                                     DeploymentState.STARTING)

            Route.objects.filter(pk=route.pk).update(while_waking="wait")
            asked = time.monotonic()
            stream = client.chat.completions.create(model="tiny-chat", max_tokens=4, stream=True,
                                                    messages=[{"role": "user", "content": "Hello again"}])
            chunks = list(stream)
            waited = time.monotonic() - asked
            assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
            print(f"\nthe waiting request's answer came {waited:.1f} s after it was sent (the engine's start)")
            wait_until(lambda: RequestLog.objects.count() == 2, seconds=60, message="usage records")
        finally:
            gateway.stop()

    woke_by_cloud, waited_for_engine = RequestLog.objects.order_by("created_at")
    assert [(s["channel"], s["outcome"]) for s in woke_by_cloud.attempt_trail] == [(local.name, "waking"),
                                                                                    ("cloud", "ok")]
    assert woke_by_cloud.fell_back and woke_by_cloud.channel_id == cloud.pk
    assert [(s["channel"], s["outcome"]) for s in waited_for_engine.attempt_trail] == [(local.name, "woke"),
                                                                                        (local.name, "ok")]
    assert waited_for_engine.channel_id == local.pk and waited_for_engine.completion_tokens > 0

    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY and deployment.pid != engine_pid and alive(deployment.pid)
    moves = list(JobEvent.objects.filter(job_id=deployment.pk, job_type=deployment.job_type())
                 .order_by("at", "pk").values_list("to_state", flat=True))
    assert moves[-5:] == ["ready", "asleep", "waking", "starting", "ready"], moves
    [nap] = Nap.objects.filter(deployment=deployment)
    assert nap.woken_by == "a request for tiny-chat" and nap.ended_at > nap.began_at

    # GPU hours: from the first ready until now, less the nap.
    since, now = deployment.ready_at.timestamp(), timezone.now().timestamp()
    asleep = deployment_asleep_hours(deployment, since=since, until=now) * 3600
    assert abs(asleep - (nap.ended_at - nap.began_at).total_seconds()) < 0.01
    assert abs(deployment_up_hours(deployment, since=since, until=now) * 3600 - (now - since - asleep)) < 0.01
