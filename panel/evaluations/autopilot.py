"""A route's autopilot: which candidate could serve the route for less and still be good enough, on the evidence the
panel holds, and what to do about it.

The candidates are the team's enabled channels the route does not use (cloud channels, the local channels of other
deployments: quantized children, other profiles), and the quantized relatives of the route's local model that no
deployment serves yet (listed with their quality report, to be launched before they can be judged). A channel is
judged on the autopilot's evaluation set (its latest finished run on the version an admin pinned, started by the
panel or an admin: the pass rate and the cost per accepted answer, evaluations/runs.py) and on shadow traffic (the
route's latest shadow test of that channel, channels/shadow.py). It qualifies when both pass rates reach the team's
`min_pass_rate` (the shadow copies only once there are `min_shadow_copies`), its pass rate on the set is at most
`max_drop` below the route's own (good enough means about as good as today, whatever the model's size), its model's
quality report does not reject it, and its cost per accepted answer is below the route's own on the same set. The
cheapest that qualifies is proposed: once per new proposal a notification (`autopilot.proposal`, webhooks) and an
audit row; with `start_canary`, a canary of it is started, whose guards then decide promotion or rollback
(channels/canary.py)."""
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels import canary
from panel.channels.models import CanaryState, Channel, ShadowTest
from panel.channels.shadow import shadow_summary
from panel.core.money import money_text
from panel.evaluations.canary_guard import threshold_words
from panel.evaluations.models import Autopilot, EvalRun
from panel.evaluations.runs import candidates_ranked, eval_run_launch, evidence_runs
from panel.jobs.models import JobState
from panel.notifications.models import EventKind
from panel.notifications.services import notify
from panel.registry.quality import quality_report, served_model_quality, verdict_words
from panel.serving.models import Deployment, DeploymentState
from panel.usage.models import RequestLog

log = logging.getLogger(__name__)

REGRESSION_POINTS = 0.1  # a channel passing this much less of the set than in its run before has regressed
TRAFFIC_DAYS = 30
CLIENT_ENDPOINTS = ("chat", "completions", "messages", "responses")  # not Compare's, evaluations' or shadow copies


