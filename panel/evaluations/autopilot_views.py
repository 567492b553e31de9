"""A route's autopilot page: its candidates with their evidence and the one it proposes (anyone in the team reads it);
its settings and a review on demand (admins)."""
import csv

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.roles import may
from panel.channels.models import Route
from panel.core.csv_cells import csv_row
from panel.core.forms import errors_into
from panel.evaluations.autopilot import (
    autopilot_act,
    autopilot_for,
    autopilot_recheck,
    autopilot_review,
    autopilot_save,
)
from panel.evaluations.models import EvalSet


class AutopilotForm(forms.Form):
    eval_set = forms.ModelChoiceField(queryset=EvalSet.objects.none(), required=False, label="Evaluation set",
                                      help_text="Candidates are judged on the version pinned here; run it on the "
                                                "route itself too, for the cost a candidate must beat.")
    pin_newest = forms.BooleanField(required=False, label="Judge by the set's newest version",
                                    help_text="Without it the version pinned stays: a version saved later (by "
                                              "anyone who may edit sets) changes nothing until an admin pins it.")
    min_pass_rate = forms.FloatField(min_value=0.01, max_value=1, initial=0.9, label="Pass rate needed",
                                     help_text="Of the set's cases, and of the shadow copies (0.9: nine in ten).")
    max_drop = forms.FloatField(min_value=0, max_value=1, initial=0.05, label="Less than the route, at most",
                                help_text="How much smaller a share of the set a candidate may pass than the route "
                                          "itself (0.05: five points).")
    min_shadow_copies = forms.IntegerField(min_value=0, max_value=100_000, initial=20, label="Shadow copies needed",
                                           help_text="0: the set alone decides.")
    start_canary = forms.BooleanField(required=False, label="Start a canary of the proposed candidate by itself "
                                                            "(its guards then promote or roll back)")

    def __init__(self, *args, route, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["eval_set"].queryset = EvalSet.objects.filter(team=route.team_id)


def _route(request, route_id):
    return get_object_or_404(Route, pk=route_id, team=request.team)


def _page(request, route, form=None, status=200):
    autopilot = autopilot_for(route)
    return render(request, "evaluations/autopilot.html", {
        "route": route, "autopilot": autopilot, "review": autopilot_review(autopilot),
        "form": form or AutopilotForm(route=route, initial={
            "eval_set": autopilot.eval_set_id, "min_pass_rate": autopilot.min_pass_rate, "max_drop": autopilot.max_drop,
            "min_shadow_copies": autopilot.min_shadow_copies, "start_canary": autopilot.start_canary}),
        "can_manage": may(request.membership, "autopilot.manage"),
        "can_canary": may(request.membership, "canaries.run")}, status=status)


@team_view("evaluations.view")
def route_autopilot(request, route_id):
    return _page(request, _route(request, route_id))


@require_POST
@team_view("autopilot.manage")
def route_autopilot_settings(request, route_id):
    route = _route(request, route_id)
    form = AutopilotForm(request.POST, route=route)
    if form.is_valid():
        data = form.cleaned_data
        try:
            autopilot_save(route=route, user=request.user, eval_set=data["eval_set"],
                           min_pass_rate=data["min_pass_rate"], min_shadow_copies=data["min_shadow_copies"],
                           max_drop=data["max_drop"], pin_newest=data["pin_newest"],
                           start_canary=data["start_canary"], request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            messages.success(request, "Autopilot saved.")
            return redirect("route_autopilot", route_id=route.pk)
    return _page(request, route, form=form, status=400)


@require_POST
@team_view("autopilot.manage")
def route_autopilot_review(request, route_id):
    route = _route(request, route_id)
    autopilot = autopilot_for(route)
    if autopilot.pk is None or autopilot.eval_set is None:
        messages.error(request, "Pick the evaluation set first.")
    else:
        queued = autopilot_recheck(autopilot)
        review = autopilot_act(autopilot, request=request, actor=request.user)
        rerun = (" Re-running the set on " + ", ".join(run.candidate.get("label", "") for run in queued)
                 + " (its deployment changed since it was judged).") if queued else ""
        messages.info(request, review.words + rerun)
    return redirect("route_autopilot", route_id=route.pk)


@team_view("evaluations.view")
def route_autopilot_csv(request, route_id):
    """The candidates with their evidence, one row each, for a spreadsheet."""
    route = _route(request, route_id)
    review = autopilot_review(autopilot_for(route))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="autopilot-{route.pk}.csv"'
    writer = csv.writer(response)
    writer.writerow(csv_row(["candidate", "set_passed", "set_cases", "set_pass_rate", "cost_per_accepted",
                             "shadow_mirrored", "shadow_passed", "shadow_mean_agreement", "shadow_p50_ms", "quality",
                             "verdict"]))
    for candidate in review.candidates:
        result = candidate.run.result if candidate.run else {}
        shadow = candidate.shadow or {}
        verdict = ("proposed" if candidate is review.proposal else "passes" if candidate.qualifies
                   else "; ".join(candidate.reasons))
        writer.writerow(csv_row([  # a channel's or route's name may start with "=": a spreadsheet must not run it
            candidate.label, result.get("passed", ""), result.get("cases", ""), result.get("pass_rate", ""),
            result.get("cost_per_accepted", ""), shadow.get("mirrored", ""), shadow.get("passed", ""),
            "" if shadow.get("mean_similarity") is None else f"{shadow['mean_similarity']:.3f}",
            "" if shadow.get("p50_ms") is None else f"{shadow['p50_ms']:.0f}", candidate.quality, verdict]))
    return response
