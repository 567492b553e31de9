"""The break-even planner against hand-computed cases. One: a deployment up 10 hours at 2.00 an hour that served three
busy minutes, each worth 1.00 at the cloud channel's prices; its idle hours, the load at which local wins, the cost
of sleeping after 5 and 15 idle minutes (awake stretches, a 60 s start per wake, the waking minute's requests in the
cloud), all-cloud, and the cheapest with its saving. Two: a deployment of two replicas whose route spilled a burst to
the cloud; a replica's measured capacity, every replica range's cost, the cheapest, and the spill wait to set with
it. Both on the Advisor page and in the API."""
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.urls import reverse

from panel.advisor.planner import deployment_plan
from panel.channels.models import Channel, Route, RouteChannel
from panel.dashboards.models import MINUTE, UsageRollup
from panel.serving.models import Deployment, ScalePolicy
from tests.support.api_helpers import call, owner_token  # noqa: F401 (fixtures)
from tests.support.dashboards import make_deployment


@pytest.fixture
def plan_case(team_setup):
    """The case, at this test's own clock (a module-level time would be the collection's, long before a slow run
    reaches these tests, and the API reads the real time)."""
    now = int(time.time()) // MINUTE * MINUTE
    team = team_setup["team_a"]
    deployment = make_deployment(team, price=Decimal("2"), gpu_count=1)
    ready = datetime.fromtimestamp(now - 10 * 3600, tz=timezone.utc)
    deployment.ready_at, deployment.started_at = ready, ready - timedelta(seconds=60)
    deployment.save()
    local = Channel.objects.create(team=team, name="local", kind="local", deployment=deployment,
                                   base_url=deployment.base_url, model_id="tiny-chat")
    Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://cloud/v1", model_id="c",
                           price_input_per_million=Decimal("1"), price_output_per_million=Decimal("2"))
    first = now - 9 * 3600
    for start in (first, first + MINUTE, first + 5 * 3600):  # a million prompt tokens each: 1.00 in the cloud
        UsageRollup.objects.create(team=team, period=MINUTE, start=start, channel=local, deployment=deployment,
                                   model="tiny-chat", local=True, requests=1, prompt_tokens=1_000_000)
    return {"team": team, "deployment": deployment, "now": now, **team_setup}


def test_the_planner_matches_the_hand_computed_case(plan_case):
    [line] = deployment_plan(plan_case["team"], days=7, now=plan_case["now"])
    assert line.up_hours == pytest.approx(10) and line.idle_hours == pytest.approx(10 - 3 / 60)
    assert (line.local_cost, line.cloud_cost, line.wake_seconds) == (pytest.approx(20), pytest.approx(3), 60)
    assert line.break_even_tokens_per_hour == pytest.approx(2_000_000)  # 2.00 an hour / 1.00 per million
    assert line.tokens_per_hour == pytest.approx(300_000)
    costs = {choice.name: choice for choice in line.choices}
    # Sleep after 5 min: awake 420 s (two busy minutes and five idle) and 360 s, plus a 60 s start each: 0.25 h at
    # 2.00 = 0.50, and each waking minute's 1.00 served by the cloud meanwhile: 2.50.
    five = costs["sleep after 5 min"]
    assert (five.wakes, five.awake_hours, five.cost) == (2, pytest.approx(0.25), pytest.approx(2.5))
    fifteen = costs["sleep after 15 min"]  # 1,020 s + 960 s + 120 s = 0.5833 h: 1.1667 + 2.00
    assert fifteen.cost == pytest.approx(2 * 2100 / 3600 + 2)
    assert costs["as it ran"].cost == pytest.approx(20) and costs["all cloud"].cost == pytest.approx(3)
    # One replica's capacity is the busiest minute's 1,000,000 tokens: no minute needs a second, so the only range is
    # one replica up the 10 hours, 20.00; no request carries a time, so no spill wait is made up.
    assert line.capacity == 1_000_000 and [(r.name, r.cost) for r in line.ranges] == [("1 replica", pytest.approx(20))]
    assert line.spill_wait_ms is None and line.spill_wait_basis.startswith("nothing measured")
    assert line.best.name == "sleep after 5 min" and line.saving == pytest.approx(17.5)


