"""A route's traffic samples (admins only: they are the team's real requests): the settings (how many a day, how long,
what is redacted), the newest samples decrypted, an evaluation set made of them, and deleting them all."""
from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.channels.models import Route
from panel.channels.sampling import route_samples_delete, route_sampling_save, sampling_words
from panel.core.forms import errors_into
from panel.evaluations.from_samples import eval_set_from_samples
from panel.usage import samples
from panel.usage.samples import sample_content

SHOWN = 50


class SamplingForm(forms.Form):
    samples_per_day = forms.IntegerField(min_value=0, max_value=samples.MAX_PER_DAY, label="Samples a day",
                                         help_text="0 keeps none. Spread over the day: at most the day's share so "
                                                   "far plus one hour's.")
    sample_retention_days = forms.IntegerField(min_value=1, max_value=samples.MAX_RETENTION_DAYS,
                                               label="Keep them for (days)")
    sample_redactions = forms.CharField(
        required=False, label="Also redact (one regular expression per line)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="Each match becomes [redacted] before the sample is stored, after the built-in patterns: "
                  + ", ".join(name for name, _ in samples.BUILT_IN_REDACTIONS) + ". For example a customer "
                  "number: CUST-\\d{6}")


class SetFromSamplesForm(forms.Form):
    name = forms.CharField(max_length=100, label="Set name",
                           help_text="A new set, or a new version of your team's set of this name.")


def _route(request, route_id):
    return get_object_or_404(Route, pk=route_id, team=request.team)


def _page(request, route, form=None, set_form=None, status=200):
    shown = [(sample, sample_content(sample)) for sample in route.samples.select_related("channel")[:SHOWN]]
    return render(request, "evaluations/samples.html", {
        "route": route, "shown": shown, "kept": route.samples.count(), "words": sampling_words(route),
        "form": form or SamplingForm(initial={"samples_per_day": route.samples_per_day,
                                              "sample_retention_days": route.sample_retention_days,
                                              "sample_redactions": route.sample_redactions}),
        "set_form": set_form or SetFromSamplesForm(initial={"name": f"{route.model_name} traffic"})},
        status=status)


@team_view("samples.manage")
def route_samples(request, route_id):
    return _page(request, _route(request, route_id))


@require_POST
@team_view("samples.manage")
def route_samples_settings(request, route_id):
    route = _route(request, route_id)
    form = SamplingForm(request.POST)
    if form.is_valid():
        try:
            route_sampling_save(route=route, user=request.user, per_day=form.cleaned_data["samples_per_day"],
                                retention_days=form.cleaned_data["sample_retention_days"],
                                redactions=form.cleaned_data["sample_redactions"], request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            messages.success(request, sampling_words(route))
            return redirect("route_samples", route_id=route.pk)
    return _page(request, route, form=form, status=400)


@require_POST
@team_view("samples.manage")
def route_samples_to_set(request, route_id):
    route = _route(request, route_id)
    form = SetFromSamplesForm(request.POST)
    if form.is_valid():
        try:
            eval_set, cases, skipped = eval_set_from_samples(route=route, user=request.user,
                                                             name=form.cleaned_data["name"], request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            left_out = "; ".join(f"{count} left out: {why}" for why, count in skipped.items())
            messages.success(request, f"{eval_set.name}: {cases} cases from the samples"
                             + (f" ({left_out})" if left_out else "") + ".")
            return redirect("eval_set_detail", set_id=eval_set.pk)
    return _page(request, route, set_form=form, status=400)


@require_POST
@team_view("samples.manage")
def route_samples_delete_view(request, route_id):
    route = _route(request, route_id)
    deleted = route_samples_delete(route=route, user=request.user, request=request)
    messages.success(request, f"Deleted {deleted} sample{'s' if deleted != 1 else ''} of {route.model_name}.")
    return redirect("route_samples", route_id=route.pk)
