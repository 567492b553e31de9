"""A deployment of several replicas without an engine: placement over the GPU workers with room (and a clear refusal
when they have none, nothing written), one row, job and local channel per replica, the route made for them balanced
prefix-aware, Stop stopping every replica, and the deployment page showing each replica. The real engines run in
tests/system/test_replicas_engine.py."""
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Channel, Route
from panel.jobs.models import JobState
from panel.serving.models import Deployment
from panel.serving.services import deployment_launch, deployment_stop
from tests.support.channels import make_deployment, set_state
from tests.support.replicas import host, profile  # noqa: F401 (profile: a fixture)


def launch(team_setup, profile, replicas, **options):
    return deployment_launch(team=team_setup["team_a"], user=team_setup["alice"], profile=profile,
                             replicas=replicas, enqueue=False, **options)


def test_replicas_spread_over_the_hosts_with_room(team_setup, profile):
    a, b = host("host-a"), host("host-b")
    head = launch(team_setup, profile, 3)
    replicas = head.replicas()
    assert [r.replica_number for r in replicas] == [1, 2, 3] and replicas[0] == head
    assert sorted(r.host.host for r in replicas).count("host-a") in (1, 2)  # both hosts used
    assert {r.host_id for r in replicas} == {a.pk, b.pk}
    assert all(r.queue == f"gpu.{r.host.host}" and r.restart_on_crash for r in replicas)  # replicas restart
    assert all(r.replica_of_id == head.pk for r in replicas[1:]) and head.replica_of_id is None


def test_replicas_spread_even_when_one_host_has_more_room(team_setup, profile):
    host("roomy", memory_gib=20), host("tight", memory_gib=3)
    head = launch(team_setup, profile, 3)
    assert sorted(r.host.host for r in head.replicas()) == ["roomy", "roomy", "tight"]  # one each, then stack


def test_a_gpu_host_holds_as_many_replicas_as_it_has_free_gpu_groups(team_setup, profile):
    profile.tensor_parallel_size = 2
    profile.model.num_attention_heads, profile.model.num_kv_heads = 4, 2
    profile.model.save()
    profile.save()
    big = host("eight-gpus", gpus=8)
    busy = make_deployment(team_setup["team_a"], team_setup["alice"], "other", state="ready", port=9001)
    Deployment.objects.filter(pk=busy.pk).update(host=big, gpu_indices=[0, 1])
    head = launch(team_setup, profile, 3, host=big)  # 6 free GPUs: three pairs
    assert len(head.replicas()) == 3
    with pytest.raises(ValidationError, match="room for 0"):
        launch(team_setup, profile, 1, host=big)  # the three queued replicas hold the other six


def test_too_many_replicas_are_refused_in_words_and_nothing_is_written(team_setup, profile):
    host("small-a", memory_gib=2), host("small-b", memory_gib=2)  # room for one engine each (weights + 1 GiB)
    before = Deployment.objects.count()
    with pytest.raises(ValidationError) as refused:
        launch(team_setup, profile, 3)
    assert "3 replicas asked for" in str(refused.value) and "room for 2" in str(refused.value)
    assert "small-a: 1" in str(refused.value) and Deployment.objects.count() == before
    with pytest.raises(ValidationError, match="between 1 and 16"):
        launch(team_setup, profile, 17)