def test_an_unpriced_host_has_no_choices_and_says_so(plan_case, client):
    host = plan_case["deployment"].host
    host.gpu_price_per_hour = None
    host.save()
    [line] = deployment_plan(plan_case["team"], days=7, now=plan_case["now"])
    assert line.local_cost is None and line.choices == [] and line.best is None and line.saving is None
    assert line.ranges == [] and line.best_range is None and line.spill_wait_ms is None
    client.force_login(plan_case["vera"])
    page = client.get(reverse("advisor")).content.decode()
    assert "set a GPU price" in page and 'data-deployment="' in page


def test_the_page_and_the_api_show_the_plan(plan_case, client, owner_token):
    client.force_login(plan_case["vera"])  # a viewer reads it
    page = client.get(reverse("advisor"), {"days": "30"}).content.decode()
    assert "Break-even planner" in page and "<strong>30 days</strong>" in page and "sleep after 5 min" in page
    assert client.get(reverse("advisor"), {"days": "9"}).status_code == 200  # an unknown range: the default
    answer = call(client, "get", "/advisor/planner?days=7", owner_token)
    assert answer.status_code == 200, answer.content
    [plan] = answer.json()
    assert (plan["deployment"], plan["cheapest"]) == (plan_case["deployment"].pk, "sleep after 5 min")
    assert plan["saving"] == pytest.approx(17.5, abs=0.1)  # the API's clock: seconds after the case's
    assert call(client, "get", "/advisor/planner?days=9", owner_token).status_code == 400


@pytest.fixture
def replicas_case(team_setup):
    """A deployment of two replicas at 2.00 an hour each: the first up 10 hours (a 60 s start), the second 6 hours.
    Its route: the first's local channel, the second's, then the cloud at 5.00 per million prompt tokens. The first
    serves 500,000 tokens every minute; a burst at T (5 hours ago) wants 2M, 2M, 2M tokens at T, T+1 min, T+2 min
    and 3M at T+60 min, served and spilled as written below. Every local request takes 800 ms, the second's 1,400."""
    now = int(time.time()) // MINUTE * MINUTE
    team = team_setup["team_a"]
    head = make_deployment(team, price=Decimal("2"), gpu_count=1)
    head.ready_at = datetime.fromtimestamp(now - 10 * 3600, tz=timezone.utc)
    head.started_at = head.ready_at - timedelta(seconds=60)
    head.save()
    second = Deployment.objects.create(team=team, profile=head.profile, host=head.host, state="ready",
                                       served_model_name="tiny-chat", base_url="http://127.0.0.1:8/v1",
                                       replica_of=head, replica_index=1,
                                       ready_at=datetime.fromtimestamp(now - 6 * 3600, tz=timezone.utc))
    locals_ = [Channel.objects.create(team=team, name=f"local {n}", kind="local", deployment=replica,
                                      base_url=replica.base_url, model_id="tiny-chat")
               for n, replica in enumerate((head, second))]
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://cloud/v1", model_id="c",
                                   price_input_per_million=Decimal("5"), price_output_per_million=Decimal("5"))
    route = Route.objects.create(team=team, model_name="tiny-chat")
    for position, channel in enumerate((*locals_, cloud)):
        RouteChannel.objects.create(route=route, channel=channel, position=position)
    burst = now - 5 * 3600

    def served(channel, start, tokens, latency=800, model="tiny-chat"):
        return UsageRollup(team=team, period=MINUTE, start=start, channel=channel, deployment=channel.deployment,
                           model=model, local=True, requests=1, prompt_tokens=tokens, latency_sum_ms=latency)

    def spilled(start, tokens, requests, spilled, model="tiny-chat"):
        return UsageRollup(team=team, period=MINUTE, start=start, channel=cloud, model=model, local=False,
                           requests=requests, spilled=spilled, prompt_tokens=tokens, spilled_cost=spilled * 2.5)

    rows = [served(locals_[0], start, 500_000) for start in range(now - 600 * MINUTE, now, MINUTE)
            if start not in (burst, burst + MINUTE, burst + 2 * MINUTE, burst + 60 * MINUTE)]
    rows += [served(locals_[0], burst, 1_000_000), spilled(burst, 1_000_000, 2, 2),
             served(locals_[0], burst + MINUTE, 1_000_000), served(locals_[1], burst + MINUTE, 500_000, 1400),
             # one of two requests spilled: half the row's tokens (the other fell back from an engine error)
             spilled(burst + MINUTE, 1_000_000, 2, 1),
             # two rows of the first replica in one minute: one replica-minute of 1,000,000 tokens
             served(locals_[0], burst + 2 * MINUTE, 500_000), served(locals_[0], burst + 2 * MINUTE, 500_000,
                                                                     model="tiny-chat-b"),
             served(locals_[1], burst + 2 * MINUTE, 1_000_000, 1400),
             served(locals_[0], burst + 60 * MINUTE, 1_000_000), served(locals_[1], burst + 60 * MINUTE, 1_000_000,
                                                                         1400),
             spilled(burst + 60 * MINUTE, 1_000_000, 2, 2),
             spilled(burst + 60 * MINUTE, 7_000_000, 1, 1, model="another-route")]  # not this deployment's
    UsageRollup.objects.bulk_create(rows)
    return {"team": team, "deployment": head, "second": second, "cloud": cloud, "route": route, "now": now,
            **team_setup}


