"""Canary rollout of a candidate channel on a route (move 5% of the traffic to the quantized model first, watch
its JSON parse failures against the stable channels', its errors and its P99, roll back when one is worse).

The gateway sends `route.canary_percent` % of the route's requests to the candidate first (falling back to the
route's own channels) and marks each usage record with its arm (`RequestLog.canary`). `canary_check` reads the
window since the current step began and rolls back at once when a guard trips; with `canary_auto` it also
promotes 5 -> 25 -> 50 -> 100 after each clean step. Every step is audit-logged and bumps the routing version,
which the gateway re-reads at most every ROUTE_VERSION_CHECK_SECONDS.

Other parts of the panel may guard a canary beyond these numbers: `canary_started` is sent inside the transaction
that starts one, and a receiver may set `Route.canary_hold` (the autopilot runs its evaluation set on the candidate,
evaluations/canary_guard.py); while a hold is set the step has no passing verdict, so nothing promotes it by
itself, and the holder clears it or rolls the canary back."""
from datetime import timedelta

import django.dispatch
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import CANARY_STEPS, CanaryState, Channel, Route
from panel.channels.services import routing_changed
from panel.notifications.models import EventKind
from panel.notifications.services import notify
from panel.usage.models import RequestLog

# Sent inside canary_start's transaction: route (the row, running), channel, actor, request.
canary_started = django.dispatch.Signal()

ERROR_KINDS_NOT_THE_CHANNELS = ("bad_request",)  # the client's own bad request, answered 400 by any channel


def _audit(action, route, *, request=None, actor=None, **detail):
    audit_record(action=action, request=request, team=route.team, actor=actor, target=route.model_name,
                 candidate=route.canary_channel.name if route.canary_channel else "", **detail)


def next_step(percent):
    """The share after `percent` on the 5 -> 25 -> 50 -> 100 ladder (100 stays 100)."""
    return next((step for step in CANARY_STEPS if step > percent), 100)


@transaction.atomic
def canary_start(*, route, channel, percent=CANARY_STEPS[0], auto=False, request=None, actor=None):
    """Start sending `percent` % of the route's traffic to `channel`. ValidationError (nothing changed) when the
    channel cannot be a candidate or a canary already runs."""
    route = Route.objects.select_for_update().get(pk=route.pk)
    errors = []
    if route.canary_state == CanaryState.RUNNING:
        errors.append(f"A canary of {route.canary_channel} already runs on this route: stop it first.")
    if not isinstance(channel, Channel) or channel.team_id != route.team_id:
        errors.append("Pick one of this team's channels as the candidate.")
    elif route.routechannel_set.filter(channel=channel).exists():
        errors.append(f"{channel.name} already serves this route: the candidate must be a channel the route does "
                      "not use yet (for example the new AWQ deployment's local channel).")
    elif not channel.enabled or channel.problem:
        errors.append(f"{channel.name} is disabled or misconfigured: fix it (and press Test) before a canary.")
    if percent not in CANARY_STEPS[:-1]:
        errors.append(f"Start at one of {', '.join(f'{step}%' for step in CANARY_STEPS[:-1])}.")
    if errors:
        raise ValidationError(errors)
    now = timezone.now()
    route.canary_channel, route.canary_percent, route.canary_state = channel, percent, CanaryState.RUNNING
    route.canary_auto, route.canary_started_at, route.canary_step_at = bool(auto), now, now
    route.canary_reason, route.canary_evidence, route.canary_checked_at = "", {}, None
    route.canary_hold = ""
    route.save()
    routing_changed(route.team_id)
    _audit(AuditAction.CANARY_STARTED, route, request=request, actor=actor, percent=percent, auto=bool(auto))
    canary_started.send(sender=Route, route=route, channel=channel, actor=actor, request=request)
    return route


