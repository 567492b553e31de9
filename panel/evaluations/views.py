"""The Evaluations pages: the team's sets, a new set from JSONL (pasted or uploaded) or the starter set, a set with its
cases and versions, a new version, the JSONL of any version."""
from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.roles import may
from panel.compare.services import column_choices
from panel.core.forms import errors_into
from panel.evaluations.checks import describe
from panel.evaluations.models import EvalRun, sets_readable
from panel.evaluations.runs import candidates_ranked, eval_run_launch
from panel.evaluations.services import eval_set_create, eval_set_delete, eval_set_revise, starter_set_add
from panel.evaluations.sets import MAX_BYTES, cases_jsonl

JSONL_HELP = ("One case per line: {\"prompt\": \"...\", \"checks\": [{\"type\": \"json\"}]}. Checks: json, "
              "json_schema, regex, contains, exact, agrees (with a reference channel), judge (by a judge channel). "
              "Nothing is saved unless every line reads.")


class EvalSetForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name")
    description = forms.CharField(required=False, max_length=2000, label="Description",
                                  widget=forms.Textarea(attrs={"rows": 2}))
    cases = forms.CharField(required=False, label="Cases (JSONL)", help_text=JSONL_HELP,
                            widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}))
    file = forms.FileField(required=False, label="…or upload a .jsonl file")

    def text(self):
        upload = self.cleaned_data.get("file")
        return upload.read(MAX_BYTES + 1) if upload else self.cleaned_data.get("cases", "")


class RunForm(forms.Form):
    candidate = forms.ChoiceField(label="Candidate", help_text="A channel, or a route as its clients see it. Each "
                                  "answer is a request like any other: it shows on the dashboards and costs what "
                                  "the channel costs.")

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["candidate"].choices = [(choice["key"], choice["label"]) for choice in column_choices(team=team)]


class RevisionForm(forms.Form):
    cases = forms.CharField(label="Cases (JSONL)", help_text=JSONL_HELP,
                            widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}))
    note = forms.CharField(required=False, max_length=300, label="What changed")


@team_view("evaluations.view")
def evaluations(request):
    sets = [(eval_set, eval_set.current()) for eval_set in sets_readable(request.membership)]
    return render(request, "evaluations/list.html", {"sets": sets,
                                                     "can_edit": may(request.membership, "evaluations.edit")})


@team_view("evaluations.edit")
def eval_set_new(request):
    form = EvalSetForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            eval_set = eval_set_create(team=request.team, user=request.user, name=form.cleaned_data["name"],
                                       description=form.cleaned_data["description"], text=form.text(),
                                       request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            messages.success(request, f"Saved {eval_set.name}: {len(eval_set.current().cases)} cases.")
            return redirect("eval_set_detail", set_id=eval_set.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "evaluations/new.html", {"form": form}, status=status)


@require_POST
@team_view("evaluations.edit")
def eval_set_starter(request):
    eval_set = starter_set_add(team=request.team, user=request.user, request=request)
    messages.success(request, f"Added {eval_set.name}.")
    return redirect("eval_set_detail", set_id=eval_set.pk)


def _set(request, set_id):
    return get_object_or_404(sets_readable(request.membership), pk=set_id)


def _detail(request, eval_set, form=None, run_form=None, status=200):
    current = eval_set.current()
    rows = [(case, [describe(check) for check in case["checks"]]) for case in current.cases]
    form = form or RevisionForm(initial={"cases": cases_jsonl(current.cases)})
    return render(request, "evaluations/detail.html", {
        "eval_set": eval_set, "current": current, "rows": rows, "form": form,
        "run_form": run_form or RunForm(team=request.team), "ranked": candidates_ranked(current),
        "runs": EvalRun.objects.filter(eval_version__eval_set=eval_set).select_related("eval_version")[:20],
        "versions": eval_set.versions.select_related("created_by"),
        "can_edit": may(request.membership, "evaluations.edit"),
        "can_run": may(request.membership, "evaluations.run")}, status=status)


@team_view("evaluations.view")
def eval_set_detail(request, set_id):
    return _detail(request, _set(request, set_id))


@require_POST
@team_view("evaluations.edit")
def eval_set_revise_view(request, set_id):
    eval_set = _set(request, set_id)
    form = RevisionForm(request.POST)
    if form.is_valid():
        before = eval_set.current().number
        try:
            version = eval_set_revise(eval_set=eval_set, user=request.user, text=form.cleaned_data["cases"],
                                      note=form.cleaned_data["note"], request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            if version.number == before:
                messages.info(request, "The cases are the same as the current version's: no new version.")
            else:
                messages.success(request, f"Saved version {version.number}: {len(version.cases)} cases.")
            return redirect("eval_set_detail", set_id=eval_set.pk)
    return _detail(request, eval_set, form, status=400)


@require_POST
@team_view("evaluations.run")
def eval_run_start(request, set_id):
    eval_set = _set(request, set_id)
    form = RunForm(request.POST, team=request.team)
    if form.is_valid():
        try:
            run = eval_run_launch(team=request.team, user=request.user, eval_set=eval_set,
                                  candidate=form.cleaned_data["candidate"])
        except ValidationError as error:
            errors_into(form, error)
        else:
            return redirect("eval_run_detail", run_id=run.pk)
    return _detail(request, eval_set, run_form=form, status=400)


@team_view("evaluations.view")
def eval_run_detail(request, run_id):
    return render(request, "evaluations/run.html", _run_context(request, run_id))


@team_view("evaluations.view")
def eval_run_live(request, run_id):
    """The run's state, summary and answered cases, re-rendered while it runs (static/js/live.js)."""
    return render(request, "evaluations/_run_live.html", _run_context(request, run_id))


def _run_context(request, run_id):
    run = get_object_or_404(EvalRun.objects.select_related("eval_version__eval_set"), pk=run_id, team=request.team,
                            eval_version__eval_set__in=sets_readable(request.membership))
    cases = {case["id"]: case for case in run.eval_version.cases}
    lines = [(line, cases.get(line["id"], {})) for line in run.results]
    return {"run": run, "lines": lines, "summary": run.result or {}}


@require_POST
@team_view("evaluations.edit")
def eval_set_delete_view(request, set_id):
    eval_set = _set(request, set_id)
    name = eval_set.name
    eval_set_delete(eval_set=eval_set, user=request.user, request=request)
    messages.success(request, f"Deleted {name} and its versions.")
    return redirect("evaluations")


@team_view("evaluations.view")
def eval_set_download(request, set_id, number):
    version = get_object_or_404(_set(request, set_id).versions, number=number)
    response = HttpResponse(cases_jsonl(version.cases), content_type="application/jsonl; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="evaluation-set-{set_id}-v{number}.jsonl"'
    return response
