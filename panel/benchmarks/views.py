from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.models import Role
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.benchmarks import ladder as ladders
from panel.benchmarks import services
from panel.benchmarks.forms import BenchmarkForm, LadderForm, SweepForm
from panel.benchmarks.launch import ladder_from_form, sweep_from_form
from panel.benchmarks.models import BenchmarkRun, Ladder, Sweep
from panel.jobs.services import job_cancel, job_events

MAX_COMPARED = 6


def _home(request, *, form=None, status=200):
    team = request.team
    context = {"form": form or BenchmarkForm(team=team),
               "runs": BenchmarkRun.objects.filter(team=team).order_by("-created_at")[:100],
               "ladders": Ladder.objects.filter(team=team).select_related("model")[:20],
               "sweeps": Sweep.objects.filter(team=team).select_related("profile")[:20]}
    return render(request, "benchmarks/home.html", context, status=status)


def _form_errors(form, error):
    by_field = error.message_dict if hasattr(error, "error_dict") else {None: error.messages}
    for field, problems in by_field.items():
        form.add_error(field if field in form.fields else None, problems)


@team_view()
def home(request):
    return _home(request)


@team_view(Role.MEMBER)
def run_create(request):
    if request.method != "POST":
        return redirect("benchmarks")
    form = BenchmarkForm(request.POST, request.FILES, team=request.team)
    if form.is_valid():
        kind, pk = form.cleaned_data["target"]
        try:
            run = services.benchmark_launch(team=request.team, user=request.user, target_kind=kind, target_id=pk,
                                            name=form.cleaned_data["name"], **form.workload_values())
        except ValidationError as error:
            _form_errors(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"benchmark #{run.pk}",
                         of=run.target_label)
            return redirect("benchmark_run", run_id=run.pk)
    return _home(request, form=form, status=400)


@team_view()
def run_detail(request, run_id):
    run = get_object_or_404(BenchmarkRun, pk=run_id, team=request.team)
    return render(request, "benchmarks/run_detail.html", {"run": run, "events": job_events(run)})


@team_view()
def run_live(request, run_id):
    run = get_object_or_404(BenchmarkRun, pk=run_id, team=request.team)
    return render(request, "benchmarks/_run_live.html", {"run": run, "events": job_events(run)})


@require_POST
@team_view(Role.MEMBER)
def job_cancel_view(request, kind, job_id):
    model = {"run": BenchmarkRun, "ladder": Ladder, "sweep": Sweep}.get(kind)
    if model is None:
        return HttpResponseBadRequest("Unknown kind: use run, ladder or sweep.")
    job = get_object_or_404(model, pk=job_id, team=request.team)
    if job_cancel(job, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"{kind} #{job.pk}")
        messages.info(request, "Cancelling: it stops within a few seconds (a running deployment is stopped).")
    else:
        messages.error(request, f"It is already {job.get_state_display().lower()}.")
    return redirect({"run": "benchmark_run", "ladder": "benchmark_ladder", "sweep": "benchmark_sweep"}[kind], job.pk)


@team_view()
def compare(request):
    raw = request.GET.getlist("run")
    try:
        ids = [int(value) for value in raw]
    except ValueError:
        return HttpResponseBadRequest("run must be a run number, e.g. ?run=3&run=4.")
    if not 2 <= len(set(ids)) <= MAX_COMPARED:
        return HttpResponseBadRequest(f"Pick 2 to {MAX_COMPARED} different runs to compare.")
    found = {run.pk: run for run in BenchmarkRun.objects.filter(team=request.team, pk__in=ids)}
    missing = [str(pk) for pk in ids if pk not in found]
    if missing:
        return HttpResponseBadRequest(f"No run {', '.join(missing)} in this team.")
    runs = sorted(found.values(), key=lambda run: run.pk)  # oldest first, whatever order they were ticked in
    unfinished = [f"#{run.pk}" for run in runs if run.state != "succeeded"]
    return render(request, "benchmarks/compare.html", {
        "runs": runs, "rows": services.runs_compare(runs), "unfinished": unfinished,
        "figures": [] if unfinished else services.runs_compare_figures(runs)})


@team_view(Role.MEMBER)
def ladder_create(request):
    form = LadderForm(request.POST or None, request.FILES or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            ladder = ladder_from_form(team=request.team, user=request.user, form=form)
        except ValidationError as error:
            _form_errors(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"ladder #{ladder.pk}",
                         model=ladder.model.name)
            return redirect("benchmark_ladder", ladder_id=ladder.pk)
    return render(request, "benchmarks/ladder_form.html", {"form": form},
                  status=400 if request.method == "POST" else 200)


def _ladder_context(ladder):
    rows = ladders.ladder_table(ladder)
    return {"ladder": ladder, "rows": rows, "price": ladders.ladder_price(ladder), "events": job_events(ladder),
            "figure": ladders.ladder_figure(rows) if ladder.is_final and any(r.get("throughput") for r in rows)
            else None}


@team_view()
def ladder_detail(request, ladder_id):
    ladder = get_object_or_404(Ladder.objects.select_related("model", "host"), pk=ladder_id, team=request.team)
    return render(request, "benchmarks/ladder_detail.html", _ladder_context(ladder))


@team_view()
def ladder_live(request, ladder_id):
    ladder = get_object_or_404(Ladder.objects.select_related("model", "host"), pk=ladder_id, team=request.team)
    return render(request, "benchmarks/_ladder_live.html", _ladder_context(ladder))


@team_view(Role.MEMBER)
def sweep_create(request):
    form = SweepForm(request.POST or None, request.FILES or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            sweep = sweep_from_form(team=request.team, user=request.user, form=form)
        except ValidationError as error:
            _form_errors(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"sweep #{sweep.pk}",
                         profile=sweep.profile.name, values=sweep.values)
            return redirect("benchmark_sweep", sweep_id=sweep.pk)
    return render(request, "benchmarks/sweep_form.html", {"form": form},
                  status=400 if request.method == "POST" else 200)


def _sweep_context(sweep):
    points = ladders.sweep_points(sweep)
    return {"sweep": sweep, "points": points, "outcomes": (sweep.result or {}).get("points", []),
            "events": job_events(sweep), "figure": ladders.sweep_figure(sweep) if sweep.is_final and points else None}


@team_view()
def sweep_detail(request, sweep_id):
    sweep = get_object_or_404(Sweep.objects.select_related("profile__model", "host"), pk=sweep_id, team=request.team)
    return render(request, "benchmarks/sweep_detail.html", _sweep_context(sweep))


@team_view()
def sweep_live(request, sweep_id):
    sweep = get_object_or_404(Sweep.objects.select_related("profile__model", "host"), pk=sweep_id, team=request.team)
    return render(request, "benchmarks/_sweep_live.html", _sweep_context(sweep))