def _step(route, *, expect_percent, **changes):
    """One conditional UPDATE from the state we read: a concurrent step (the schedule and a click) wins once."""
    changed = Route.objects.filter(pk=route.pk, canary_state=CanaryState.RUNNING,
                                   canary_percent=expect_percent).update(**changes)
    if changed:
        for name, value in changes.items():
            setattr(route, name, value)
        routing_changed(route.team_id)
    return bool(changed)


class NoVerdict(ValidationError):
    """A promotion asked for without a passing verdict (and without a confirmed override)."""


def verdict_words(verdict):
    """Why the current step has no passing verdict, in words ("" when it has one)."""
    if verdict and verdict.get("held"):
        return verdict["held"]
    if not verdict or not verdict.get("candidate"):
        return "the guards have not judged this step yet (no candidate requests checked)"
    if verdict.get("problems"):
        return "; ".join(verdict["problems"])
    if not verdict.get("clean"):
        return (f"the candidate has served {verdict['candidate']['requests']} of the {verdict['minimum']} requests "
                "a verdict needs in this step")
    return ""


@transaction.atomic
def canary_promote(*, route, request=None, actor=None, auto=False, override_reason=""):
    """Move a running canary one step up (5 -> 25 -> 50 -> 100; at 100 it is complete). Returns the route, or
    raises ValidationError when no canary runs. `override_reason`: a person promoted without a passing verdict and
    confirmed it; the audit log keeps the reason and the numbers they overrode."""
    if route.canary_state != CanaryState.RUNNING:
        raise ValidationError("No canary is running on this route.")
    before, evidence = route.canary_percent, route.canary_evidence
    after = next_step(before)
    state = CanaryState.COMPLETED if after >= 100 else CanaryState.RUNNING
    if not _step(route, expect_percent=before, canary_percent=after, canary_state=state,
                 canary_step_at=timezone.now(), canary_evidence={}, canary_checked_at=None):  # a new window
        raise ValidationError("The canary changed meanwhile; reload the page.")
    override = {}
    if override_reason:
        override = {"override": True, "override_reason": override_reason[:500], "verdict": verdict_words(evidence)}
    _audit(AuditAction.CANARY_PROMOTED, route, request=request, actor=actor, percent_from=before, percent=after,
           auto=auto, **override)
    return route


@transaction.atomic
def canary_rollback(*, route, reason, evidence=None, request=None, actor=None):
    """Drop the candidate's share to 0 at once and keep why. False when no canary was running."""
    before = route.canary_percent
    if route.canary_state != CanaryState.RUNNING or not _step(
            route, expect_percent=before, canary_percent=0, canary_state=CanaryState.ROLLED_BACK,
            canary_reason=reason, canary_evidence=evidence or route.canary_evidence,
            canary_checked_at=timezone.now()):
        return False
    _audit(AuditAction.CANARY_ROLLED_BACK, route, request=request, actor=actor, percent_from=before, reason=reason)
    notify(team=route.team_id, kind=EventKind.CANARY_ROLLED_BACK,
           title=f"Canary on {route.model_name} rolled back from {before}%: {reason}"[:300], route=route.model_name,
           route_id=route.pk, candidate=route.canary_channel.name if route.canary_channel else "",
           percent_from=before, reason=reason[:1000])
    return True


@transaction.atomic
def canary_stop(*, route, request=None, actor=None):
    """End a canary by hand (running or complete): the candidate gets no more traffic."""
    if route.canary_state not in (CanaryState.RUNNING, CanaryState.COMPLETED):
        raise ValidationError("No canary is running on this route.")
    before = route.canary_percent
    Route.objects.filter(pk=route.pk).update(canary_state=CanaryState.STOPPED, canary_percent=0)
    route.canary_state, route.canary_percent = CanaryState.STOPPED, 0
    routing_changed(route.team_id)
    _audit(AuditAction.CANARY_STOPPED, route, request=request, actor=actor, percent_from=before)
    return route