def test_each_replica_gets_its_channel_on_one_balanced_route_and_stop_ends_them_all(team_setup, profile):
    host("host-a"), host("host-b")
    head = launch(team_setup, profile, 2)
    first, second = head.replicas()
    for index, replica in enumerate((first, second)):
        set_state(replica, "ready", port=8300 + index, base_url=f"http://127.0.0.1:{8300 + index}/v1")
        local_channel_sync(replica)
    channels = list(Channel.objects.filter(deployment__in=[first, second]).order_by("name"))
    assert [c.name for c in channels] == ["local-tiny-replicas", "local-tiny-replicas-r2"]
    assert all(c.enabled and c.base_url.endswith(f"{8300 + i}/v1") for i, c in enumerate(channels))
    route = Route.objects.get(team=head.team, model_name="tiny-chat")
    assert route.balance == "prefix_aware"  # made for a deployment of replicas
    assert sorted(route.routechannel_set.values_list("channel__name", flat=True)) == [c.name for c in channels]
    # A replica that crashed and waits for its restart is left out; the other serves on.
    set_state(second, JobState.PENDING)
    local_channel_sync(second)
    assert [c.enabled for c in Channel.objects.filter(pk__in=[c.pk for c in channels]).order_by("name")] == [
        True, False]
    assert deployment_stop(deployment=head) is True
    assert {r.state for r in head.replicas()} <= {JobState.STOPPING, JobState.STOPPED}


def test_a_replica_joins_the_route_its_sibling_is_on_even_when_the_route_is_the_teams(team_setup, profile):
    host("host-a"), host("host-b")
    Route.objects.create(team=team_setup["team_a"], model_name="tiny-chat")  # the team's own route
    head = launch(team_setup, profile, 2, attach_to_route=True)
    for index, replica in enumerate(head.replicas()):
        set_state(replica, "ready", port=8400 + index, base_url=f"http://127.0.0.1:{8400 + index}/v1")
        local_channel_sync(replica)
    route = Route.objects.get(team=head.team, model_name="tiny-chat")
    # In order, the first replica would take every request: replicas are balanced prefix-aware.
    assert route.routechannel_set.count() == 2 and route.balance == "prefix_aware"


def test_replicas_join_next_to_their_siblings_ahead_of_the_cloud_fallback_and_a_chosen_balance_stays(team_setup,
                                                                                                      profile):
    from decimal import Decimal

    from panel.channels.models import RouteChannel

    host("host-a"), host("host-b")
    team = team_setup["team_a"]
    # The walk's case: one deployment on its route with a cloud fallback after it, then a second launch of the same
    # profile with two replicas beside it.
    first = launch(team_setup, profile, 1)
    set_state(first, "ready", port=8499, base_url="http://127.0.0.1:8499/v1")
    local_channel_sync(first)
    route = Route.objects.get(team=team, model_name="tiny-chat")
    cloud = Channel.objects.create(team=team, name="taotoken", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("1"))
    RouteChannel.objects.create(route=route, channel=cloud, position=5)
    Route.objects.filter(pk=route.pk).update(balance="round_robin")
    head = launch(team_setup, profile, 2)
    for index, replica in enumerate(head.replicas()):
        set_state(replica, "ready", port=8500 + index, base_url=f"http://127.0.0.1:{8500 + index}/v1")
        local_channel_sync(replica)
    route.refresh_from_db()
    order = list(route.routechannel_set.order_by("position").values_list("channel__deployment", "position"))
    assert order == [(first.pk, 0), *((replica.pk, 1 + index) for index, replica in enumerate(head.replicas())),
                     (None, 3)]  # the cloud fallback stays last
    assert route.balance == "round_robin"  # the team's choice, not in order: kept


def test_the_deployment_page_shows_every_replica(client, team_setup, profile):
    host("host-a"), host("host-b")
    head = launch(team_setup, profile, 2)
    second = head.replicas()[1]
    set_state(second, "ready", port=8500, base_url="http://127.0.0.1:8500/v1", ready_at=timezone.now())
    client.force_login(team_setup["alice"])
    page = client.get(reverse("deployment_detail", args=[head.pk])).content.decode()
    assert "Replicas" in page and "host-a" in page and "host-b" in page and "http://127.0.0.1:8500/v1" in page
    assert "no engine metrics yet" in page
    listing = client.get(reverse("serving")).content.decode()
    assert "1/2 replicas ready" in listing and f"#{second.pk}<" not in listing  # one row for the deployment
    replica_page = client.get(reverse("deployment_detail", args=[second.pk])).content.decode()
    assert "replica 2 of 2" in replica_page
