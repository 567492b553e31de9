from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.models import Role
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_events
from panel.registry import memory
from panel.registry.forms import ModelRegisterForm, QuantizationForm
from panel.registry.models import CalibrationSource, QuantizationJob, RegisteredModel
from panel.registry.services import (
    calibration_store,
    model_register,
    quantization_cancel,
    quantization_launch,
    quantization_refusal,
)


@team_view()
def model_list(request):
    models = RegisteredModel.objects.filter(team=request.team).select_related("parent")
    return render(request, "registry/model_list.html", {"models": models, "form": ModelRegisterForm()})


@require_POST
@team_view(Role.MEMBER)
def model_create(request):
    form = ModelRegisterForm(request.POST)
    if form.is_valid():
        try:
            model = model_register(team=request.team, user=request.user, source=form.cleaned_data["source"],
                                   name=form.cleaned_data["name"])
        except ValidationError as error:
            form.add_error("source", error)
        else:
            messages.success(request, f"Registered {model.name}.")
            return redirect("model_detail", model_id=model.pk)
    models = RegisteredModel.objects.filter(team=request.team).select_related("parent")
    return render(request, "registry/model_list.html", {"models": models, "form": form}, status=400)


@team_view()
def model_detail(request, model_id):
    model = get_object_or_404(RegisteredModel.objects.select_related("parent"), pk=model_id, team=request.team)
    context = {
        "model": model,
        "estimate": memory.estimate(model),
        "children": model.children.filter(team=request.team).order_by("name"),
        "jobs": model.quantization_jobs.order_by("-created_at")[:10],
        "refusal": quantization_refusal(model),
    }
    return render(request, "registry/model_detail.html", context)


@team_view()
def job_list(request):
    jobs = QuantizationJob.objects.filter(team=request.team).select_related("source", "result_model")[:200]
    return render(request, "registry/job_list.html", {"jobs": jobs})


@team_view(Role.MEMBER)
def job_create(request, model_id):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    refusal = quantization_refusal(model)
    form = QuantizationForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and refusal is None and form.is_valid():
        data = form.cleaned_data
        calibration_path = ""
        if data["calibration"] == CalibrationSource.FILE:
            calibration_path = calibration_store(team=request.team, data=form.calibration_data)
        job = quantization_launch(
            team=request.team, user=request.user, source=model, host=data["host"],
            q_group_size=data["q_group_size"], zero_point=data["zero_point"], version=data["version"],
            calibration=data["calibration"], calibration_file=calibration_path,
            calibration_name=data["calibration_file"].name if data["calibration_file"] else "",
            max_calib_samples=data["max_calib_samples"], max_calib_seq_len=data["max_calib_seq_len"])
        audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"quantization #{job.pk} of {model.name}")
        for warning in form.warnings:
            messages.warning(request, warning)
        return redirect("quantization_job", job_id=job.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "registry/job_form.html", {"model": model, "form": form, "refusal": refusal},
                  status=status)


@team_view()
def job_detail(request, job_id):
    job = get_object_or_404(QuantizationJob.objects.select_related("source", "result_model", "host"), pk=job_id,
                            team=request.team)
    return render(request, "registry/job_detail.html", {"job": job, "events": job_events(job)})


@team_view()
def job_live(request, job_id):
    job = get_object_or_404(QuantizationJob.objects.select_related("source", "result_model"), pk=job_id,
                            team=request.team)
    return render(request, "registry/_job_live.html", {"job": job, "events": job_events(job)})


@require_POST
@team_view(Role.MEMBER)
def job_cancel(request, job_id):
    job = get_object_or_404(QuantizationJob, pk=job_id, team=request.team)
    if quantization_cancel(job=job, user=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"quantization #{job.pk}")
        messages.info(request, "Cancelling: the worker stops the job within a few seconds.")
    else:
        messages.error(request, f"The job is already {job.get_state_display().lower()}.")
    return redirect("quantization_job", job_id=job.pk)
