"""Benchmark runs (as on Benchmarks): start one against a ready deployment, a channel or a route, follow it, cancel
it, and read its results (in `vllm bench serve`'s terms and key names: throughput, goodput, TTFT, TPOT, ITL and
E2EL mean/median/std/P90/P99; errors by kind)."""
from typing import Any

from django.shortcuts import get_object_or_404
from ninja import Field, Router, Status

from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import schema_from_form, text_file, validated
from panel.api.schemas import JobEventOut, JobOut, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.benchmarks import services
from panel.benchmarks.forms import BenchmarkForm
from panel.benchmarks.models import BenchmarkRun
from panel.jobs.services import job_cancel, job_events

router = Router(tags=["benchmarks"])

BenchmarkStart = schema_from_form(BenchmarkForm, "BenchmarkStart", extra={
    "target": (str, Field(..., pattern=r"^(deployment|channel|route):[0-9]{1,15}$", max_length=40,
                          description="deployment:<id> (ready), channel:<id> (enabled) or route:<id> of this team.")),
    "prompts_text": (str | None, Field(None, max_length=2_000_000,
                                       description="For workload \"file\": the JSONL or text file's content."))})


class BenchmarkOut(JobOut):
    name: str
    target_kind: str
    target_label: str
    workload: str
    workload_summary: str
    result: dict[str, Any] = Field(description="The measured summary once the run has finished, under the keys "
                                                   "`vllm bench serve --save-result` uses (mean_ttft_ms, ...).")


class BenchmarkDetail(BenchmarkOut):
    log_tail: str
    events: list[JobEventOut]


def run_out(run, *, detail=False):
    out = {name: getattr(run, name) for name in BenchmarkOut.model_fields}
    if detail:
        out.update(log_tail=run.log_tail, events=job_events_out(job_events(run)))
    return out


def _runs(request):
    return BenchmarkRun.objects.filter(team=request.team)


@router.get("/benchmarks", auth=gate("benchmarks.view"), response=errors({200: list[BenchmarkOut]}))
def benchmarks_list(request):
    return [run_out(run) for run in _runs(request).order_by("-created_at")[:200]]


@router.get("/benchmarks/{run_id}", auth=gate("benchmarks.view"), response=errors({200: BenchmarkDetail}))
def benchmarks_get(request, run_id: int):
    return run_out(get_object_or_404(_runs(request), pk=run_id), detail=True)


@router.post("/benchmarks", auth=gate("benchmarks.run"), response=errors({201: BenchmarkOut}, long_run=True))
def benchmarks_start(request, body: BenchmarkStart):
    text = body.prompts_text
    form = validated(BenchmarkForm, body.dict(exclude={"prompts_text"}, exclude_unset=True), team=request.team,
                     files={"prompts_file": text_file("prompts.jsonl", text)} if text else None)
    kind, pk = form.cleaned_data["target"]
    run = services.benchmark_launch(team=request.team, user=request.user, target_kind=kind, target_id=pk,
                                    name=form.cleaned_data["name"], **form.workload_values())
    audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"benchmark #{run.pk}",
                 of=run.target_label)
    return Status(201, run_out(run))


@router.post("/benchmarks/{run_id}/cancel", auth=gate("benchmarks.run"), response=errors({200: BenchmarkOut}))
def benchmarks_cancel(request, run_id: int):
    run = get_object_or_404(_runs(request), pk=run_id)
    if job_cancel(run, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"run #{run.pk}")
    return run_out(get_object_or_404(_runs(request), pk=run_id))
