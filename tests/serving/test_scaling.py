"""Scale on queue without an engine: the scaler's decision over the scraped engine samples (sustained waiting or a
full KV cache adds one, a quiet stretch removes one, never past the minimum or maximum, never mid-change), a replica
added where there is room (nothing written when there is none), a replica removed by draining (off the route in the
same transaction, its supervisor stopping it only once it runs nothing), and the launch form, the deployment page
and the API that set the policy. The real engines scale in tests/system/test_replicas_engine.py."""
from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Channel
from panel.channels.routing import routing_version
from panel.dashboards.models import EngineSample
from panel.dashboards.scraper import engine_readings
from panel.jobs.models import JobEvent, JobState
from panel.serving import drain
from panel.serving.models import Deployment, ScalePolicy
from panel.serving.scaling import deployments_scale, policy_save, scale_decision
from panel.serving.services import DeploymentHooks, deployment_launch
from tests.support.api_helpers import call, token_for
from tests.support.channels import set_state
from tests.support.replicas import host, profile  # noqa: F401 (profile: a fixture)

S = JobState
NOW = timezone.now()
EVERY = 10


def replica(number, state=S.READY):
    return SimpleNamespace(pk=number, replica_index=number - 1, replica_number=number, state=state,
                           get_state_display=lambda: state.label)


def readings(seconds, *, waiting=0, running=0, kv=0.0, every=EVERY):
    """One replica's samples over the last `seconds`, one per scrape, oldest first."""
    return [SimpleNamespace(at=NOW - timedelta(seconds=ago), waiting=waiting, running=running, kv_cache_usage=kv)
            for ago in range(seconds, -1, -every)]


def policy(**values):
    defaults = dict(min_replicas=1, max_replicas=3, up_waiting=1.0, up_kv_cache=0.8, up_after_seconds=60,
                    down_after_seconds=300, changed_at=None)
    return SimpleNamespace(**(defaults | values))


def decide(rule, replicas, samples):
    return scale_decision(rule, replicas, samples, now=NOW, every=EVERY, max_num_seqs=8)


def test_requests_that_keep_waiting_add_a_replica_and_a_short_wait_does_not():
    one = [replica(1)]
    decision = decide(policy(), one, {1: readings(70, waiting=2, running=8)})
    assert decision.action == "up" and "2 requests waited per replica on average for 60 s" in decision.reason
    dipped = readings(70, waiting=2)
    dipped[3].waiting = 0  # a dip as answers end: the window's mean still holds
    assert decide(policy(), one, {1: dipped}).action == "up"
    short = readings(70)
    for sample in short[-1:]:
        sample.waiting = 5  # a short burst at the end: mean under the threshold
    assert decide(policy(), one, {1: short}).action == ""
    over = readings(70, waiting=3)
    over[-1].waiting = 0  # the queue is gone now: a burst that is over adds nothing
    assert decide(policy(), one, {1: over}).action == ""
    full = decide(policy(), one, {1: readings(70, kv=0.9)})
    assert full.action == "up" and "the KV cache was 90% full on average" in full.reason
    # Two replicas: the average of both.
    two = [replica(1), replica(2)]
    assert decide(policy(), two, {1: readings(70, waiting=2), 2: readings(70, waiting=0)}).action == "up"
    assert decide(policy(), two, {1: readings(70, waiting=1), 2: readings(70, waiting=0)}).action == ""


def test_the_scaler_decides_only_on_a_whole_window_since_the_last_change():
    one = [replica(1)]
    assert decide(policy(), one, {1: readings(30, waiting=5)}).action == ""  # watched for 30 s of 60
    late = readings(70, waiting=5)[:-3]  # the last scrape 30 s old: the scraper stopped looking
    assert decide(policy(), one, {1: late}).action == ""
    changed = policy(changed_at=NOW - timedelta(seconds=20))
    assert decide(changed, one, {1: readings(70, waiting=5)}).action == ""
    assert decide(policy(changed_at=NOW - timedelta(seconds=61)), one, {1: readings(70, waiting=5)}).action == "up"


