"""A route's autopilot (as on its page): the review (today's cost, candidates with their evidence, the proposal and
the money it saves a month, regressions) and its settings."""
from decimal import Decimal
from typing import Any

from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.channels.models import Route
from panel.evaluations.autopilot import autopilot_for, autopilot_review, autopilot_save
from panel.evaluations.models import EvalSet

router = Router(tags=["evaluations"])


class CandidateOut(Schema):
    label: str
    channel_id: int | None
    model_id: int | None = Field(None, description="A model no deployment serves yet.")
    quality: str
    run_id: int | None
    pass_rate: float | None
    cost_per_accepted: str | None
    shadow: dict[str, Any] | None
    qualifies: bool
    proposed: bool
    reasons: list[str]


class AutopilotOut(Schema):
    route_id: int
    eval_set_id: int | None
    eval_version: int | None = Field(..., description="The number of the set's version the autopilot and a "
                                     "canary's guard judge by, pinned by an admin.")
    min_pass_rate: float
    max_drop: float
    min_shadow_copies: int
    start_canary: bool
    words: str
    current_run_id: int | None
    current_cost_per_accepted: str | None
    traffic: dict[str, Any] = Field(..., description="days, requests, tokens, cost, cost_per_million_tokens, "
                                    "cost_per_month")
    saving_per_month: str | None
    candidates: list[CandidateOut]
    regressions: list[str]


class AutopilotIn(Schema):
    eval_set_id: int | None = Field(None, ge=1, le=2**53)
    min_pass_rate: float = Field(0.9, gt=0, le=1)
    max_drop: float = Field(0.05, ge=0, le=1, description="How much less of the set than the route a candidate "
                            "may pass.")
    min_shadow_copies: int = Field(20, ge=0, le=100_000)
    start_canary: bool = False
    pin_newest: bool = Field(False, description="Judge by the set's newest version from now on. Without it the "
                             "version pinned stays, whatever versions were saved since.")


def _text(value):
    if isinstance(value, Decimal):
        return f"{value.normalize():f}"
    return value


def autopilot_out(autopilot):
    review = autopilot_review(autopilot)
    return {"route_id": autopilot.route_id, "eval_set_id": autopilot.eval_set_id,
            "eval_version": autopilot.eval_version.number if autopilot.eval_version else None,
            "min_pass_rate": autopilot.min_pass_rate, "max_drop": autopilot.max_drop,
            "min_shadow_copies": autopilot.min_shadow_copies,
            "start_canary": autopilot.start_canary, "words": review.words,
            "current_run_id": review.current.pk if review.current else None,
            "current_cost_per_accepted": _text(review.current_cost_per_accepted),
            "traffic": {name: _text(value) for name, value in review.traffic.items()},
            "saving_per_month": _text(review.saving_per_month),
            "candidates": [{"label": c.label, "channel_id": c.channel.pk if c.channel else None,
                            "model_id": c.model.pk if c.model else None, "quality": c.quality,
                            "run_id": c.run.pk if c.run else None, "pass_rate": c.pass_rate,
                            "cost_per_accepted": _text(c.cost_per_accepted),
                            "shadow": {k: _text(v) for k, v in c.shadow.items()} if c.shadow else None,
                            "qualifies": c.qualifies, "proposed": c is review.proposal, "reasons": c.reasons}
                           for c in review.candidates],
            "regressions": [regression.words for regression in review.regressions]}


def _route(request, route_id):
    return get_object_or_404(Route, pk=route_id, team=request.team)


@router.get("/routes/{route_id}/autopilot", auth=gate("evaluations.view"), response=errors({200: AutopilotOut}),
            summary="The route's autopilot review: candidates, the proposal, the money it saves a month")
def autopilot_get(request, route_id: int):
    return autopilot_out(autopilot_for(_route(request, route_id)))


@router.put("/routes/{route_id}/autopilot", auth=gate("autopilot.manage"), response=errors({200: AutopilotOut}),
            summary="Set the route's autopilot: its evaluation set, thresholds, and whether it starts canaries")
def autopilot_set(request, route_id: int, body: AutopilotIn):
    route = _route(request, route_id)
    eval_set = None
    if body.eval_set_id is not None:
        eval_set = EvalSet.objects.filter(team=request.team, pk=body.eval_set_id).first()
        if eval_set is None:
            raise Invalid({"eval_set_id": [f"Your team has no evaluation set with id {body.eval_set_id}."]})
    autopilot = autopilot_save(route=route, user=request.user, eval_set=eval_set, min_pass_rate=body.min_pass_rate,
                               min_shadow_copies=body.min_shadow_copies, start_canary=body.start_canary,
                               max_drop=body.max_drop, pin_newest=body.pin_newest, request=request)
    return autopilot_out(autopilot)
