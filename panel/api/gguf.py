"""GGUF imports (as on Models → Import a GGUF file): start one from a file under a model root or a pip package,
follow it, cancel it; its result names the model, ready or broken."""
from typing import Any

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from ninja import Router, Status

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, validated
from panel.api.schemas import JobEventOut, JobOut, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_events
from panel.registry.forms import GgufImportForm
from panel.registry.gguf_import import gguf_import_cancel, gguf_import_launch
from panel.registry.models import GgufImportJob

router = Router(tags=["models and quantization"])

GgufImport = schema_from_form(GgufImportForm, "GgufImport")


class GgufImportJobOut(JobOut):
    source_kind: str
    source: str
    name: str
    result: dict[str, Any]
    result_model_id: int | None


class GgufImportJobDetail(GgufImportJobOut):
    log_tail: str
    events: list[JobEventOut]


def import_out(job, *, detail=False):
    out = {name: getattr(job, name) for name in GgufImportJobOut.model_fields}
    if detail:
        out.update(log_tail=job.log_tail, events=job_events_out(job_events(job)))
    return out


def _imports(request):
    return GgufImportJob.objects.filter(team=request.team)


@router.post("/gguf-imports", auth=gate("models.register"), response=errors({201: GgufImportJobOut}),
             summary="Import a GGUF file under a model root, or the one a pip package ships, on a GPU worker")
def gguf_import_start(request, body: GgufImport):
    data = validated(GgufImportForm, body).cleaned_data
    try:
        job = gguf_import_launch(team=request.team, user=request.user, source=data["source"], name=data["name"])
    except ValidationError as error:
        raise Invalid({"source": error.messages}) from None  # where the page shows it
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"GGUF import #{job.pk}")
    return Status(201, import_out(job))


@router.get("/gguf-imports", auth=gate("models.view"), response=errors({200: list[GgufImportJobOut]}))
def gguf_imports_list(request):
    return [import_out(job) for job in _imports(request)[:200]]


@router.get("/gguf-imports/{job_id}", auth=gate("models.view"), response=errors({200: GgufImportJobDetail}),
            summary="An import's progress, phase, log tail, history and result (the model, ready or broken)")
def gguf_imports_get(request, job_id: int):
    return import_out(get_object_or_404(_imports(request), pk=job_id), detail=True)


@router.post("/gguf-imports/{job_id}/cancel", auth=gate("models.register"), response=errors({200: GgufImportJobOut}))
def gguf_import_cancel_op(request, job_id: int):
    job = get_object_or_404(_imports(request), pk=job_id)
    if gguf_import_cancel(job=job, user=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"GGUF import #{job.pk}")
    return import_out(get_object_or_404(_imports(request), pk=job_id))
