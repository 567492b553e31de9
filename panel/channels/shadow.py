"""Shadow tests of a route: a share of its answered requests sent again to a candidate channel, whose answers never
reach a client. Each mirrored answer is judged against the answer the client got (word F1 at least the test's
`min_similarity`, and valid JSON where JSON was asked for) and costed; the test stops itself when its budget is spent
or the candidate keeps failing. The gateway sends the copies (panel/gateway/shadow.py); this module starts and stops
tests, records each result with its consequences, and sums them up for the route's page and the API."""
import statistics
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import Channel, ShadowResult, ShadowState, ShadowTest
from panel.channels.routing import routing_changed
from panel.core.percentiles import percentile
from panel.notifications.models import EventKind
from panel.notifications.services import notify

MAX_BUDGET = Decimal("100000")
FAILURES_IN_A_ROW = 5  # the candidate failed this many mirrored requests in a row: the test stops


def _audit(action, shadow, *, request=None, actor=None, **detail):
    audit_record(action=action, request=request, team=shadow.route.team, actor=actor, target=shadow.route.model_name,
                 candidate=shadow.candidate.name if shadow.candidate else "", **detail)


@transaction.atomic
def shadow_start(*, route, channel, percent, budget, min_similarity=0.5, user=None, request=None):
    """Start mirroring `percent` % of the route's answered requests to `channel`, spending at most `budget`.
    ValidationError, starting nothing, when the channel cannot be a candidate, a value is out of bounds, or a shadow
    test already runs on the route."""
    errors = {}
    if not isinstance(channel, Channel) or channel.team_id != route.team_id:
        errors["channel"] = ["Pick one of this team's channels as the candidate."]
    elif route.routechannel_set.filter(channel=channel).exists():
        errors["channel"] = [f"{channel.name} already serves this route: a shadow test is for a channel the route "
                             "does not use yet."]
    elif not channel.enabled or channel.problem:
        errors["channel"] = [f"{channel.name} is disabled or misconfigured: fix it (and press Test) first."]
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        errors["percent"] = ["A whole percentage from 1 to 100."]
    if not isinstance(budget, Decimal) or not budget.is_finite() or not Decimal(0) < budget <= MAX_BUDGET:
        errors["budget"] = [f"An amount above 0 and at most {MAX_BUDGET:,}."]
    if isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float)) or not 0 < min_similarity <= 1:
        errors["min_similarity"] = ["More than 0 and at most 1."]
    if ShadowTest.objects.select_for_update().filter(route=route, state=ShadowState.RUNNING).exists():
        errors.setdefault("channel", []).append("A shadow test already runs on this route: stop it first.")
    if errors:
        raise ValidationError(errors)
    shadow = ShadowTest.objects.create(route=route, candidate=channel, percent=percent, budget=budget,
                                       min_similarity=float(min_similarity), created_by=user)
    routing_changed(route.team_id)
    _audit(AuditAction.SHADOW_STARTED, shadow, request=request, actor=user, percent=percent, budget=str(budget))
    return shadow


@transaction.atomic
def shadow_stop(*, shadow, state=ShadowState.STOPPED, reason="stopped by hand", user=None, request=None):
    """End a running test (one conditional UPDATE: a budget stop and a click end it once). True when it ran."""
    stopped = ShadowTest.objects.filter(pk=shadow.pk, state=ShadowState.RUNNING).update(
        state=state, stop_reason=reason[:1000], stopped_at=timezone.now())
    if stopped:
        shadow.refresh_from_db()
        routing_changed(shadow.route.team_id)
        _audit(AuditAction.SHADOW_STOPPED, shadow, request=request, actor=user, state=state, reason=reason[:300])
        if state != ShadowState.STOPPED:  # it stopped itself: the team hears of it
            summary = shadow_summary(shadow)
            notify(team=shadow.route.team_id, kind=EventKind.SHADOW_ENDED,
                   title=f"Shadow test of {shadow.candidate.name if shadow.candidate else 'a candidate'} on "
                         f"{shadow.route.model_name} stopped: {reason}"[:300],
                   route=shadow.route.model_name, state=state, mirrored=summary["mirrored"],
                   passed=summary["passed"], cost=f"{summary['cost'].normalize():f}")
    return bool(stopped)


@transaction.atomic
def shadow_record(*, shadow_id, **fields):
    """Store one mirrored request's result and, in the same transaction, stop the test when its budget is spent or
    the candidate failed FAILURES_IN_A_ROW times in a row (a reader never sees the result without its consequence).
    Returns the result, or None when the test ended meanwhile."""
    shadow = ShadowTest.objects.select_for_update().filter(pk=shadow_id).first()  # concurrent copies: one at a time
    if shadow is None or shadow.state != ShadowState.RUNNING:
        return None
    result = ShadowResult.objects.create(shadow=shadow, **fields)
    spent = shadow.results.aggregate(total=Sum("cost"))["total"] or Decimal(0)
    if spent >= shadow.budget:
        shadow_stop(shadow=shadow, state=ShadowState.BUDGET_SPENT,
                    reason=f"its budget of {shadow.budget.normalize():f} was spent ({spent:.4f})")
    elif not result.ok:
        recent = list(shadow.results.values_list("ok", flat=True)[:FAILURES_IN_A_ROW])
        if len(recent) == FAILURES_IN_A_ROW and not any(recent):
            shadow_stop(shadow=shadow, state=ShadowState.FAILED,
                        reason=f"{shadow.candidate.name if shadow.candidate else 'the candidate'} failed "
                               f"{FAILURES_IN_A_ROW} mirrored requests in a row; the last: {result.error}")
    return result


def shadow_summary(shadow):
    """The test's figures: how many mirrored, answered and passed; agreement; latency percentiles of the candidate
    and of the route's own answers to the same requests; cost of both and the candidate's cost per accepted answer."""
    results = list(shadow.results.all())
    answered = [result for result in results if result.ok]
    passed = [result for result in answered if result.passed]
    cost = sum((result.cost for result in results), Decimal(0))
    client_cost = sum((result.client_cost for result in results), Decimal(0))
    latencies = sorted(result.latency_ms for result in answered if result.latency_ms is not None)
    client_latencies = sorted(result.client_latency_ms for result in answered if result.client_latency_ms is not None)
    similarities = [result.similarity for result in answered if result.similarity is not None]
    return {
        "mirrored": len(results), "answered": len(answered), "passed": len(passed),
        "pass_rate": len(passed) / len(results) if results else None,
        "mean_similarity": statistics.fmean(similarities) if similarities else None,
        "p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
        "client_p50_ms": percentile(client_latencies, 50), "client_p95_ms": percentile(client_latencies, 95),
        "cost": cost, "client_cost": client_cost, "budget_left": max(shadow.budget - cost, Decimal(0)),
        "cost_per_accepted": cost / len(passed) if passed else None,
        "client_cost_per_request": client_cost / len(results) if results else None,
    }
