"""Shadow tests as the panel keeps them (panel/channels/shadow.py): what may be a candidate and the bounds, checked
whole with nothing started; each result recorded with its consequences (the budget spent, a candidate failing in a
row); the summary's figures; the route page's section, for admins, and stopping by hand."""
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.audit.models import AuditEvent
from panel.channels.models import Channel, Route, RouteChannel, ShadowState, ShadowTest
from panel.channels.shadow import FAILURES_IN_A_ROW, shadow_record, shadow_start, shadow_stop, shadow_summary

pytestmark = pytest.mark.django_db


@pytest.fixture
def route(team_setup):
    team = team_setup["team_a"]
    stable = Channel.objects.create(team=team, name="stable", base_url="https://api.example.com/v1", model_id="big")
    Channel.objects.create(team=team, name="small", base_url="https://api.example.com/v1", model_id="small")
    route = Route.objects.create(team=team, model_name="chat")
    RouteChannel.objects.create(route=route, channel=stable, position=0)
    return route


def small(route):
    return Channel.objects.get(team=route.team, name="small")


def test_a_candidate_and_its_bounds_are_checked_whole_and_nothing_starts(route, team_setup):
    stable = Channel.objects.get(name="stable")
    with pytest.raises(ValidationError) as refused:
        shadow_start(route=route, channel=stable, percent=0, budget=Decimal("0"), min_similarity=1.5)
    assert refused.value.message_dict == {
        "channel": ["stable already serves this route: a shadow test is for a channel the route does not use yet."],
        "percent": ["A whole percentage from 1 to 100."], "budget": ["An amount above 0 and at most 100,000."],
        "min_similarity": ["More than 0 and at most 1."]}
    other_team = Channel.objects.create(team=team_setup["team_b"], name="theirs", base_url="https://x.example/v1",
                                        model_id="m")
    with pytest.raises(ValidationError, match="Pick one of this team's channels"):
        shadow_start(route=route, channel=other_team, percent=10, budget=Decimal("1"))
    assert not ShadowTest.objects.exists()
    shadow_start(route=route, channel=small(route), percent=10, budget=Decimal("1"))
    with pytest.raises(ValidationError, match="already runs on this route"):
        shadow_start(route=route, channel=small(route), percent=10, budget=Decimal("1"))
    assert ShadowTest.objects.count() == 1


def test_results_stop_the_test_when_the_budget_is_spent(route):
    shadow = shadow_start(route=route, channel=small(route), percent=50, budget=Decimal("0.01"))
    shadow_record(shadow_id=shadow.pk, ok=True, similarity=0.8, passed=True, cost=Decimal("0.004"),
                  latency_ms=100, client_latency_ms=300, client_cost=Decimal("0.02"))
    assert ShadowTest.objects.get().state == ShadowState.RUNNING
    shadow_record(shadow_id=shadow.pk, ok=True, similarity=0.2, passed=False, cost=Decimal("0.007"),
                  latency_ms=200, client_latency_ms=500, client_cost=Decimal("0.02"))
    shadow.refresh_from_db()
    assert shadow.state == ShadowState.BUDGET_SPENT and shadow.stop_reason == (
        "its budget of 0.01 was spent (0.0110)")
    assert shadow_record(shadow_id=shadow.pk, ok=True, cost=Decimal("1")) is None  # ended: nothing more recorded
    summary = shadow_summary(shadow)
    assert (summary["mirrored"], summary["answered"], summary["passed"], summary["pass_rate"]) == (2, 2, 1, 0.5)
    assert summary["mean_similarity"] == pytest.approx(0.5) and summary["cost"] == Decimal("0.011")
    assert summary["cost_per_accepted"] == Decimal("0.011") and summary["budget_left"] == 0
    assert (summary["p50_ms"], summary["client_p50_ms"]) == (150, 400)
    assert summary["client_cost_per_request"] == Decimal("0.02")
    assert AuditEvent.objects.filter(action="shadow_stopped").get().detail["state"] == "budget_spent"
    from panel.notifications.models import Notification

    note = Notification.objects.get(kind="shadow.ended")  # webhooks hear of a test that stopped itself
    assert note.title == "Shadow test of small on chat stopped: its budget of 0.01 was spent (0.0110)"
    assert note.facts == {"route": "chat", "state": "budget_spent", "mirrored": 2, "passed": 1, "cost": "0.011"}


def test_a_candidate_failing_in_a_row_stops_the_test_and_a_success_resets_the_count(route):
    shadow = shadow_start(route=route, channel=small(route), percent=50, budget=Decimal("5"))
    for _ in range(FAILURES_IN_A_ROW - 1):
        shadow_record(shadow_id=shadow.pk, ok=False, error="HTTP 500")
    shadow_record(shadow_id=shadow.pk, ok=True, similarity=1.0, passed=True)
    for _ in range(FAILURES_IN_A_ROW - 1):
        shadow_record(shadow_id=shadow.pk, ok=False, error="HTTP 500")
    assert ShadowTest.objects.get().state == ShadowState.RUNNING
    shadow_record(shadow_id=shadow.pk, ok=False, error="HTTP 503")
    shadow.refresh_from_db()
    assert shadow.state == ShadowState.FAILED
    assert shadow.stop_reason == f"small failed {FAILURES_IN_A_ROW} mirrored requests in a row; the last: HTTP 503"
    assert not shadow_stop(shadow=shadow)  # already ended


def test_an_admin_starts_and_stops_a_shadow_test_on_the_route_page(client, team_setup, route):
    client.force_login(team_setup["vera"])
    assert client.post(reverse("shadow_start", args=[route.pk]), {"shadow-channel": small(route).pk,
                                                                  "shadow-percent": 10, "shadow-budget": "5",
                                                                  "shadow-min_similarity": "0.5"}
                       ).status_code == 403
    client.force_login(team_setup["alice"])
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "Start a shadow test" in page and "stable</option>" not in page and "small</option>" in page
    bad = client.post(reverse("shadow_start", args=[route.pk]), {"shadow-channel": small(route).pk,
                                                                 "shadow-percent": 101, "shadow-budget": "5",
                                                                 "shadow-min_similarity": "0.5"})
    assert bad.status_code == 400 and not ShadowTest.objects.exists()
    started = client.post(reverse("shadow_start", args=[route.pk]), {"shadow-channel": small(route).pk,
                                                                     "shadow-percent": 10, "shadow-budget": "5",
                                                                     "shadow-min_similarity": "0.6"})
    assert started.status_code == 302
    shadow = ShadowTest.objects.get()
    assert (shadow.percent, shadow.budget, shadow.min_similarity, shadow.created_by) == (
        10, Decimal("5"), 0.6, team_setup["alice"])
    shadow_record(shadow_id=shadow.pk, ok=True, similarity=0.9, passed=True, cost=Decimal("0.001"), latency_ms=120,
                  client_latency_ms=800, client_cost=Decimal("0.01"))
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "Stop the shadow test" in page and "120 / 120 ms" in page and "800 / 800 ms" in page
    assert "Start a shadow test" not in page
    assert client.post(reverse("shadow_stop", args=[route.pk])).status_code == 302
    shadow.refresh_from_db()
    assert shadow.state == ShadowState.STOPPED and shadow.stop_reason == "stopped by hand"
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "Stopped" in page and "Start a shadow test" in page  # the last test's figures stay, a new one may start
    assert set(AuditEvent.objects.values_list("action", flat=True)) >= {"shadow_started", "shadow_stopped"}
    from panel.notifications.models import Notification

    assert not Notification.objects.exists()  # stopped by hand: no notification