# ------------------------------------------------------------------------------------------------- guards

JSON_GUARD_Z = 1.645  # one-sided 95 %: a difference of JSON failure rates this many standard errors is not chance


def p99(values):
    """The 99th percentile by nearest rank (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


def _failed(row, candidate_id):
    if row["outcome"] in ("error", "upstream_stalled", "upstream_cut"):
        return row["error_kind"] not in ERROR_KINDS_NOT_THE_CHANNELS
    if candidate_id is not None:
        # A canary request answered by another channel: the candidate failed, or rests in its cooldown after
        # failing (then the gateway tries it last and the stable channel answers without a fallback).
        return row["outcome"] == "ok" and row["channel_id"] != candidate_id
    return row["fell_back"]


def _arm(rows, candidate_id=None):
    served = [row for row in rows if candidate_id is None or row["channel_id"] == candidate_id]
    errors = sum(1 for row in rows if _failed(row, candidate_id))
    json_rows = [row for row in served if row["json_requested"] and row["json_valid"] is not None]
    latencies = [row["latency_ms"] for row in served if row["outcome"] == "ok"]
    return {"requests": len(rows), "errors": errors, "json_requests": len(json_rows),
            "json_failures": sum(1 for row in json_rows if not row["json_valid"]),
            "latency_samples": len(latencies), "p99_ms": p99(latencies)}


def _rate(failures, count):
    return failures / count if count else 0.0


def json_guard(candidate, stable, *, minimum, limit):
    """The JSON guard's words when it trips, else "". A real model fails some JSON requests itself (a runaway
    answer cut at max_tokens), so the candidate is judged against the stable arm of the same window: it trips when
    its failure rate is more than `limit` points above the stable arm's and the difference is more than chance (a
    one-sided two-proportion z-test at 95 %). With fewer than `minimum` stable JSON requests there is nothing to
    compare with, and the candidate must stay at or under `limit` % on its own."""
    mine, count = candidate["json_failures"], candidate["json_requests"]
    if count < minimum:
        return ""
    rate = _rate(mine, count)
    words = f"JSON parse failures {100 * rate:.1f}% ({mine} of {count} requests that asked for JSON)"
    if stable["json_requests"] < minimum:
        return f"{words} are above the {limit}% threshold" if 100 * rate > limit else ""
    theirs, their_count = stable["json_failures"], stable["json_requests"]
    baseline = _rate(theirs, their_count)
    if 100 * (rate - baseline) <= limit:
        return ""
    pooled = (mine + theirs) / (count + their_count)
    spread = (pooled * (1 - pooled) * (1 / count + 1 / their_count)) ** 0.5
    if spread and (rate - baseline) / spread < JSON_GUARD_Z:
        return ""
    return (f"{words} are {100 * (rate - baseline):.1f} points above the stable channels' {100 * baseline:.1f}% "
            f"({theirs} of {their_count}), more than the {limit}-point threshold")


def canary_guards(*, route, now=None):
    """The numbers of the current window for both arms and the guards that trip, in words.
    {"window_start", "candidate": {...}, "stable": {...}, "problems": [...], "clean": bool}: `clean` means enough
    candidate requests and no problem."""
    now = now or timezone.now()
    start = max(route.canary_step_at or now, now - timedelta(seconds=settings.CANARY_WINDOW_SECONDS))
    rows = list(RequestLog.objects.filter(route_id=route.pk, created_at__gte=start, canary__isnull=False).values(
        "canary", "channel_id", "outcome", "error_kind", "fell_back", "json_requested", "json_valid", "latency_ms"))
    candidate = _arm([row for row in rows if row["canary"]], route.canary_channel_id)
    stable = _arm([row for row in rows if not row["canary"]])
    minimum, problems = settings.CANARY_MIN_REQUESTS, []
    json_limit, error_limit = settings.CANARY_JSON_FAILURE_PERCENT, settings.CANARY_ERROR_PERCENT
    if json_problem := json_guard(candidate, stable, minimum=minimum, limit=json_limit):
        problems.append(json_problem)
    if candidate["requests"] >= minimum:
        rate = 100 * candidate["errors"] / candidate["requests"]
        if rate > error_limit:
            problems.append(f"errors {rate:.1f}% ({candidate['errors']} of {candidate['requests']} requests failed "
                            f"or were answered by the stable channels) are above the {error_limit}% threshold")
    if candidate["latency_samples"] >= minimum and stable["latency_samples"] >= minimum:
        mine, theirs = candidate["p99_ms"], stable["p99_ms"]
        ratio = settings.CANARY_P99_RATIO_PERCENT / 100
        if mine > theirs * ratio and mine - theirs > settings.CANARY_P99_MARGIN_MS:
            problems.append(f"P99 latency {mine:.0f} ms is {mine / max(theirs, 0.001):.1f}× the stable channels' "
                            f"{theirs:.0f} ms (the limit is {ratio:g}×)")
    return {"window_start": start.isoformat(), "candidate": candidate, "stable": stable, "problems": problems,
            "clean": not problems and candidate["requests"] >= minimum and not route.canary_hold,
            "minimum": minimum, "held": route.canary_hold}


def canary_check(*, route, now=None, request=None):
    """Run the guards on a running canary: roll back when one trips; with the automatic schedule, promote after a
    clean step of CANARY_STEP_SECONDS. Returns "rolled_back", "promoted", or "watching". `request`: the user who
    asked for the check (the audit log names them), None for the schedule."""
    now = now or timezone.now()
    verdict = canary_guards(route=route, now=now)
    if verdict["problems"]:
        reason = "; ".join(verdict["problems"]) + "."
        rolled_back = canary_rollback(route=route, reason=reason, evidence=verdict, request=request)
        return "rolled_back" if rolled_back else "watching"
    Route.objects.filter(pk=route.pk).update(canary_evidence=verdict, canary_checked_at=now)
    route.canary_evidence, route.canary_checked_at = verdict, now
    step_done = route.canary_step_at and (now - route.canary_step_at).total_seconds() >= settings.CANARY_STEP_SECONDS
    if route.canary_auto and verdict["clean"] and step_done:
        try:
            canary_promote(route=route, auto=True, request=request)
        except ValidationError:
            return "watching"
        return "promoted"
    return "watching"


def canary_check_and_promote(*, route, request=None, override_reason=""):
    """*Check and promote*: run the guards first (a trip rolls back, and nothing is promoted), then step up unless
    the schedule did in the same check. A step up needs a passing verdict (enough candidate requests in the step,
    no guard tripped): without one it raises NoVerdict, unless a person confirmed an override with a reason, which
    the audit log records. Returns "rolled_back" or "promoted"; ValidationError when nothing runs."""
    outcome = canary_check(route=route, request=request) if route.canary_state == CanaryState.RUNNING else None
    if outcome == "rolled_back":
        return outcome
    if outcome == "promoted":
        return outcome
    override_reason = (override_reason or "").strip()
    if route.canary_state == CanaryState.RUNNING and not route.canary_evidence.get("clean") and not override_reason:
        raise NoVerdict(f"Not promoted: no passing verdict yet ({verdict_words(route.canary_evidence)}). Wait for "
                        "more traffic, or promote without a verdict: confirm it and give a reason for the audit log.")
    canary_promote(route=route, request=request,
                   override_reason=override_reason if not route.canary_evidence.get("clean") else "")
    return "promoted"


def canaries_check(*, now=None):
    """Check every running canary (the beat task). Returns {route id: outcome}."""
    outcomes = {}
    for route in Route.objects.filter(canary_state=CanaryState.RUNNING).select_related("canary_channel", "team"):
        outcomes[route.pk] = canary_check(route=route, now=now)
    return outcomes
