from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.benchmarks import estimate as estimates
from panel.benchmarks import ladder as ladders
from panel.benchmarks import ownership, services, vllm_json
from panel.benchmarks.forms import BenchmarkForm, ImportForm, LadderForm, SweepForm
from panel.benchmarks.launch import ladder_from_form, sweep_from_form
from panel.benchmarks.models import BenchmarkRun, Ladder, Sweep
from panel.core.forms import errors_into
from panel.jobs.services import job_cancel, job_events

MAX_COMPARED = 6


def _home(request, *, form=None, import_form=None, status=200):
    team = request.team
    context = {"form": form or BenchmarkForm(team=team), "import_form": import_form or ImportForm(),
               "runs": BenchmarkRun.objects.filter(team=team).order_by("-created_at")[:100],
               "ladders": Ladder.objects.filter(team=team).select_related("model")[:20],
               "sweeps": Sweep.objects.filter(team=team).select_related("profile")[:20]}
    return render(request, "benchmarks/home.html", context, status=status)


@team_view("benchmarks.view")
def home(request):
    return _home(request)


@team_view("benchmarks.run")
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
            errors_into(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"benchmark #{run.pk}",
                         of=run.target_label)
            return redirect("benchmark_run", run_id=run.pk)
    return _home(request, form=form, status=400)


@team_view("benchmarks.view")
def run_detail(request, run_id):
    run = get_object_or_404(BenchmarkRun, pk=run_id, team=request.team)
    return render(request, "benchmarks/run_detail.html", {"run": run, "events": job_events(run)})