def route_traffic(route, days=TRAFFIC_DAYS, now=None):
    """The route's clients' requests over the last `days`: requests, tokens, cost, cost per 1M tokens, and the cost
    of a month (30 days) at that rate."""
    since = (now or timezone.now()) - timedelta(days=days)
    totals = RequestLog.objects.filter(route=route, created_at__gte=since, endpoint__in=CLIENT_ENDPOINTS).aggregate(
        requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost"))
    tokens = (totals["prompt"] or 0) + (totals["completion"] or 0)
    cost = totals["cost"] or Decimal(0)
    return {"days": days, "requests": totals["requests"], "tokens": tokens, "cost": cost,
            "cost_per_million_tokens": cost * 1_000_000 / tokens if tokens else None,
            "cost_per_month": cost * 30 / days}


@dataclass
class Candidate:
    label: str
    channel: Channel | None = None
    model: object = None  # a model no deployment serves yet
    quality: str = ""  # its quality report's verdict in words
    run: object = None  # its latest finished EvalRun on the set's current version
    shadow: dict | None = None  # the summary of its latest shadow test on this route
    qualifies: bool = False
    reasons: list = field(default_factory=list)  # why not, or what it still needs

    @property
    def pass_rate(self):
        return self.run.result.get("pass_rate") if self.run else None

    @property
    def cost_per_accepted(self):
        value = self.run.result.get("cost_per_accepted") if self.run else None
        return Decimal(value) if value is not None else None


@dataclass
class Regression:
    label: str
    run: object  # the latest finished run
    before: object  # the finished run before it

    @property
    def words(self):
        return (f"{self.label} passes {self.run.result['pass_rate']:.0%} of the set now, "
                f"{self.before.result['pass_rate']:.0%} before (run #{self.before.pk} → #{self.run.pk})")


@dataclass
class Review:
    autopilot: Autopilot
    current: object = None  # the route's own latest run on the set
    candidates: list = field(default_factory=list)
    proposal: Candidate | None = None
    words: str = ""
    regressions: list = field(default_factory=list)  # channels that pass less of the set than they did
    traffic: dict = field(default_factory=dict)  # the route's clients' requests over TRAFFIC_DAYS (route_traffic)
    saving_per_month: Decimal | None = None  # what the proposal saves at that traffic

    @property
    def current_cost_per_accepted(self):
        value = self.current.result.get("cost_per_accepted") if self.current else None
        return Decimal(value) if value is not None else None


def autopilot_for(route):
    return (Autopilot.objects.filter(route=route).select_related("eval_set", "eval_version").first()
            or Autopilot(route=route))


@transaction.atomic
def autopilot_save(*, route, user, eval_set, min_pass_rate, min_shadow_copies, start_canary, max_drop=0.05,
                   pin_newest=False, request=None):
    """Set a route's autopilot (an admin's choice); ValidationError, saving nothing, for a set of another team or a
    value out of bounds. The version of the set it judges by is pinned: the set's newest when the set is new to the
    autopilot or with `pin_newest`; otherwise the one pinned before stays, whatever versions were saved since."""
    errors = {}
    if eval_set is not None and eval_set.team_id != route.team_id:
        errors["eval_set"] = ["Pick one of this team's evaluation sets."]
    if isinstance(min_pass_rate, bool) or not isinstance(min_pass_rate, (int, float)) or not 0 < min_pass_rate <= 1:
        errors["min_pass_rate"] = ["More than 0 and at most 1 (0.9: nine answers in ten pass)."]
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0 <= max_drop <= 1:
        errors["max_drop"] = ["From 0 (at least as good as the route) to 1 (no bound)."]
    copies = min_shadow_copies
    if isinstance(copies, bool) or not isinstance(copies, int) or not 0 <= copies <= 100_000:
        errors["min_shadow_copies"] = ["A whole number from 0 (the set alone decides) to 100,000."]
    if errors:
        raise ValidationError(errors)
    before = Autopilot.objects.filter(route=route).first()
    version = None
    if eval_set is not None:
        keep = (not pin_newest and before is not None and before.eval_set_id == eval_set.pk
                and before.eval_version_id is not None)
        version = before.eval_version if keep else eval_set.current()
    autopilot, _ = Autopilot.objects.update_or_create(route=route, defaults=dict(
        eval_set=eval_set, eval_version=version, min_pass_rate=float(min_pass_rate), max_drop=float(max_drop),
        min_shadow_copies=min_shadow_copies,
        start_canary=bool(start_canary)))
    audit_record(action=AuditAction.AUTOPILOT_CHANGED, request=request, team=route.team, actor=user,
                 target=route.model_name, eval_set=eval_set.name if eval_set else "",
                 version=version.number if version else None, min_pass_rate=min_pass_rate,
                 max_drop=max_drop,
                 min_shadow_copies=min_shadow_copies, start_canary=bool(start_canary))
    return autopilot


def autopilot_review(autopilot):
    """The candidates of the autopilot's route with their evidence, and the one to propose (or why none)."""
    route = autopilot.route
    review = Review(autopilot=autopilot)
    if autopilot.eval_set is None or autopilot.eval_version is None:
        review.words = "Pick the evaluation set the autopilot judges candidates by."
        return review
    version = autopilot.eval_version
    runs = {(run.candidate.get("kind"), run.candidate.get("id")): run
            for run in candidates_ranked(version, evidence_only=True)}
    review.current = runs.get(("route", route.pk))
    used = set(route.routechannel_set.values_list("channel_id", flat=True))
    for channel in Channel.objects.filter(team=route.team, enabled=True).exclude(pk__in=used).order_by("name"):
        candidate = Candidate(label=channel.name, channel=channel, run=runs.get(("channel", channel.pk)))
        shadow = ShadowTest.objects.filter(route=route, candidate=channel).first()
        candidate.shadow = shadow_summary(shadow) if shadow else None
        served = served_model_quality(channel)
        if served and served["evaluation"]:
            report = quality_report(served["model"])
            candidate.quality = _quality_words(report, served["model"])
        _judge(candidate, review.current, autopilot)
        review.candidates.append(candidate)
    review.candidates += _unserved_relatives(route)
    review.regressions = _regressions(autopilot, version, route, review.candidates)
    qualifying = [candidate for candidate in review.candidates if candidate.qualifies]
    review.proposal = min(qualifying, key=lambda candidate: candidate.cost_per_accepted, default=None)
    review.traffic = route_traffic(route)
    if review.proposal is not None:
        share = review.proposal.cost_per_accepted / review.current_cost_per_accepted
        review.saving_per_month = review.traffic["cost_per_month"] * (1 - share)
    review.words = _words(review, version)
    return review


def _judge(candidate, current, autopilot):
    reasons = candidate.reasons
    if candidate.run is None:
        reasons.append(f"not run on the set's version {autopilot.eval_version.number} yet")
    elif short := threshold_words(autopilot, candidate.pass_rate,
                                  current.result.get("pass_rate") if current is not None else None):
        reasons.append(short)
    shadow = candidate.shadow
    if autopilot.min_shadow_copies:
        if shadow is None or shadow["mirrored"] < autopilot.min_shadow_copies:
            reasons.append(f"{shadow['mirrored'] if shadow else 0} of {autopilot.min_shadow_copies} shadow copies")
        elif shadow["pass_rate"] < autopilot.min_pass_rate:
            reasons.append(f"passes {shadow['pass_rate']:.0%} of the shadow copies (needs "
                           f"{autopilot.min_pass_rate:.0%})")
    if candidate.quality.endswith("not for production."):
        reasons.append("its quality report rejects it")
    if candidate.run is not None and candidate.cost_per_accepted is None:
        reasons.append("no accepted answer")
    elif current is None:
        reasons.append("the route itself has not run the set: its cost per accepted answer is not known")
    elif candidate.cost_per_accepted is not None and current.result.get("cost_per_accepted") is not None \
            and candidate.cost_per_accepted >= Decimal(current.result["cost_per_accepted"]):
        reasons.append("costs no less per accepted answer than the route")
    candidate.qualifies = not reasons


def _finished_runs(version, channel_id):
    return list(evidence_runs(version.eval_set.team_id).filter(
        eval_version=version, state=JobState.SUCCEEDED, candidate__kind="channel", candidate__id=channel_id)
        .order_by("-finished_at", "-pk")[:2])


def _regressions(autopilot, version, route, candidates):
    """The route's own channels and the candidates whose latest run passes REGRESSION_POINTS less than the one
    before it on the same version (a changed engine, profile or model); a candidate that regressed is not proposed."""
    found = []
    channels = [entry.channel for entry in route.entries()] + [c.channel for c in candidates if c.channel]
    for channel in channels:
        runs = _finished_runs(version, channel.pk)
        if len(runs) == 2 and runs[1].result.get("pass_rate") is not None and runs[0].result.get(
                "pass_rate") is not None and runs[1].result["pass_rate"] - runs[0].result["pass_rate"] >= \
                REGRESSION_POINTS:
            found.append(Regression(label=channel.name, run=runs[0], before=runs[1]))
            for candidate in candidates:
                if candidate.channel == channel and candidate.qualifies:
                    candidate.qualifies = False
                    candidate.reasons.append("it regressed on the set")
    return found


def rechecks_due(autopilot):
    """The local channels to run the set on again: the route's own, and the candidates the set judged before, whose
    deployment became ready after their latest run of the pinned version was queued (its engine, profile or model
    changed since), with no run of it queued or running."""
    route = autopilot.route
    version = autopilot.eval_version
    on_route = set(route.routechannel_set.values_list("channel_id", flat=True))
    due = []
    for channel in Channel.objects.filter(team=route.team, enabled=True, deployment__isnull=False).select_related(
            "deployment"):
        deployment = channel.deployment
        if deployment.state != DeploymentState.READY or deployment.ready_at is None:
            continue
        runs = evidence_runs(route.team_id).filter(eval_version__eval_set=autopilot.eval_set,
                                                   candidate__kind="channel", candidate__id=channel.pk)
        if channel.pk not in on_route and not runs.exists():
            continue  # a candidate the team has not judged on this set: its first run is the team's to start
        if runs.filter(state__in=list(EvalRun.ACTIVE_STATES)).exists():
            continue
        latest = runs.filter(eval_version=version).order_by("-created_at").first()
        if latest is None or latest.created_at < deployment.ready_at:
            due.append(channel)
    return due


def autopilot_recheck(autopilot):
    """Queue a run of the set on each channel due (rechecks_due); the runs queued."""
    queued = []
    for channel in rechecks_due(autopilot):
        try:
            queued.append(eval_run_launch(team=autopilot.route.team, user=None, eval_set=autopilot.eval_set,
                                          version=autopilot.eval_version, candidate=f"channel:{channel.pk}"))
        except ValidationError as error:
            log.warning("autopilot of %s: no re-check of %s: %s", autopilot.route.model_name, channel.name,
                        " ".join(error.messages))
    if queued:
        audit_record(action=AuditAction.AUTOPILOT_RECHECKED, team=autopilot.route.team,
                     target=autopilot.route.model_name,
                     channels=[run.candidate.get("label", "") for run in queued])
    return queued


def _quality_words(report, model):
    row = next((row for row in report["rows"] if row["model"].pk == model.pk), None)
    if row is None or row["comparison"] is None or row["is_root"]:
        return ""
    return verdict_words(row["comparison"])


def _unserved_relatives(route):
    """The quantized relatives of the route's local models that no ready deployment of the team serves."""
    served = set(Deployment.objects.filter(team=route.team, state=DeploymentState.READY).values_list(
        "profile__model_id", flat=True))
    found, seen = [], set()
    for entry in route.entries():
        deployment = entry.channel.deployment if entry.channel.deployment_id else None
        if deployment is None:
            continue
        root = deployment.profile.model.parent or deployment.profile.model
        report = quality_report(root)
        for row in report["rows"]:
            model = row["model"]
            if row["is_root"] or model.pk in served or model.pk in seen:
                continue
            seen.add(model.pk)
            found.append(Candidate(label=model.name, model=model,
                                   quality=verdict_words(row["comparison"]) if row["comparison"] else "",
                                   reasons=["no deployment serves it: launch one, then run the set on its channel"]))
    return found


def _words(review, version):
    if review.proposal is not None:
        proposal = review.proposal
        current = Decimal(review.current.result["cost_per_accepted"])
        saving = 1 - proposal.cost_per_accepted / current if current else Decimal(0)
        return (f"{proposal.label} passes {proposal.pass_rate:.0%} of “{review.autopilot.eval_set.name}” v"
                f"{version.number} at {proposal.cost_per_accepted:.6f} per accepted answer, {saving:.0%} less "
                f"than the route ({current:.6f}): propose a canary of it."
                + (f" At the route's traffic of the last {review.traffic['days']} days that saves about "
                   f"{money_text(review.saving_per_month)} a month." if review.saving_per_month else ""))
    if review.current is None:
        return (f"Run “{review.autopilot.eval_set.name}” on the route itself first: its cost per accepted "
                "answer is what a candidate must beat.")
    return "No candidate passes the thresholds for less than the route costs now."


def autopilot_act(autopilot, *, request=None, actor=None):
    """Review, then act once per new proposal: notify, audit, and start a canary of it when the route allows and
    none runs. Returns the Review."""
    review = autopilot_review(autopilot)
    Autopilot.objects.filter(pk=autopilot.pk).update(reviewed_at=timezone.now())
    _flag(autopilot, review)
    proposal = review.proposal
    if proposal is None or autopilot.proposal.get("channel_id") == proposal.channel.pk:
        return review
    route = autopilot.route
    with transaction.atomic():
        autopilot.proposal = {"channel_id": proposal.channel.pk, "words": review.words,
                              "at": timezone.now().isoformat()}
        Autopilot.objects.filter(pk=autopilot.pk).update(proposal=autopilot.proposal)
        audit_record(action=AuditAction.AUTOPILOT_PROPOSED, request=request, team=route.team, actor=actor,
                     target=route.model_name, candidate=proposal.label, words=review.words)
        notify(team=route.team_id, kind=EventKind.AUTOPILOT_PROPOSAL, title=review.words[:300],
               route=route.model_name, candidate=proposal.label, pass_rate=proposal.pass_rate,
               cost_per_accepted=f"{proposal.cost_per_accepted:f}")
    if autopilot.start_canary and route.canary_state != CanaryState.RUNNING:
        try:
            canary.canary_start(route=route, channel=proposal.channel, request=request, actor=actor)
        except ValidationError as error:
            review.words += " The canary could not start: " + " ".join(error.messages)
    return review


def _flag(autopilot, review):
    """Notify each regression once (by its latest run)."""
    route = autopilot.route
    for regression in review.regressions:
        if regression.run.pk in autopilot.flagged_runs:
            continue
        with transaction.atomic():
            autopilot.flagged_runs = [*autopilot.flagged_runs, regression.run.pk][-200:]
            Autopilot.objects.filter(pk=autopilot.pk).update(flagged_runs=autopilot.flagged_runs)
            notify(team=route.team_id, kind=EventKind.EVALUATION_REGRESSION,
                   title=f"{route.model_name}: {regression.words}"[:300], route=route.model_name,
                   channel=regression.label, run=regression.run.pk, before=regression.before.pk,
                   pass_rate=regression.run.result["pass_rate"], before_pass_rate=regression.before.result["pass_rate"])


def autopilots_review():
    """Review every route's autopilot that has a set (hourly on beat): each acts once per new proposal."""
    reviews = []
    for autopilot in Autopilot.objects.filter(eval_set__isnull=False, eval_version__isnull=False).select_related(
            "route__team", "eval_set", "eval_version"):
        autopilot_recheck(autopilot)
        reviews.append(autopilot_act(autopilot))
    return reviews
