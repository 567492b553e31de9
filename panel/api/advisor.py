"""The advisor's break-even planner (as on Advisor): per deployment over the last 7 or 30 days, its GPU hours and
idle hours, the same tokens at the cloud channel's prices, the load at which local wins, and the cost of each
choice (stay up, sleep after N idle minutes, all cloud) with the cheapest."""
from ninja import Field, Query, Router, Schema

from panel.advisor.planner import DAYS, deployment_plan
from panel.api.auth import gate
from panel.api.errors import Invalid, errors

router = Router(tags=["advisor"])


class PlanQuery(Schema):
    days: int = Field(7, description="The last 7 or 30 days.")


class ChoiceOut(Schema):
    name: str = Field(description="stay up, sleep after N min, or all cloud")
    cost: float
    awake_hours: float | None
    wakes: int


class PlanOut(Schema):
    deployment: int
    name: str
    up_hours: float
    idle_hours: float = Field(description="Hours up without a request in the minute.")
    tokens: int
    tokens_per_hour: float
    gpu_price_per_hour: float | None = Field(description="Empty: the host has no GPU price.")
    local_cost: float | None
    cloud_cost: float | None = Field(description="The same tokens at the cloud channel's prices.")
    break_even_tokens_per_hour: float | None = Field(description="The load at which local costs what the cloud "
                                                                 "would.")
    wake_seconds: float = Field(description="The deployment's own start-up time, from its last start.")
    choices: list[ChoiceOut]
    cheapest: str | None
    saving: float | None = Field(description="What the cheapest choice would have saved against staying up.")


@router.get("/advisor/planner", auth=gate("advisor.view"), response=errors({200: list[PlanOut]}),
            summary="The break-even planner: per deployment, what idle time cost and the cheapest choice")
def advisor_planner(request, query: Query[PlanQuery]):
    if query.days not in DAYS:
        raise Invalid({"days": [f"days is one of {', '.join(map(str, DAYS))}, not {query.days}."]})
    return [{"deployment": line.deployment.pk, "name": line.name, "up_hours": line.up_hours,
             "idle_hours": line.idle_hours, "tokens": line.tokens, "tokens_per_hour": line.tokens_per_hour,
             "gpu_price_per_hour": line.hourly, "local_cost": line.local_cost, "cloud_cost": line.cloud_cost,
             "break_even_tokens_per_hour": line.break_even_tokens_per_hour, "wake_seconds": line.wake_seconds,
             "choices": [choice.__dict__ for choice in line.choices],
             "cheapest": line.best.name if line.best else None, "saving": line.saving}
            for line in deployment_plan(request.team, days=query.days)]