@team_view("benchmarks.view")
def run_export(request, run_id):
    run = get_object_or_404(BenchmarkRun, pk=run_id, team=request.team, state="succeeded")
    response = JsonResponse(vllm_json.export(run), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="tokenwise-run-{run.pk}-vllm-result.json"'
    return response


@team_view("benchmarks.run")
def run_import(request):
    if request.method != "POST":
        return redirect("benchmarks")
    form = ImportForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["result_file"]
        try:
            run = vllm_json.import_result(team=request.team, user=request.user, name=upload.name,
                                          data=upload.read(vllm_json.MAX_IMPORT_BYTES + 1),
                                          title=form.cleaned_data["title"])
        except ValidationError as error:
            form.add_error("result_file", error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"benchmark #{run.pk}",
                         imported_from=upload.name[:200])
            return redirect("benchmark_run", run_id=run.pk)
    return _home(request, import_form=form, status=400)


@team_view("benchmarks.view")
def run_live(request, run_id):
    run = get_object_or_404(BenchmarkRun, pk=run_id, team=request.team)
    return render(request, "benchmarks/_run_live.html", {"run": run, "events": job_events(run)})


@require_POST
@team_view("benchmarks.run")
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


@team_view("benchmarks.view")
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


@team_view("benchmarks.run")
def ladder_create(request):
    form = LadderForm(request.POST or None, request.FILES or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            ladder = ladder_from_form(team=request.team, user=request.user, form=form)
        except ValidationError as error:
            errors_into(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"ladder #{ladder.pk}",
                         model=ladder.model.name)
            if warning := ladders.shared_host_warning(ladder):
                messages.warning(request, warning)
            return redirect("benchmark_ladder", ladder_id=ladder.pk)
    return render(request, "benchmarks/ladder_form.html",
                  {"form": form, "estimate": _form_estimate(form, steps=len(ladders.STEPS), at_most=True)},
                  status=400 if request.method == "POST" else 200)


def _form_estimate(form, *, steps, at_most=False):
    """The estimate a ladder or sweep form shows for its current values (the page's script keeps it current)."""
    def value(name):
        raw = form.data.get(name) if form.is_bound else None
        try:
            return int(raw) if raw not in (None, "") else int(form.fields[name].initial or 0)
        except (TypeError, ValueError):
            return int(form.fields[name].initial or 0)

    figures = estimates.host_figures(None)
    seconds = estimates.job_estimate(figures, steps=steps, requests=value("requests"),
                                     warmup=value("warmup_requests"), repeats=value("repeats"))
    return {"figures": figures, "steps": steps, "at_most": at_most, "stop": estimates.STOP_SECONDS,
            "words": estimates.duration_words(seconds)}


def _ladder_context(ladder):
    rows = ladders.ladder_table(ladder)
    result = ladder.result or {}
    left = estimates.time_left(ladder, steps_total=result.get("planned") or len(ladders.STEPS),
                               steps_done=len([s for s in result.get("steps", []) if s.get("status") != "skipped"]))
    return {"ladder": ladder, "rows": rows, "time_left": estimates.duration_words(left),
            "price": ladders.ladder_price(ladder), "events": job_events(ladder),
            "figure": ladders.ladder_figure(rows) if ladder.is_final and any(r.get("throughput") for r in rows)
            else None}


@team_view("benchmarks.view")
def ladder_detail(request, ladder_id):
    ladder = get_object_or_404(Ladder.objects.select_related("model", "host"), pk=ladder_id, team=request.team)
    return render(request, "benchmarks/ladder_detail.html", _ladder_context(ladder))


@team_view("benchmarks.view")
def ladder_live(request, ladder_id):
    ladder = get_object_or_404(Ladder.objects.select_related("model", "host"), pk=ladder_id, team=request.team)
    return render(request, "benchmarks/_ladder_live.html", _ladder_context(ladder))


@team_view("benchmarks.run")
def sweep_create(request):
    form = SweepForm(request.POST or None, request.FILES or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            sweep = sweep_from_form(team=request.team, user=request.user, form=form)
        except ValidationError as error:
            errors_into(form, error)
        else:
            audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"sweep #{sweep.pk}",
                         profile=sweep.profile.name, values=sweep.values)
            if warning := ladders.shared_host_warning(sweep):
                messages.warning(request, warning)
            return redirect("benchmark_sweep", sweep_id=sweep.pk)
    values = (form.data.get("values") if form.is_bound else None) or form.fields["values"].initial
    steps = max(len([part for part in str(values).replace(" ", ",").split(",") if part.strip()]), 1)
    return render(request, "benchmarks/sweep_form.html", {"form": form, "estimate": _form_estimate(form, steps=steps)},
                  status=400 if request.method == "POST" else 200)


def _sweep_context(sweep):
    points = ladders.sweep_points(sweep)
    left = estimates.time_left(sweep, steps_total=len(sweep.values),
                               steps_done=len((sweep.result or {}).get("points", [])))
    return {"sweep": sweep, "points": points, "time_left": estimates.duration_words(left),
            "outcomes": (sweep.result or {}).get("points", []),
            "events": job_events(sweep), "figure": ladders.sweep_figure(sweep) if sweep.is_final and points else None}


@team_view("benchmarks.view")
def sweep_detail(request, sweep_id):
    sweep = get_object_or_404(Sweep.objects.select_related("profile__model", "host"), pk=sweep_id, team=request.team)
    return render(request, "benchmarks/sweep_detail.html", _sweep_context(sweep))


@team_view("benchmarks.view")
def sweep_live(request, sweep_id):
    sweep = get_object_or_404(Sweep.objects.select_related("profile__model", "host"), pk=sweep_id, team=request.team)
    return render(request, "benchmarks/_sweep_live.html", _sweep_context(sweep))


@require_POST
@team_view("benchmarks.run")
def job_remove_view(request, kind, job_id):
    """Remove a finished ladder or sweep with its runs and what its steps made (profiles, deployments, channels,
    routes)."""
    model = {"ladder": Ladder, "sweep": Sweep}.get(kind)
    if model is None:
        return HttpResponseBadRequest("Unknown kind: use ladder or sweep.")
    job = get_object_or_404(model, pk=job_id, team=request.team)
    label = str(job)
    try:
        ownership.job_remove(job)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect({"ladder": "benchmark_ladder", "sweep": "benchmark_sweep"}[kind], job_id)
    audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"{kind} #{job_id} removed")
    messages.info(request, f"{label} was removed with its runs, deployments, channels and routes.")
    return redirect("benchmarks")
