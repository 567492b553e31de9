"""The GGUF import pages under Models: the form, the job's live progress, its cancel."""
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_events
from panel.registry.forms import GgufImportForm
from panel.registry.gguf_import import gguf_import_cancel, gguf_import_launch
from panel.registry.models import GgufImportJob


@team_view("models.register")
def gguf_import_create(request):
    form = GgufImportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            job = gguf_import_launch(team=request.team, user=request.user, source=form.cleaned_data["source"],
                                     name=form.cleaned_data["name"])
        except ValidationError as error:
            form.add_error("source", error)
        else:
            audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"GGUF import #{job.pk}")
            return redirect("gguf_import_job", job_id=job.pk)
    jobs = GgufImportJob.objects.filter(team=request.team).select_related("result_model")[:20]
    return render(request, "registry/gguf_import_form.html", {"form": form, "jobs": jobs},
                  status=400 if request.method == "POST" else 200)


@team_view("models.view")
def gguf_import_detail(request, job_id):
    job = get_object_or_404(GgufImportJob.objects.select_related("result_model"), pk=job_id, team=request.team)
    return render(request, "registry/gguf_import_detail.html", {"job": job, "events": job_events(job)})


@team_view("models.view")
def gguf_import_live(request, job_id):
    job = get_object_or_404(GgufImportJob.objects.select_related("result_model"), pk=job_id, team=request.team)
    return render(request, "registry/_gguf_import_live.html", {"job": job, "events": job_events(job)})


@require_POST
@team_view("models.register")
def gguf_import_stop(request, job_id):
    job = get_object_or_404(GgufImportJob, pk=job_id, team=request.team)
    if gguf_import_cancel(job=job, user=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"GGUF import #{job.pk}")
        messages.info(request, "Cancelling: the worker stops the import within a few seconds; nothing is kept.")
    else:
        messages.error(request, f"The import is already {job.get_state_display().lower()}.")
    return redirect("gguf_import_job", job_id=job.pk)
