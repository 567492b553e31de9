"""The advisor's break-even planner (as on Advisor): per deployment, its replicas together, over the last 7 or 30
days, its GPU hours and idle hours, the same tokens at the cloud channel's prices, the load at which local wins, the
cost of each choice (as it ran, sleep after N idle minutes, a replica range, all cloud) with the cheapest, and the
spill wait to set with the cheapest replica range."""
from ninja import Field, Query, Router, Schema

from panel.advisor.planner import DAYS, deployment_plan
from panel.api.auth import gate
from panel.api.errors import Invalid, errors

router = Router(tags=["advisor"])


class PlanQuery(Schema):
    days: int = Field(7, description="The last 7 or 30 days.")


class ChoiceOut(Schema):
    name: str = Field(description="as it ran, sleep after N min, N replicas, N to M replicas, or all cloud")
    cost: float
    awake_hours: float | None = Field(description="GPU hours; for a replica range, replica hours.")
    wakes: int = Field(description="A sleeping engine's wakes; for a replica range, the replicas the scaler would "
                                   "have started.")
    cloud_cost: float = Field(description="The part of the cost paid to the cloud.")
    min_replicas: int | None = Field(description="A replica range's fewest replicas; empty for other choices.")
    max_replicas: int | None = Field(description="A replica range's most replicas; empty for other choices.")


class PlanOut(Schema):
    deployment: int = Field(description="The deployment (its first replica).")
    name: str
    replicas: int = Field(description="Its replicas up in the range of days.")
    up_hours: float = Field(description="Its replicas' up hours, summed.")
    idle_hours: float = Field(description="Replica hours without a request in the minute.")
    tokens: int = Field(description="Tokens its replicas served.")
    tokens_per_hour: float
    gpu_price_per_hour: float | None = Field(description="The price of a replica-hour. Empty: a host has no GPU "
                                                         "price.")
    local_cost: float | None = Field(description="Its GPU hours' cost.")
    cloud_cost: float | None = Field(description="The same tokens at the cloud channel's prices.")
    spilled_tokens: int = Field(description="Tokens its route spilled to the cloud while its replicas were busy.")
    spilled_cost: float = Field(description="What those spilled requests cost, as recorded.")
    actual_cost: float | None = Field(description="What it really cost: local_cost plus spilled_cost.")
    break_even_tokens_per_hour: float | None = Field(description="The load at which local costs what the cloud "
                                                                 "would.")
    wake_seconds: float = Field(description="The deployment's own start-up time, from its last start.")
    capacity_tokens_per_minute: int | None = Field(description="A replica's capacity: the most tokens one replica "
                                                               "served in one minute of the range. Empty: it "
                                                               "served nothing.")
    choices: list[ChoiceOut] = Field(description="Each choice, the cheapest replica range among them.")
    cheapest: str | None
    saving: float | None = Field(description="What the cheapest choice would have saved against actual_cost.")
    cheapest_range: ChoiceOut | None = Field(description="The replica range that would have cost least. Empty: no "
                                                         "GPU price, no cloud channel or nothing served.")
    route: str | None = Field(description="The route whose first local channel is one of its replicas'.")
    spill_wait_ms: int | None = Field(description="The route's spill wait to set with the cheapest range: about "
                                                  "one request's time. Empty: no range, or nothing measured.")
    spill_wait_basis: str = Field(description="What the spill wait came from, or why there is none.")


def _choice(choice):
    return {"name": choice.name, "cost": choice.cost, "awake_hours": choice.awake_hours, "wakes": choice.wakes,
            "cloud_cost": choice.cloud_cost, "min_replicas": choice.low, "max_replicas": choice.high}


@router.get("/advisor/planner", auth=gate("advisor.view"), response=errors({200: list[PlanOut]}),
            summary="The break-even planner: per deployment, what idle time cost and the cheapest choice")
def advisor_planner(request, query: Query[PlanQuery]):
    if query.days not in DAYS:
        raise Invalid({"days": [f"days is one of {', '.join(map(str, DAYS))}, not {query.days}."]})
    return [{"deployment": line.deployment.pk, "name": line.name, "replicas": line.replicas,
             "up_hours": line.up_hours, "idle_hours": line.idle_hours, "tokens": line.tokens,
             "tokens_per_hour": line.tokens_per_hour, "gpu_price_per_hour": line.hourly,
             "local_cost": line.local_cost, "cloud_cost": line.cloud_cost, "spilled_tokens": line.spilled_tokens,
             "spilled_cost": line.spilled_cost, "actual_cost": line.actual_cost,
             "break_even_tokens_per_hour": line.break_even_tokens_per_hour, "wake_seconds": line.wake_seconds,
             "capacity_tokens_per_minute": line.capacity, "choices": [_choice(choice) for choice in line.choices],
             "cheapest": line.best.name if line.best else None, "saving": line.saving,
             "cheapest_range": _choice(line.best_range) if line.best_range else None, "route": line.route,
             "spill_wait_ms": line.spill_wait_ms, "spill_wait_basis": line.spill_wait_basis}
            for line in deployment_plan(request.team, days=query.days)]
