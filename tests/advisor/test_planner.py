"""The break-even planner against a hand-computed case: a deployment up 10 hours at 2.00 an hour that served three
busy minutes, each worth 1.00 at the cloud channel's prices; its idle hours, the load at which local wins, the cost
of sleeping after 5 and 15 idle minutes (awake stretches, a 60 s start per wake, the waking minute's requests in the
cloud), all-cloud, and the cheapest with its saving; on the Advisor page and in the API."""
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.urls import reverse

from panel.advisor.planner import deployment_plan
from panel.channels.models import Channel
from panel.dashboards.models import MINUTE, UsageRollup
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
    assert costs["stay up"].cost == pytest.approx(20) and costs["all cloud"].cost == pytest.approx(3)
    assert line.best.name == "sleep after 5 min" and line.saving == pytest.approx(17.5)


def test_an_unpriced_host_has_no_choices_and_says_so(plan_case, client):
    host = plan_case["deployment"].host
    host.gpu_price_per_hour = None
    host.save()
    [line] = deployment_plan(plan_case["team"], days=7, now=plan_case["now"])
    assert line.local_cost is None and line.choices == [] and line.best is None and line.saving is None
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
