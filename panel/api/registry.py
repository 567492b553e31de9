"""Models, their quantization jobs and quality reports (as on Models and Quantization): register, read, quantize,
follow a job, cancel it, read its result (the quantized child model), measure a model's quality report (or a LoRA
adapter's on it, against the model alone), and check a model as a model again (Re-check)."""
import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, text_file, validated
from panel.api.schemas import JobEventOut, JobOut, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_cancel, job_events
from panel.registry import memory
from panel.registry.forms import EvaluationForm, ModelRegisterForm, QuantizationForm
from panel.registry.model_check import model_check_launch
from panel.registry.models import EvaluationJob, ModelCheckJob, QuantizationJob, RegisteredModel
from panel.registry.quality import evaluation_audit_name, evaluation_from_form
from panel.registry.services import model_register, quantization_cancel, quantization_from_form, quantization_refusal

router = Router(tags=["models and quantization"])


class ModelOut(Schema):
    id: int
    name: str
    path: str
    hub_id: str
    parent_id: int | None
    architecture: str
    model_type: str
    parameter_count: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    hidden_size: int
    max_position_embeddings: int
    dtype: str
    size_bytes: int
    quantization: dict[str, Any]
    state: str = Field(description="ready, or broken: it failed its check as a model (it cannot be served or "
                                   "quantized until a re-check passes).")
    created_at: datetime.datetime


class ModelDetail(ModelOut):
    memory: dict[str, Any]
    quantization_refused: str | None
    check_figures: dict[str, Any] = Field(description="Its last check as a model: perplexity, the greedy answer, "
                                                      "the bound and the problems found (empty: never checked).")


ModelRegister = schema_from_form(ModelRegisterForm, "ModelRegister")
QuantizationLaunch = schema_from_form(QuantizationForm, "QuantizationLaunch", extra={
    "calibration_text": (str | None, Field(None, max_length=2_000_000, description=(
        "For calibration \"file\": the calibration text itself (a request body is at most TOKENWISE_MAX_FORM_BYTES, "
        "2.5 MB; upload a larger file on the page).")))})


class QuantizationJobOut(JobOut):
    source_id: int
    source: str
    host_id: int | None
    scheme: str
    backend: str
    q_group_size: int
    zero_point: bool
    version: str
    w_bit: int
    calibration: str
    max_calib_samples: int
    max_calib_seq_len: int
    result: dict[str, Any]
    result_model_id: int | None


class QuantizationJobDetail(QuantizationJobOut):
    log_tail: str
    events: list[JobEventOut]


def model_out(model):
    return {name: getattr(model, name) for name in ModelOut.model_fields}


def job_out(job, *, detail=False):
    out = {name: getattr(job, name) for name in QuantizationJobOut.model_fields if name != "source"}
    out["source"] = job.source.name
    if detail:
        out.update(log_tail=job.log_tail, events=job_events_out(job_events(job)))
    return out


def _jobs(request):
    return QuantizationJob.objects.filter(team=request.team).select_related("source")


@router.get("/models", auth=gate("models.view"), response=errors({200: list[ModelOut]}))
def models_list(request):
    return [model_out(model) for model in RegisteredModel.objects.filter(team=request.team).order_by("name")]


@router.get("/models/{model_id}", auth=gate("models.view"), response=errors({200: ModelDetail}),
            summary="A model with its memory estimate (weights per precision, KV cache per token, what fits where)")
def models_get(request, model_id: int):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    return {**model_out(model), "memory": memory.estimate(model), "quantization_refused": quantization_refusal(model),
            "check_figures": model.check_figures}


@router.post("/models", auth=gate("models.register"), response=errors({201: ModelOut}),
             summary="Register a checkpoint folder or a hub id that is in the local cache (no download)")
def models_register(request, body: ModelRegister):
    data = validated(ModelRegisterForm, body).cleaned_data
    try:
        model = model_register(team=request.team, user=request.user, source=data["source"], name=data["name"])
    except ValidationError as error:
        raise Invalid({"source": error.messages}) from None  # where the page shows it
    return Status(201, model_out(model))


@router.get("/quantization-jobs", auth=gate("models.view"), response=errors({200: list[QuantizationJobOut]}))
def quantization_list(request):
    return [job_out(job) for job in _jobs(request)[:200]]


@router.get("/quantization-jobs/{job_id}", auth=gate("models.view"), response=errors({200: QuantizationJobDetail}),
            summary="A job's progress, phase, log tail, history and result")
def quantization_get(request, job_id: int):
    return job_out(get_object_or_404(_jobs(request), pk=job_id), detail=True)


@router.post("/models/{model_id}/quantize", auth=gate("models.quantize"), response=errors({201: QuantizationJobOut}),
             summary="Quantize a model on a GPU worker (a scheme, its backend, calibration)")