def test_no_change_while_a_replica_starts_or_drains_and_none_past_the_maximum():
    for state in (S.PENDING, S.STARTING, S.DRAINING):
        decision = decide(policy(), [replica(1), replica(2, state)], {1: readings(70, waiting=5)})
        assert decision.action == "" and f"replica 2 is {state.label.lower()}" in decision.reason
    full = decide(policy(max_replicas=2), [replica(1), replica(2)],
                  {1: readings(70, waiting=5), 2: readings(70, waiting=5)})
    assert full.action == "" and full.noted and "at its maximum of 2 replicas" in full.reason


def test_under_the_minimum_a_replica_is_added_at_once():
    decision = decide(policy(min_replicas=2), [replica(1), replica(2, S.FAILED)], {})
    assert decision.action == "up" and "1 replica running, under the minimum of 2" in decision.reason
    # One added less than a window ago failed at its start: not again at every pass.
    again = decide(policy(min_replicas=2, changed_at=NOW - timedelta(seconds=20)), [replica(1), replica(2, S.FAILED)],
                   {})
    assert again.action == ""


def test_a_quiet_stretch_drains_the_newest_replica_never_the_first_nor_below_the_minimum():
    three = [replica(1), replica(2), replica(3)]
    quiet = {number: readings(310, running=1, kv=0.1) for number in (1, 2, 3)}
    decision = decide(policy(), three, quiet)
    assert decision.action == "down" and decision.replica.replica_number == 3
    assert "no request waited, the KV cache stayed under 40%" in decision.reason
    assert decide(policy(min_replicas=3), three, quiet).action == ""
    assert decide(policy(), three, quiet | {2: readings(310, waiting=1)}).action == ""  # one request waited
    assert decide(policy(), three, quiet | {2: readings(310, kv=0.5)}).action == ""  # the cache not low
    busy = {number: readings(310, running=5) for number in (1, 2, 3)}  # 15 running; two replicas take 8 at half
    assert decide(policy(), three, busy).action == ""
    assert decide(policy(), three, {1: readings(200), 2: readings(200), 3: readings(200)}).action == ""  # too soon


def running_replicas(team_setup, profile, count, **launch):  # noqa: F811
    """A deployment of `count` ready replicas, each with its local channel, and its scale policy."""
    head = deployment_launch(team=team_setup["team_a"], user=None, profile=profile, replicas=count, enqueue=False,
                             **launch)
    for index, row in enumerate(head.replicas()):
        set_state(row, S.READY, port=8700 + index, base_url=f"http://127.0.0.1:{8700 + index}/v1",
                  ready_at=timezone.now())
        local_channel_sync(row)
    return head


def scrape(deployment, seconds, **figures):
    """EngineSample rows for `seconds` up to now, one per scrape, as the scraper writes them."""
    now = timezone.now()
    EngineSample.objects.bulk_create([
        EngineSample(deployment=deployment, team=deployment.team, at=now - timedelta(seconds=ago),
                     waiting=figures.get("waiting", 0), running=figures.get("running", 0),
                     kv_cache_usage=figures.get("kv", 0.0))
        for ago in range(seconds, -1, -settings.DASHBOARDS_SCRAPE_EVERY_SECONDS)])


def test_a_replica_is_added_on_the_host_with_fewest_and_queued_with_the_change(team_setup, profile,  # noqa: F811
                                                                              django_capture_on_commit_callbacks):
    host("host-a"), host("host-b")
    head = running_replicas(team_setup, profile, 1, max_replicas=3)
    assert head.host.host == "host-a"
    scrape(head, 70, waiting=3, running=8)
    with django_capture_on_commit_callbacks() as queued:
        assert deployments_scale(readings=engine_readings) == {head.pk: "up"}
    added = Deployment.objects.get(replica_of=head)
    assert (added.state, added.replica_index, added.host.host, added.queue) == (S.PENDING, 1, "host-b", "gpu.host-b")
    assert added.restart_on_crash and len(queued) == 1  # its task is sent once the row is committed
    event = JobEvent.objects.filter(job_type=Deployment.job_type(), job_id=added.pk).get()
    assert event.reason.startswith("the scaler: replica 2 added on host-b: 3 requests waited per replica on average")
    policy = ScalePolicy.objects.get(deployment=head)
    assert policy.changed_at is not None and policy.last_decision.startswith("replica 2 added on host-b")
    assert deployments_scale(readings=engine_readings) == {}  # replica 2 is starting: the scaler waits for it


