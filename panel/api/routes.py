"""Routes, their rules and their canaries (as on a route's page): list, one, create, replace, delete; add, replace,
reorder and delete a rule; start a canary, check and promote it, roll it back, stop it; the route's traffic samples
(set how it keeps them, read them, delete them: admins, as on the samples page)."""
import datetime
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from ninja import Field, Query, Router, Schema, Status

from panel.accounts.models import TeamKey
from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, validated
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels import canary, rules
from panel.channels.forms import CanaryForm
from panel.channels.models import (
    Channel,
    Route,
    RouteBalance,
    RouteRule,
    RouteStrategy,
    RuleApi,
    RuleTools,
    WhileWaking,
    listed_routes,
)
from panel.channels.sampling import route_samples_delete, route_sampling_save
from panel.channels.services import route_delete, route_save
from panel.usage import samples as traffic_samples

router = Router(tags=["routes and canaries"])


class RouteChannelOut(Schema):
    channel_id: int
    channel: str
    position: int
    weight: int


class CanaryOut(Schema):
    state: str
    channel_id: int | None
    channel: str | None
    percent: int
    auto: bool
    started_at: datetime.datetime | None
    step_at: datetime.datetime | None
    reason: str
    evidence: dict[str, Any]
    checked_at: datetime.datetime | None


class RuleChannelOut(Schema):
    channel_id: int
    channel: str


class RuleOut(Schema):
    id: int
    position: int
    name: str
    conditions: str
    tokens_under: int | None
    tokens_over: int | None
    tools: str
    header_name: str
    header_value: str
    key_id: int | None
    api: str
    channels: list[RuleChannelOut]


class RuleIn(Schema):
    name: str = Field(..., max_length=100)
    tokens_under: int | None = Field(None, ge=1, le=rules.TOKEN_LIMIT, description="The input-token estimate is "
                                     "below this.")
    tokens_over: int | None = Field(None, ge=1, le=rules.TOKEN_LIMIT, description="The input-token estimate is "
                                    "above this.")
    tools: Literal[tuple(RuleTools.values)] = Field("", description="\"with\", \"without\" or \"\" (either).")
    header_name: str = Field("", max_length=100)
    header_value: str = Field("", max_length=300)
    key_id: int | None = Field(None, ge=1, le=2**53, description="A key of this team.")
    api: Literal[("", *RuleApi.values)] = ""
    channels: list[int] = Field(..., max_length=20, description="Channel ids of this team, in the order tried.")


class RuleOrder(Schema):
    rule_ids: list[int] = Field(..., max_length=200, description="Every rule of the route, once, in the new order.")


class SamplingOut(Schema):
    samples_per_day: int = Field(..., description="0: the route keeps none of its requests.")
    retention_days: int
    redactions: list[str] = Field(..., description="The team's own patterns, after the built-in ones.")
    kept: int


class SamplingIn(Schema):
    samples_per_day: int = Field(..., ge=0, le=traffic_samples.MAX_PER_DAY, description="0 keeps none.")
    retention_days: int = Field(14, ge=1, le=traffic_samples.MAX_RETENTION_DAYS)
    redactions: list[str] = Field([], max_length=traffic_samples.MAX_REDACTIONS,
                                  description="Regular expressions; each match becomes [redacted] before a sample "
                                              "is stored.")


class SamplesQuery(Schema):
    limit: int = Field(100, ge=1, le=1000)


class SampleOut(Schema):
    id: int
    created_at: datetime.datetime
    endpoint: str
    model: str
    channel_id: int | None
    request_id: str
    redacted: int
    messages: list[dict[str, Any]]
    answer: str
    json_requested: bool


class RouteOut(Schema):
    id: int
    model_name: str
    strategy: str
    fallback_on_error: bool
    deadline_seconds: float
    while_waking: str
    spill_wait_ms: int
    balance: str
    affinity_header: str
    enabled: bool
    channels: list[RouteChannelOut]
    rules: list[RuleOut]
    canary: CanaryOut
    sampling: SamplingOut


class RouteChannelIn(Schema):
    channel: int = Field(..., ge=1, le=2**53, description="A channel id of this team.")
    position: int = Field(0, ge=0, le=10_000)
    weight: int = Field(1, ge=0, le=1000)