def quantization_launch_op(request, model_id: int, body: QuantizationLaunch):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    refusal = quantization_refusal(model)
    if refusal is not None:
        raise Invalid({"__all__": [refusal]})
    text = body.calibration_text
    form = validated(QuantizationForm, body.dict(exclude={"calibration_text"}, exclude_unset=True), model=model,
                     files={"calibration_file": text_file("calibration.txt", text)} if text else None)
    job = quantization_from_form(team=request.team, user=request.user, model=model, form=form)
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"quantization #{job.pk} of {model.name}")
    return Status(201, job_out(job))


EvaluationLaunch = schema_from_form(EvaluationForm, "EvaluationLaunch", extra={
    "prompt_text": (str | None, Field(None, max_length=2_000_000,
                                      description="Your own prompts: the JSONL file's content (optional)."))})


class EvaluationJobOut(JobOut):
    model_id: int
    baseline_id: int | None
    adapter_id: int | None = Field(description="The LoRA adapter measured on the model, against the model alone.")
    host_id: int | None
    inputs_key: str
    result: dict[str, Any] = Field(description="The measured report (perplexity, agreement, JSON validity) once done.")


class EvaluationJobDetail(EvaluationJobOut):
    log_tail: str
    events: list[JobEventOut]


def evaluation_out(job, *, detail=False):
    out = {name: getattr(job, name) for name in EvaluationJobOut.model_fields}
    if detail:
        out.update(log_tail=job.log_tail, events=job_events_out(job_events(job)))
    return out


@router.post("/models/{model_id}/evaluate", auth=gate("models.evaluate"), response=errors({201: EvaluationJobOut}),
             summary="A quality report: measure the model against its parent (or another model), or the model with "
                     "one of its LoRA adapters applied against the model alone, on a GPU worker")
def evaluation_launch_op(request, model_id: int, body: EvaluationLaunch):
    model = get_object_or_404(RegisteredModel.objects.select_related("parent"), pk=model_id, team=request.team)
    text = body.prompt_text
    form = validated(EvaluationForm, body.dict(exclude={"prompt_text"}, exclude_unset=True), model=model,
                     files={"prompt_file": text_file("prompts.jsonl", text)} if text else None)
    job = evaluation_from_form(team=request.team, user=request.user, model=model, form=form)
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=evaluation_audit_name(job))
    return Status(201, evaluation_out(job))


@router.get("/quality-jobs/{job_id}", auth=gate("models.view"), response=errors({200: EvaluationJobDetail}),
            summary="A quality report job: progress, history and the measured report")
def evaluation_get(request, job_id: int):
    job = get_object_or_404(EvaluationJob.objects.filter(team=request.team), pk=job_id)
    return evaluation_out(job, detail=True)


@router.post("/quality-jobs/{job_id}/cancel", auth=gate("models.evaluate"), response=errors({200: EvaluationJobOut}))
def evaluation_cancel_op(request, job_id: int):
    job = get_object_or_404(EvaluationJob.objects.filter(team=request.team), pk=job_id)
    if job_cancel(job, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=evaluation_audit_name(job))
    return evaluation_out(get_object_or_404(EvaluationJob.objects.filter(team=request.team), pk=job_id))


@router.post("/quantization-jobs/{job_id}/cancel", auth=gate("models.quantize"),
             response=errors({200: QuantizationJobOut}))
def quantization_cancel_op(request, job_id: int):
    job = get_object_or_404(_jobs(request), pk=job_id)
    if quantization_cancel(job=job, user=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"quantization #{job.pk}")
    return job_out(get_object_or_404(_jobs(request), pk=job_id))


class ModelCheckJobOut(JobOut):
    model_id: int
    result: dict[str, Any] = Field(description="Once done: the figures, the problems found, model_state (ready or "
                                               "broken) and previous_state.")


class ModelCheckJobDetail(ModelCheckJobOut):
    log_tail: str
    events: list[JobEventOut]


def check_out(job, *, detail=False):
    out = {name: getattr(job, name) for name in ModelCheckJobOut.model_fields}
    if detail:
        out.update(log_tail=job.log_tail, events=job_events_out(job_events(job)))
    return out


@router.post("/models/{model_id}/check", auth=gate("models.register"), response=errors({201: ModelCheckJobOut}),
             summary="Re-check: check a model as a model again on a GPU worker (perplexity, a greedy answer); its "
                     "state becomes ready or broken when the check ends")
def model_check_op(request, model_id: int):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    job = model_check_launch(team=request.team, user=request.user, model=model)
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"check #{job.pk} of {model.name}")
    return Status(201, check_out(job))


@router.get("/model-checks/{job_id}", auth=gate("models.view"), response=errors({200: ModelCheckJobDetail}),
            summary="A model check: progress, history and, once done, the figures and the model's new state")
def model_check_get(request, job_id: int):
    return check_out(get_object_or_404(ModelCheckJob.objects.filter(team=request.team), pk=job_id), detail=True)