def test_no_room_writes_nothing_and_says_why(team_setup, profile):  # noqa: F811
    host("one-gpu", gpus=1)  # its one GPU held by the running replica
    head = running_replicas(team_setup, profile, 1, max_replicas=2)
    scrape(head, 70, waiting=3)
    assert deployments_scale(readings=engine_readings) == {head.pk: ""}
    assert not Deployment.objects.filter(replica_of=head).exists()
    policy = ScalePolicy.objects.get(deployment=head)
    assert "no worker could take one more replica: 1 replica asked for, but the workers have room for 0" in \
        policy.last_decision, policy.last_decision
    assert policy.changed_at is None


def test_the_scaler_adds_no_replica_past_the_teams_gpu_quota(team_setup, profile):  # noqa: F811
    host("host-a", gpus=1), host("host-b", gpus=1)
    head = running_replicas(team_setup, profile, 1, max_replicas=3)
    team = team_setup["team_a"]
    team.gpu_quota = 1  # the running replica holds it
    team.save()
    scrape(head, 70, waiting=3, running=8)
    assert deployments_scale(readings=engine_readings) == {head.pk: ""}
    assert not Deployment.objects.filter(replica_of=head).exists()
    policy = ScalePolicy.objects.get(deployment=head)
    assert "one more replica would pass the team's GPU quota" in policy.last_decision, policy.last_decision
    assert "already hold 1 of its quota of 1" in policy.last_decision
    team.gpu_quota = 2
    team.save()
    assert deployments_scale(readings=engine_readings) == {head.pk: "up"}


def test_a_quiet_deployment_drains_its_newest_replica_off_the_route_in_one_step(team_setup, profile,  # noqa: F811
                                                                                django_capture_on_commit_callbacks):
    host("host-a"), host("host-b")
    head = running_replicas(team_setup, profile, 2)
    policy_save(deployment=head, min_replicas=1, max_replicas=2, up_waiting=1, up_kv_cache=0.8, up_after_seconds=60,
                down_after_seconds=300)
    first, second = head.replicas()
    for row in (first, second):
        scrape(row, 310, running=1, kv=0.05)
    before = routing_version(head.team_id)
    with django_capture_on_commit_callbacks(execute=True):
        assert deployments_scale(readings=engine_readings) == {head.pk: "down"}
    first.refresh_from_db(), second.refresh_from_db()
    assert (first.state, second.state) == (S.READY, S.DRAINING)
    channels = {channel.deployment_id: channel.enabled for channel in Channel.objects.filter(deployment__in=[first,
                                                                                                       second])}
    assert channels == {first.pk: True, second.pk: False} and routing_version(head.team_id) != before
    assert deployments_scale(readings=engine_readings) == {}  # draining: no second change


def test_a_draining_replica_stops_its_engine_only_once_it_runs_nothing(team_setup, profile, monkeypatch):  # noqa: F811
    host("host-a"), host("host-b")
    head = running_replicas(team_setup, profile, 2)
    second = head.replicas()[1]
    hooks = DeploymentHooks(second)
    clock = {"now": 500.0}
    monkeypatch.setattr(drain.time, "monotonic", lambda: clock["now"])
    busy = {"value": 2}
    monkeypatch.setattr(drain, "engine_activity", lambda port, key: (10.0, busy["value"]))
    assert hooks.stop_requested() is False  # ready: it serves
    set_state(second, S.DRAINING)
    assert hooks.stop_requested() is False  # the gateways still learn that it left the route
    clock["now"] += drain.drain_seconds() + 0.1
    assert hooks.stop_requested() is False  # two requests still running
    busy["value"] = 0
    assert hooks.stop_requested() is True
    busy["value"] = 1
    clock["now"] = 500.0 + drain.DRAIN_DEADLINE_SECONDS
    assert hooks.stop_requested() is True  # the drain's deadline


