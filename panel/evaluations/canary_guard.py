"""The autopilot's guard on a canary: the route's evaluation set, run on the candidate, with the autopilot's
thresholds. When a canary starts on a route whose autopilot has a set (proposed by the autopilot or started by a
person), a run of the set's version an admin pinned on the autopilot is queued on the candidate in the same
transaction and the canary is held (`Route.canary_hold`: no step up by itself) until that run passes; a run that
falls short rolls the canary back, in words that name the set; a run that fails holds it with the reason (a person
may still promote with an override, which the audit log keeps). Only runs of the pinned version that the guard or
an admin started decide (runs.evidence_runs): a member's new version, or a member's run, decides nothing. The
gateway's own guards (JSON failures, errors, P99) keep running beside it (channels/canary.py)."""
import logging

from django.core.exceptions import ValidationError
from django.db import transaction
from django.dispatch import receiver

from panel.channels import canary
from panel.channels.models import CanaryState, Route
from panel.evaluations.models import Autopilot, EvalRun
from panel.evaluations.runs import eval_run_launch, evidence_runs
from panel.jobs.models import JobState

log = logging.getLogger(__name__)


@receiver(canary.canary_started, dispatch_uid="evaluations.canary_guard")
def hold_until_the_set_passes(sender, *, route, channel, actor=None, request=None, **kwargs):
    autopilot = (Autopilot.objects.filter(route=route, eval_set__isnull=False, eval_version__isnull=False)
                 .select_related("eval_set", "eval_version").first())
    if autopilot is None:
        return
    name = autopilot.eval_set.name
    try:
        run = eval_run_launch(team=route.team, user=actor or getattr(request, "user", None),
                              eval_set=autopilot.eval_set, version=autopilot.eval_version,
                              candidate=f"channel:{channel.pk}")
    except ValidationError as error:
        hold = f"the evaluation set “{name}” cannot run on {channel.name}: {' '.join(error.messages)}"
    else:
        hold = (f"the evaluation set “{name}” runs on {channel.name} (run #{run.pk}): the canary steps up once it "
                "passes the autopilot's thresholds")
    Route.objects.filter(pk=route.pk).update(canary_hold=hold[:500])
    route.canary_hold = hold[:500]


def after_run(run_id):
    """A run has ended: judge the canaries it guards (their candidate, the autopilot's pinned version, run after the
    canary started, by the guard or an admin)."""
    run = EvalRun.objects.select_related("eval_version__eval_set").filter(pk=run_id).first()
    if run is None or run.candidate.get("kind") != "channel" or not run.is_final:
        return
    if not evidence_runs(run.team_id).filter(pk=run.pk).exists():
        return
    routes = Route.objects.filter(canary_state=CanaryState.RUNNING, canary_channel_id=run.candidate.get("id"),
                                  canary_started_at__lte=run.created_at).exclude(canary_hold="")
    for route in routes.select_related("canary_channel", "team"):
        autopilot = Autopilot.objects.filter(route=route, eval_version=run.eval_version_id).first()
        if autopilot is not None:
            _judge(route, autopilot, run)


def _judge(route, autopilot, run):
    name = autopilot.eval_set.name
    if run.state != JobState.SUCCEEDED:
        hold = f"the evaluation set “{name}” did not finish on {route.canary_channel.name} (run #{run.pk}: " \
               f"{run.failure_reason or run.state}); run it again or promote by hand"
        Route.objects.filter(pk=route.pk).update(canary_hold=hold[:500])
        return
    shortfall = shortfall_words(autopilot, run)
    with transaction.atomic():
        if shortfall:
            reason = f"On the evaluation set “{name}” (run #{run.pk}) the candidate {shortfall}."
            canary.canary_rollback(route=route, reason=reason, evidence={"evaluation_run": run.pk, **run.result})
        else:
            Route.objects.filter(pk=route.pk, canary_state=CanaryState.RUNNING).update(canary_hold="")


def shortfall_words(autopilot, run):
    """Why the run falls short of the autopilot's thresholds ("" when it passes), against the route's own latest
    run on the same version."""
    own = (evidence_runs(autopilot.route.team_id)
           .filter(eval_version=run.eval_version, state=JobState.SUCCEEDED, candidate__kind="route",
                   candidate__id=autopilot.route_id).order_by("-finished_at", "-pk").first())
    return threshold_words(autopilot, run.result.get("pass_rate") or 0,
                           own.result.get("pass_rate") if own is not None else None)


def threshold_words(autopilot, rate, route_rate):
    """Why a pass rate on the set misses the autopilot's thresholds ("" when it meets them): at least
    `min_pass_rate`, and at most `max_drop` below the route's own (`route_rate`; None: not known)."""
    if rate < autopilot.min_pass_rate:
        return f"passes {rate:.0%} of the set (needs {autopilot.min_pass_rate:.0%})"
    if route_rate is not None and rate < route_rate - autopilot.max_drop - 1e-9:
        return (f"passes {rate:.0%} of the set, the route {route_rate:.0%} (at most {autopilot.max_drop:.0%} less "
                "allowed)")
    return ""