def test_replica_ranges_match_the_hand_computed_case(replicas_case):
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    assert (line.deployment, line.replicas, line.route) == (replicas_case["deployment"], 2, "tiny-chat")
    # The busiest replica-minute: 1,000,000 tokens (the first's two rows at T+2 summed; the deployment's 2,000,000
    # in that minute is two replicas').
    assert line.capacity == 1_000_000
    # Spilled: 1,000,000 at T, half of 1,000,000 at T+1, 1,000,000 at T+60: 2,500,000 tokens, recorded at 12.50.
    assert (line.spilled_tokens, line.spilled_cost) == (2_500_000, pytest.approx(12.5))
    # As it ran: 10 + 6 replica hours at 2.00 = 32.00, plus the 12.50 spilled = 44.50.
    assert (line.up_hours, line.hourly, line.local_cost) == (pytest.approx(16), pytest.approx(2), pytest.approx(32))
    assert line.actual_cost == pytest.approx(44.5)
    # Demand per minute: 2M at T, T+1, T+2, 3M at T+60 (at most 3 replicas), 500,000 in the 596 other minutes. At
    # 5.00 a million, a replica's slice of a full minute costs 5.00 in the cloud.
    # The 2nd replica, scaled: needed at T, T+1, T+2 and T+60. It starts at T+60 s (the up window), serves from
    # T+120 s (the 60 s start), stops at T+2 min's end + 300 s = T+480 s: 420 s; T and T+1 go to the cloud (10.00).
    # Again at T+60 min: starts at +60 s, serves from +120 s, stops at +360 s: 300 s; T+60 to the cloud (5.00).
    # So 720 s = 0.2 h, 2 starts, 15.00 late; absent, its 4 slices cost 20.00 in the cloud.
    # The 3rd, scaled: T+60 min only: 300 s = 1/12 h, 1 start, 5.00 late; absent, 5.00.
    # A range: low × 10 h + its scaled replicas' hours at 2.00, plus the cloud.
    expected = {(1, 1): 20 + 20 + 5, (1, 2): 2 * 10.2 + 15 + 5, (1, 3): 2 * (10.2 + 1 / 12) + 15 + 5,
                (2, 2): 40 + 5, (2, 3): 2 * (20 + 1 / 12) + 5, (3, 3): 60}
    assert {(r.low, r.high): pytest.approx(r.cost) for r in line.ranges} == expected
    best = line.best_range
    assert (best.name, best.cost, best.awake_hours, best.wakes, best.cloud_cost) == (
        "1 to 2 replicas", pytest.approx(40.4), pytest.approx(10.2), 2, pytest.approx(20))
    # Sleeping, one engine: awake the whole 10 h (a request every minute) and one 60 s start: 20.03; the waking
    # minute's 500,000 tokens (2.50) and every token beyond one replica (5 + 5 + 5 + 10) in the cloud: 47.53.
    costs = {choice.name: choice.cost for choice in line.choices}
    assert costs["sleep after 5 min"] == pytest.approx(2 * (10 + 1 / 60) + 2.5 + 25)
    assert costs["all cloud"] == pytest.approx(5 * (596 * 0.5 + 9))
    assert line.best.name == "1 to 2 replicas" and line.saving == pytest.approx(44.5 - 40.4)
    # The spill wait: the mean time of its 604 requests, (601 × 800 + 3 × 1,400) / 604 = 802.98 ms.
    assert line.spill_wait_ms == 803 and "604 requests" in line.spill_wait_basis