def test_a_freed_slot_is_taken_again_with_its_channel(team_setup, profile):  # noqa: F811
    host("host-a"), host("host-b")
    head = running_replicas(team_setup, profile, 2, max_replicas=3)
    second = head.replicas()[1]
    old_channel = Channel.objects.get(deployment=second)
    set_state(second, S.STOPPED)  # drained and stopped earlier
    local_channel_sync(second)
    ScalePolicy.objects.filter(deployment=head).update(min_replicas=2)
    assert deployments_scale(readings=engine_readings) == {head.pk: "up"}  # under its minimum
    added = Deployment.objects.filter(replica_of=head, state=S.PENDING).get()
    assert added.replica_index == 1  # slot 2 again, not a third
    set_state(added, S.READY, port=8799, base_url="http://127.0.0.1:8799/v1")
    assert local_channel_sync(added).pk == old_channel.pk  # the route keeps one channel per slot


def test_the_launch_form_sets_a_range_and_refuses_a_top_under_the_count(client, team_setup, profile):  # noqa: F811
    host("host-a")
    client.force_login(team_setup["alice"])
    url = reverse("deployment_create", args=[profile.pk])
    response = client.post(url, {"replicas": 2, "max_replicas": 1}, follow=True)
    assert "Scale up to 1 is fewer than the 2 replicas asked for" in response.content.decode()
    assert not Deployment.objects.exists() and not ScalePolicy.objects.exists()
    response = client.post(url, {"replicas": 1, "max_replicas": 3}, follow=True)
    head = Deployment.objects.get()
    policy = ScalePolicy.objects.get(deployment=head)
    assert (policy.min_replicas, policy.max_replicas, policy.up_after_seconds) == (1, 3, 60)
    assert "Scales on queue</strong> between 1 and 3 replicas" in response.content.decode()


def test_the_page_and_the_api_change_the_policy_and_refuse_bad_values(client, team_setup, profile):  # noqa: F811
    host("host-a")
    head = running_replicas(team_setup, profile, 1)
    client.force_login(team_setup["alice"])
    page = client.get(reverse("deployment_detail", args=[head.pk])).content.decode()
    assert "Scale on queue" in page and "Turn scaling on" in page
    url = reverse("deployment_scale", args=[head.pk])
    values = {"min_replicas": 1, "max_replicas": 4, "up_waiting": 2, "up_kv_percent": 90, "up_after_seconds": 30,
              "down_after_seconds": 600}
    bad = client.post(url, values | {"max_replicas": 0}, follow=True).content.decode()
    assert "Ensure this value is greater than or equal to 1" in bad and not ScalePolicy.objects.exists()
    bad = client.post(url, values | {"min_replicas": 3, "max_replicas": 2}, follow=True).content.decode()
    assert "The most replicas (2) must be at least the fewest (3)" in bad and not ScalePolicy.objects.exists()
    client.post(url, values)
    policy = ScalePolicy.objects.get(deployment=head)
    assert (policy.max_replicas, policy.up_waiting, policy.up_kv_cache, policy.down_after_seconds) == (4, 2, 0.9, 600)

    token = token_for(team_setup["alice"], head.team)
    path = f"/deployments/{head.pk}/scaling"
    refused = call(client, "put", path, token, {**values, "up_kv_percent": 101})
    assert refused.status_code == 400 and "up_kv_percent" in refused.json()["errors"]
    assert ScalePolicy.objects.get().up_kv_cache == 0.9
    viewer = call(client, "put", path, token_for(team_setup["vera"], head.team), values)
    assert viewer.status_code == 403 and ScalePolicy.objects.get().max_replicas == 4
    changed = call(client, "put", path, token, {**values, "max_replicas": 2})
    assert changed.status_code == 200 and changed.json()["scaling"]["max_replicas"] == 2
    assert call(client, "delete", path, token).json()["scaling"] is None and not ScalePolicy.objects.exists()
    client.post(url, {"off": "1"})  # already off: nothing to do, no error
    set_state(head, S.STOPPED)
    ended = client.post(url, values, follow=True).content.decode()
    assert "scaling applies to a running deployment" in ended and not ScalePolicy.objects.exists()


def test_the_scraper_task_runs_the_scaler_on_what_it_scraped(team_setup, profile, monkeypatch):  # noqa: F811
    from panel.dashboards import tasks

    host("host-a"), host("host-b")
    head = running_replicas(team_setup, profile, 1, max_replicas=2)
    scrape(head, 70, waiting=3)
    monkeypatch.setattr(tasks, "deployments_scrape", lambda: [])  # no engine here: the samples above stand for it
    tasks.scrape_engines()
    assert Deployment.objects.filter(replica_of=head, state=S.PENDING).exists()
