"""Two replicas of the tiny demo model on the real CPU engine, on two GPU workers with different host names standing
in for two hosts: each replica on its host, both on one prefix-aware route, each tenant's requests on one replica,
one replica SIGKILLed mid-traffic (every request still answered, by the other replica; the killed one restarted and
back on the route), and Stop ending both with no engine process left behind."""
import os
import signal
from types import SimpleNamespace

import httpx
import pytest

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route
from panel.gateway.balancing import prefix_digest, prefix_text, rendezvous
from panel.hosts.models import WorkerHost
from panel.registry.demo_model import build_demo_model
from panel.registry.services import model_register
from panel.serving.models import Deployment, DeploymentState, ServingProfile
from panel.serving.services import deployment_launch, deployment_stop
from panel.usage.models import RequestLog
from tests.support.engine_processes import engine_processes
from tests.support.gateway import gateway  # noqa: F401 (fixture)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine  # the demo model and two real engines on gpu workers
S = DeploymentState
START_SECONDS = 300


def body(system, user):
    return {"model": "tiny-chat", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def ask(gateway, raw, system, user):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body(system, user), timeout=120,
                      headers={"Authorization": f"Bearer {raw}"})


def replica_states(head):
    return [replica.state for replica in head.replicas()]


def test_two_replicas_on_two_hosts_balance_by_prefix_survive_a_kill_and_stop_clean(start_worker, team_setup, tmp_path,
                                                                                   gateway):  # noqa: F811
    team = team_setup["team_a"]
    path = tmp_path / "tiny"
    build_demo_model(path)
    model = model_register(team=team, user=None, source=str(path), name="tiny")
    profile = ServingProfile.objects.create(team=team, model=model, name="tiny-cpu", served_model_name="tiny-chat",
                                            max_model_len=2048, block_size=32, max_num_seqs=8,
                                            max_num_batched_tokens=2048, enable_prefix_caching=True,
                                            extra_args="--enforce-eager")
    start_worker("gpu", TOKENWISE_HOST_NAME="host-a")
    start_worker("gpu", TOKENWISE_HOST_NAME="host-b")
    wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).count() == 2,
               message="both GPU workers")

    head = deployment_launch(team=team, user=None, profile=profile, replicas=2)
    assert sorted(replica.host.host for replica in head.replicas()) == ["host-a", "host-b"]
    wait_until(lambda: set(replica_states(head)) <= {S.READY, S.FAILED} and S.PENDING not in replica_states(head)
               and S.STARTING not in replica_states(head), seconds=START_SECONDS, interval=1, message="both replicas")
    first, second = head.replicas()
    assert (first.state, second.state) == (S.READY, S.READY), (first.failure_reason, second.failure_reason)

    route = Route.objects.get(team=team, model_name="tiny-chat")
    channels = {channel.deployment_id: channel for channel in Channel.objects.filter(deployment__in=[first, second])}
    assert route.balance == "prefix_aware" and route.routechannel_set.count() == 2
    _, raw = key_issue(team=team, user=team_setup["alice"], name="app")

    # Two tenants whose system prompts hash to different replicas (as the gateway orders the route's channels).
    pool = [SimpleNamespace(id=link.channel_id) for link in route.routechannel_set.order_by("position")]
    tenants = {}
    for number in range(50):
        system = f"You are the assistant of tenant {number}. " * 30
        home = pool[rendezvous(prefix_digest(prefix_text(body(system, ""))), pool)[0]].id
        tenants.setdefault(home, system)
        if len(tenants) == 2:
            break
    for user in range(3):
        for system in tenants.values():
            assert ask(gateway, raw, system, f"question {user}").status_code == 200
    wait_until(lambda: RequestLog.objects.count() >= 6, seconds=10, message="six usage rows")
    homes = list(tenants)  # the requests alternated between the two tenants
    served = list(RequestLog.objects.order_by("created_at").values_list("channel_id", flat=True))
    assert served == [homes[index % 2] for index in range(6)]  # each tenant on its replica, both replicas used
    assert not RequestLog.objects.filter(fell_back=True).exists()

    # SIGKILL the second replica's engine; its tenant is answered by the first meanwhile.
    killed_pid = second.pid
    os.killpg(killed_pid, signal.SIGKILL)
    answered = [ask(gateway, raw, tenants[channels[second.pk].pk], f"after the kill {n}").status_code
                for n in range(4)]
    assert answered == [200] * 4
    wait_until(lambda: Deployment.objects.get(pk=second.pk).restarts == 1, seconds=30, message="a restart")
    wait_until(lambda: Deployment.objects.get(pk=second.pk).state == S.READY, seconds=START_SECONDS, interval=1,
               message="the killed replica back")
    second.refresh_from_db()
    assert second.pid != killed_pid and Channel.objects.get(pk=channels[second.pk].pk).enabled
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [row.outcome for row in rows] == ["ok"] * 10
    assert {row.channel_id for row in rows[6:]} == {channels[first.pk].pk}  # the killed replica's share moved

    assert deployment_stop(deployment=head) is True
    wait_until(lambda: set(replica_states(head)) == {S.STOPPED}, seconds=60, message="both stopped")
    wait_until(lambda: engine_processes(path) == [], seconds=30, message="no engine left")
    assert not Channel.objects.filter(deployment__in=[first, second], enabled=True).exists()