def test_a_longer_up_window_in_the_scale_policy_changes_the_ranges(replicas_case):
    # A 10-minute up window: a scaled replica would start after each need has gone (T+480 s, T+60 min + 360 s), so it
    # never serves; its slices all go to the cloud and 1 to 2 costs what 1 does.
    ScalePolicy.objects.create(deployment=replicas_case["deployment"], up_after_seconds=600)
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    costs = {(r.low, r.high): r for r in line.ranges}
    assert (costs[1, 2].cost, costs[1, 2].wakes) == (pytest.approx(45), 0)
    assert line.best_range.name == "1 replica"  # the first of the equal ones


def test_ranges_need_a_cloud_channel_and_a_gpu_price(replicas_case):
    replicas_case["cloud"].enabled = False
    replicas_case["cloud"].save()
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    assert line.cloud_cost is None and [choice.name for choice in line.choices] == ["as it ran"]
    assert line.ranges == [] and line.best_range is None and line.spill_wait_ms is None
    assert line.best.name == "as it ran" and line.saving == 0
    host = replicas_case["deployment"].host
    host.gpu_price_per_hour = None
    host.save()
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    assert (line.hourly, line.local_cost, line.actual_cost, line.choices, line.ranges) == (None, None, None, [], [])


def test_no_spill_wait_is_made_up_without_measured_times_and_it_stays_within_the_limits(replicas_case):
    rows = UsageRollup.objects.filter(team=replicas_case["team"])
    rows.update(latency_sum_ms=0)
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    assert line.best_range.name == "1 to 2 replicas" and line.spill_wait_ms is None
    assert line.spill_wait_basis.startswith("nothing measured")
    rows.update(latency_sum_ms=20)  # 20 ms a request: below the shortest spill wait a route takes
    [line] = deployment_plan(replicas_case["team"], days=7, now=replicas_case["now"])
    assert line.spill_wait_ms == 50 and line.spill_wait_basis.endswith("20 ms, held within the spill wait's 50 to "
                                                                       "600,000 ms")


def test_the_page_and_the_api_show_the_replica_range_and_spill_wait(replicas_case, client, owner_token):
    client.force_login(replicas_case["vera"])
    page = client.get(reverse("advisor")).content.decode()
    # The page's clock is seconds after the case's: the costs of the hours up grow by a fraction of a cent a second.
    assert "2 replicas</span>" in page and "1 to 2 replicas, 40.4" in page and "12.50 spilled" in page
    assert "spill wait 803 ms on tiny-chat: the mean time of its 604 requests" in page
    answer = call(client, "get", "/advisor/planner?days=7", owner_token)
    assert answer.status_code == 200, answer.content
    [plan] = answer.json()
    assert (plan["deployment"], plan["replicas"], plan["capacity_tokens_per_minute"], plan["spilled_tokens"]) == (
        replicas_case["deployment"].pk, 2, 1_000_000, 2_500_000)
    assert (plan["cheapest"], plan["route"], plan["spill_wait_ms"]) == ("1 to 2 replicas", "tiny-chat", 803)
    cheapest = plan["cheapest_range"]
    assert (cheapest["min_replicas"], cheapest["max_replicas"]) == (1, 2)
    assert cheapest["cost"] == pytest.approx(40.4, abs=0.1)  # the API's clock: seconds after the case's
    assert plan["actual_cost"] == pytest.approx(44.5, abs=0.1) and plan["spilled_cost"] == pytest.approx(12.5)
    assert "604 requests" in plan["spill_wait_basis"]
    assert [c["name"] for c in plan["choices"]][:2] == ["as it ran", "all cloud"]