class RouteIn(Schema):
    model_name: str = Field(..., max_length=200, description="What clients send as \"model\".")
    strategy: Literal[tuple(RouteStrategy.values)] = RouteStrategy.LOCAL_FIRST
    fallback_on_error: bool = True
    deadline_seconds: float = Field(45, ge=1, le=3600, description="Seconds for every attempt, retry and fallback "
                                    "until the answer starts.")
    while_waking: Literal[tuple(WhileWaking.values)] = Field(
        WhileWaking.FALL_BACK, description="While the route's local engine wakes from sleep: 'fallback' sends the "
        "request that woke it to the next channel, 'wait' waits for the engine up to the deadline.")
    spill_wait_ms: int = Field(0, ge=0, le=600_000, description="Milliseconds: a request the local engine would keep "
                               "waiting longer (its queue × its time per request) goes to the route's remote "
                               "channels first. 0: off; else at least 50.")
    balance: Literal[tuple(RouteBalance.values)] = Field(
        RouteBalance.IN_ORDER, description="How requests spread over the leading local channels (a deployment's "
        "replicas): '' in order, round_robin, least_in_flight, session_affinity, prefix_aware.")
    affinity_header: str = Field("x-session-id", max_length=100, description="Session affinity's header (else "
                                 "the Anthropic metadata.user_id, else the key).")
    enabled: bool = True
    channels: list[RouteChannelIn] = Field(..., max_length=200)


CanaryStart = schema_from_form(CanaryForm, "CanaryStart")


class CanaryRollback(Schema):
    reason: str = Field(..., min_length=1, max_length=1000, description="Why, in words (shown on the route page).")


def route_out(route):
    return {"id": route.pk, "model_name": route.model_name, "strategy": route.strategy,
            "fallback_on_error": route.fallback_on_error, "deadline_seconds": route.deadline_seconds,
            "while_waking": route.while_waking, "spill_wait_ms": route.spill_wait_ms, "balance": route.balance,
            "affinity_header": route.affinity_header,
            "enabled": route.enabled,
            "channels": [{"channel_id": entry.channel_id, "channel": entry.channel.name, "position": entry.position,
                          "weight": entry.weight} for entry in route.entries()],
            "rules": [rule_out(rule) for rule in route.rules.select_related("key").order_by("position", "pk")],
            "canary": {"state": route.canary_state, "channel_id": route.canary_channel_id,
                       "channel": route.canary_channel.name if route.canary_channel else None,
                       "percent": route.canary_percent, "auto": route.canary_auto,
                       "started_at": route.canary_started_at, "step_at": route.canary_step_at,
                       "reason": route.canary_reason, "evidence": route.canary_evidence or {},
                       "checked_at": route.canary_checked_at},
            "sampling": sampling_out(route)}


def sampling_out(route):
    return {"samples_per_day": route.samples_per_day, "retention_days": route.sample_retention_days,
            "redactions": traffic_samples.redaction_lines(route.sample_redactions), "kept": route.samples.count()}


def rule_out(rule):
    return {"id": rule.pk, "position": rule.position, "name": rule.name, "conditions": rule.conditions_text,
            "tokens_under": rule.tokens_under, "tokens_over": rule.tokens_over, "tools": rule.tools,
            "header_name": rule.header_name, "header_value": rule.header_value, "key_id": rule.key_id,
            "api": rule.api, "channels": [{"channel_id": channel.pk, "channel": channel.name}
                                          for channel in rule.channel_list()]}


def _route(request, route_id):
    return get_object_or_404(Route.objects.select_related("canary_channel"), pk=route_id, team=request.team)


def _fresh(route):
    return Route.objects.select_related("canary_channel").get(pk=route.pk)


def _entries(request, body):
    channels = {channel.pk: channel for channel in Channel.objects.filter(
        team=request.team, pk__in=[item.channel for item in body.channels])}
    unknown = sorted({item.channel for item in body.channels} - set(channels))
    if unknown:
        raise Invalid({"channels": [f"Your team has no channel with id {unknown[0]}."]})
    return [(channels[item.channel], item.position, item.weight) for item in body.channels]


