"""A route's shadow tests (as on its page): list them with their figures, start one, stop the running one."""
import datetime
from decimal import Decimal
from typing import Any

from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.channels.models import Channel, Route, ShadowState
from panel.channels.shadow import MAX_BUDGET, shadow_start, shadow_stop, shadow_summary

router = Router(tags=["routes and canaries"])


class ShadowOut(Schema):
    id: int
    candidate_id: int | None
    candidate: str | None
    percent: int
    budget: Decimal
    min_similarity: float
    state: str
    stop_reason: str
    started_at: datetime.datetime
    stopped_at: datetime.datetime | None
    summary: dict[str, Any] = Field(..., description="mirrored, answered, passed, pass_rate, mean_similarity, "
                                    "p50_ms, p95_ms, client_p50_ms, client_p95_ms, cost, client_cost, budget_left, "
                                    "cost_per_accepted, client_cost_per_request")


class ShadowIn(Schema):
    channel: int = Field(..., ge=1, le=2**53, description="A channel id of this team that the route does not use.")
    percent: int = Field(..., ge=1, le=100, description="The share of the route's answered requests copied.")
    budget: Decimal = Field(..., gt=0, le=MAX_BUDGET, max_digits=12, decimal_places=4)
    min_similarity: float = Field(0.5, gt=0, le=1, description="Word F1 with the client's answer needed to pass.")


def shadow_out(shadow):
    summary = {name: f"{value.normalize():f}" if isinstance(value, Decimal) else value
               for name, value in shadow_summary(shadow).items()}
    return {"id": shadow.pk, "candidate_id": shadow.candidate_id,
            "candidate": shadow.candidate.name if shadow.candidate else None, "percent": shadow.percent,
            "budget": shadow.budget, "min_similarity": shadow.min_similarity, "state": shadow.state,
            "stop_reason": shadow.stop_reason, "started_at": shadow.started_at, "stopped_at": shadow.stopped_at,
            "summary": summary}


def _route(request, route_id):
    return get_object_or_404(Route, pk=route_id, team=request.team)


@router.get("/routes/{route_id}/shadow-tests", auth=gate("channels.view"), response=errors({200: list[ShadowOut]}),
            summary="The route's shadow tests, newest first, with their figures")
def shadow_tests_list(request, route_id: int):
    return [shadow_out(shadow) for shadow in _route(request, route_id).shadow_tests.select_related("candidate")]


@router.post("/routes/{route_id}/shadow-tests", auth=gate("shadows.run"), response=errors({201: ShadowOut}),
             summary="Start a shadow test: copies of a share of the route's answered requests to a candidate")
def shadow_tests_start(request, route_id: int, body: ShadowIn):
    route = _route(request, route_id)
    channel = Channel.objects.filter(team=request.team, pk=body.channel).first()
    if channel is None:
        raise Invalid({"channel": [f"Your team has no channel with id {body.channel}."]})
    shadow = shadow_start(route=route, channel=channel, percent=body.percent, budget=body.budget,
                          min_similarity=body.min_similarity, user=request.user, request=request)
    return Status(201, shadow_out(shadow))


@router.post("/routes/{route_id}/shadow-tests/stop", auth=gate("shadows.run"), response=errors({200: ShadowOut}),
             summary="Stop the route's running shadow test (its figures stay)")
def shadow_tests_stop(request, route_id: int):
    running = _route(request, route_id).shadow_tests.filter(state=ShadowState.RUNNING).first()
    if running is None or not shadow_stop(shadow=running, user=request.user, request=request):
        raise Invalid({"route": ["No shadow test runs on this route."]})
    return shadow_out(running)
