"""Config ladders and max_num_seqs sweeps (as on Benchmarks): start one, follow it step by step, cancel it, and read
its table (each step's figures, gain and cost per million tokens) or its points and the best value."""
from typing import Any

from django.shortcuts import get_object_or_404
from ninja import Field, Router, Status

from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import schema_from_form, text_file, validated
from panel.api.schemas import JobEventOut, JobOut, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.benchmarks import ladder as ladders
from panel.benchmarks.forms import LadderForm, SweepForm
from panel.benchmarks.launch import ladder_from_form, sweep_from_form
from panel.benchmarks.models import Ladder, Sweep
from panel.jobs.services import job_cancel, job_events

router = Router(tags=["benchmarks"])

PROMPTS = (str | None, Field(None, max_length=2_000_000,
                             description="For workload \"file\": the JSONL or text file's content."))
LadderStart = schema_from_form(LadderForm, "LadderStart", extra={"prompts_text": PROMPTS})
SweepStart = schema_from_form(SweepForm, "SweepStart", extra={"prompts_text": PROMPTS})


class LadderOut(JobOut):
    model_id: int
    small_max_num_seqs: int
    large_max_num_seqs: int
    max_model_len: int
    workload: str


class LadderDetail(LadderOut):
    steps: list[dict[str, Any]] = Field(description="One row per step: status, reason, the benchmark run, output "
                                                    "tokens/s, gains and cost per million output tokens.")
    log_tail: str
    events: list[JobEventOut]


class SweepOut(JobOut):
    profile_id: int
    values: list[int]
    p99_target_ms: int
    workload: str


class SweepDetail(SweepOut):
    points: list[dict[str, Any]] = Field(description="Each value's outcome (status, benchmark run).")
    best: int | None = Field(description="The max_num_seqs with the most output tokens/s within the P99 target.")
    best_reason: str
    log_tail: str
    events: list[JobEventOut]


def _step_out(row):
    run = row.get("run")
    return {"key": row["key"], "label": row["label"], "status": row["status"], "reason": row["reason"],
            "run_id": run.pk if run is not None else None, "profile_id": row["profile"].pk if row["profile"] else None,
            "output_throughput": row.get("throughput"),
            "output_throughput_range": [row.get("low"), row.get("high")] if row.get("throughput") else None,
            "noise": row.get("noise", ""), "gain_vs_previous": row.get("gain_vs_previous"),
            "gain_vs_baseline": row.get("gain_vs_baseline"), "cost_per_million": row.get("cost_per_million")}


def ladder_out(ladder, *, detail=False):
    out = {name: getattr(ladder, name) for name in LadderOut.model_fields}
    if detail:
        out.update(steps=[_step_out(row) for row in ladders.ladder_table(ladder)], log_tail=ladder.log_tail,
                   events=job_events_out(job_events(ladder)))
    return out


def sweep_out(sweep, *, detail=False):
    out = {name: getattr(sweep, name) for name in SweepOut.model_fields}
    if detail:
        result = sweep.result or {}
        out.update(points=result.get("points", []), best=result.get("best"), best_reason=result.get("best_reason", ""),
                   log_tail=sweep.log_tail, events=job_events_out(job_events(sweep)))
    return out


def _ladders(request):
    return Ladder.objects.filter(team=request.team)


def _sweeps(request):
    return Sweep.objects.filter(team=request.team)


def _form(form_class, request, body):
    text = body.prompts_text
    return validated(form_class, body.dict(exclude={"prompts_text"}, exclude_unset=True), team=request.team,
                     files={"prompts_file": text_file("prompts.jsonl", text)} if text else None)


@router.get("/ladders", auth=gate("benchmarks.view"), response=errors({200: list[LadderOut]}))
def ladders_list(request):
    return [ladder_out(ladder) for ladder in _ladders(request).order_by("-created_at")[:200]]


@router.get("/ladders/{ladder_id}", auth=gate("benchmarks.view"), response=errors({200: LadderDetail}))
def ladders_get(request, ladder_id: int):
    return ladder_out(get_object_or_404(_ladders(request), pk=ladder_id), detail=True)


@router.post("/ladders", auth=gate("benchmarks.run"), response=errors({201: LadderOut}, long_run=True),
             summary="A config ladder: one model served step by step, each step benchmarked on a GPU worker")
def ladders_start(request, body: LadderStart):
    ladder = ladder_from_form(team=request.team, user=request.user, form=_form(LadderForm, request, body))
    audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"ladder #{ladder.pk}",
                 model=ladder.model.name)
    return Status(201, ladder_out(ladder))


@router.post("/ladders/{ladder_id}/cancel", auth=gate("benchmarks.run"), response=errors({200: LadderOut}))
def ladders_cancel(request, ladder_id: int):
    ladder = get_object_or_404(_ladders(request), pk=ladder_id)
    if job_cancel(ladder, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"ladder #{ladder.pk}")
    return ladder_out(get_object_or_404(_ladders(request), pk=ladder_id))


@router.get("/sweeps", auth=gate("benchmarks.view"), response=errors({200: list[SweepOut]}))
def sweeps_list(request):
    return [sweep_out(sweep) for sweep in _sweeps(request).order_by("-created_at")[:200]]


@router.get("/sweeps/{sweep_id}", auth=gate("benchmarks.view"), response=errors({200: SweepDetail}))
def sweeps_get(request, sweep_id: int):
    return sweep_out(get_object_or_404(_sweeps(request), pk=sweep_id), detail=True)


@router.post("/sweeps", auth=gate("benchmarks.run"), response=errors({201: SweepOut}, long_run=True),
             summary="A max_num_seqs sweep: one serving profile at each value, the best within a P99 target")
def sweeps_start(request, body: SweepStart):
    sweep = sweep_from_form(team=request.team, user=request.user, form=_form(SweepForm, request, body))
    audit_record(action=AuditAction.BENCHMARK_LAUNCHED, request=request, target=f"sweep #{sweep.pk}",
                 profile=sweep.profile.name, values=sweep.values)
    return Status(201, sweep_out(sweep))


@router.post("/sweeps/{sweep_id}/cancel", auth=gate("benchmarks.run"), response=errors({200: SweepOut}))
def sweeps_cancel(request, sweep_id: int):
    sweep = get_object_or_404(_sweeps(request), pk=sweep_id)
    if job_cancel(sweep, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"sweep #{sweep.pk}")
    return sweep_out(get_object_or_404(_sweeps(request), pk=sweep_id))