def _save(request, route, body):
    return route_save(team=request.team, user=request.user, route=route, model_name=body.model_name,
                      strategy=body.strategy, fallback_on_error=body.fallback_on_error, enabled=body.enabled,
                      deadline_seconds=body.deadline_seconds, balance=body.balance, while_waking=body.while_waking,
                      spill_wait_ms=body.spill_wait_ms,
                      affinity_header=body.affinity_header, entries=_entries(request, body))


@router.get("/routes", auth=gate("channels.view"), response=errors({200: list[RouteOut]}))
def routes_list(request):
    routes = listed_routes(request.team).select_related("canary_channel").order_by("model_name")
    return [route_out(route) for route in routes]


@router.get("/routes/{route_id}", auth=gate("channels.view"), response=errors({200: RouteOut}))
def routes_get(request, route_id: int):
    return route_out(_route(request, route_id))


@router.post("/routes", auth=gate("routes.edit"), response=errors({201: RouteOut}))
def routes_create(request, body: RouteIn):
    return Status(201, route_out(_fresh(_save(request, None, body))))


@router.put("/routes/{route_id}", auth=gate("routes.edit"), response=errors({200: RouteOut}),
            summary="Replace a route and its channels")
def routes_replace(request, route_id: int, body: RouteIn):
    return route_out(_fresh(_save(request, _route(request, route_id), body)))


@router.delete("/routes/{route_id}", auth=gate("routes.edit"), response=errors({204: None}))
def routes_delete(request, route_id: int):
    route_delete(route=_route(request, route_id))
    return Status(204, None)


@router.post("/routes/{route_id}/canary", auth=gate("canaries.run"), response=errors({200: RouteOut}),
             summary="Start a canary: a share of the route's traffic to a candidate channel it does not use yet")
def canary_start(request, route_id: int, body: CanaryStart):
    route = _route(request, route_id)
    data = validated(CanaryForm, body, route=route).cleaned_data
    canary.canary_start(route=route, channel=data["channel"], request=request, percent=data["percent"],
                        auto=data["auto"])
    return route_out(_fresh(route))


@router.post("/routes/{route_id}/canary/promote", auth=gate("canaries.run"), response=errors({200: RouteOut}),
             summary="Check and promote: the guards first (a trip rolls back), then one step up if the step has a "
                     "passing verdict; `override_reason` promotes without one, and the audit log keeps it")
def canary_promote(request, route_id: int, override_reason: str = ""):
    canary.canary_check_and_promote(route=_route(request, route_id), request=request,
                                    override_reason=override_reason)
    return route_out(_fresh(_route(request, route_id)))


@router.post("/routes/{route_id}/canary/rollback", auth=gate("canaries.run"), response=errors({200: RouteOut}),
             summary="Roll a running canary back by hand: its share drops to 0 with your reason")
def canary_rollback(request, route_id: int, body: CanaryRollback):
    route = _route(request, route_id)
    if not canary.canary_rollback(route=route, reason=body.reason.strip() or "rolled back by hand",
                                  request=request):
        raise ValidationError("No canary is running on this route.")
    return route_out(_fresh(route))


@router.post("/routes/{route_id}/canary/stop", auth=gate("canaries.run"), response=errors({200: RouteOut}))
def canary_stop(request, route_id: int):
    route = _route(request, route_id)
    canary.canary_stop(route=route, request=request)
    return route_out(_fresh(route))


def _rule_save(request, route, rule, body):
    found = {channel.pk: channel for channel in Channel.objects.filter(team=request.team, pk__in=body.channels)}
    problems = {}
    unknown = [ident for ident in body.channels if ident not in found]
    if unknown:
        problems["channels"] = [f"Your team has no channel with id {unknown[0]}."]
    key = None
    if body.key_id is not None:
        key = TeamKey.objects.filter(team=request.team, pk=body.key_id).first()
        if key is None:
            problems["key_id"] = [f"Your team has no key with id {body.key_id}."]
    if problems:  # with the service's own problems, so that every one is reported at once
        checked = rules.rule_check(route=route, name=body.name, tokens_under=body.tokens_under,
                                   tokens_over=body.tokens_over, tools=body.tools, header_name=body.header_name,
                                   header_value=body.header_value, key=None, api=body.api,
                                   channels=[found[ident] for ident in body.channels if ident in found])
        problems.update({field: messages for field, messages in checked.items()
                         if field not in problems and not (field == "channels" and unknown)})
        raise Invalid({"key_id" if field == "key" else field: messages for field, messages in problems.items()})
    saved = rules.rule_save(route=route, rule=rule, name=body.name, tokens_under=body.tokens_under,
                            tokens_over=body.tokens_over, tools=body.tools, header_name=body.header_name,
                            header_value=body.header_value, key=key, api=body.api,
                            channels=[found[ident] for ident in body.channels])
    audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name, rule=saved.name,
                 change="created" if rule is None else "changed", conditions=saved.conditions_text,
                 channels=[channel.name for channel in saved.channel_list()])
    return saved


def _rule(route, rule_id):
    return get_object_or_404(RouteRule, pk=rule_id, route=route)


@router.get("/routes/{route_id}/rules", auth=gate("channels.view"), response=errors({200: list[RuleOut]}))
def rules_list(request, route_id: int):
    return [rule_out(rule) for rule in _route(request, route_id).rules.select_related("key").order_by("position")]


@router.post("/routes/{route_id}/rules", auth=gate("routes.edit"), response=errors({201: RuleOut}),
             summary="Add a rule (tried after the route's other rules)")
def rules_create(request, route_id: int, body: RuleIn):
    return Status(201, rule_out(_rule_save(request, _route(request, route_id), None, body)))


@router.put("/routes/{route_id}/rules/{rule_id}", auth=gate("routes.edit"), response=errors({200: RuleOut}),
            summary="Replace a rule")
def rules_replace(request, route_id: int, rule_id: int, body: RuleIn):
    route = _route(request, route_id)
    return rule_out(_rule_save(request, route, _rule(route, rule_id), body))


@router.put("/routes/{route_id}/rule-order", auth=gate("routes.edit"), response=errors({200: list[RuleOut]}),
            summary="Put the route's rules in a new order")
def rules_reorder(request, route_id: int, body: RuleOrder):
    route = _route(request, route_id)
    rules.rules_reorder(route=route, rule_ids=body.rule_ids)
    audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name, change="reordered",
                 order=list(route.rules.order_by("position").values_list("name", flat=True)))
    return [rule_out(rule) for rule in route.rules.select_related("key").order_by("position")]


@router.delete("/routes/{route_id}/rules/{rule_id}", auth=gate("routes.edit"), response=errors({204: None}))
def rules_delete(request, route_id: int, rule_id: int):
    route = _route(request, route_id)
    rule = _rule(route, rule_id)
    rules.rule_delete(rule=rule)
    audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name, rule=rule.name,
                 change="deleted")
    return Status(204, None)


@router.put("/routes/{route_id}/sampling", auth=gate("samples.manage"), response=errors({200: SamplingOut}),
            summary="Set how the route keeps samples of its traffic as evaluation material (0 a day: none)")
def sampling_set(request, route_id: int, body: SamplingIn):
    route = _route(request, route_id)
    if any("\n" in line for line in body.redactions):
        raise Invalid({"redactions": ["One regular expression per item, without line breaks."]})
    route_sampling_save(route=route, user=request.user, per_day=body.samples_per_day,
                        retention_days=body.retention_days, redactions="\n".join(body.redactions), request=request)
    return sampling_out(route)


@router.get("/routes/{route_id}/samples", auth=gate("samples.manage"), response=errors({200: list[SampleOut]}),
            summary="The route's kept samples, newest first, decrypted (at most `limit`)")
def samples_list(request, route_id: int, query: Query[SamplesQuery]):
    found = []
    for sample in _route(request, route_id).samples.all()[:query.limit]:
        content = traffic_samples.sample_content(sample)
        found.append({"id": sample.pk, "created_at": sample.created_at, "endpoint": sample.endpoint,
                      "model": sample.model, "channel_id": sample.channel_id, "request_id": sample.request_id,
                      "redacted": sample.redacted, "messages": content["messages"], "answer": content["answer"],
                      "json_requested": content.get("json_requested", False)})
    return found


@router.delete("/routes/{route_id}/samples", auth=gate("samples.manage"), response=errors({204: None}),
               summary="Delete every sample the route kept")
def samples_delete(request, route_id: int):
    route_samples_delete(route=_route(request, route_id), user=request.user, request=request)
    return Status(204, None)
