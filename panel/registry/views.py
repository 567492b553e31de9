from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_cancel as cancel_job
from panel.jobs.services import job_events
from panel.registry import memory
from panel.registry.adapters import adapter_audit_name, adapter_delete, adapter_register, adapters_of
from panel.registry.forms import AdapterRegisterForm, EvaluationForm, ModelRegisterForm, QuantizationForm
from panel.registry.model_check import model_check_launch, model_check_refusal
from panel.registry.models import EvaluationJob, LoraAdapter, QuantizationJob, RegisteredModel
from panel.registry.quality import adapter_reports, evaluation_audit_name, evaluation_from_form, quality_report
from panel.registry.services import (
    model_register,
    quantization_cancel,
    quantization_choices,
    quantization_from_form,
    quantization_refusal,
    serving_refusal,
)


@team_view("models.view")
def model_list(request):
    models = RegisteredModel.objects.filter(team=request.team).select_related("parent", "created_by")
    return render(request, "registry/model_list.html", {"models": models, "form": ModelRegisterForm()})


@require_POST
@team_view("models.register")
def model_create(request):
    form = ModelRegisterForm(request.POST)
    if form.is_valid():
        try:
            model = model_register(team=request.team, user=request.user, source=form.cleaned_data["source"],
                                   name=form.cleaned_data["name"])
        except ValidationError as error:
            form.add_error("source", error)
        else:
            checking = model.check_jobs.exists()
            messages.success(request, f"Registered {model.name}." + (
                " It is being checked as a model on a GPU worker (a perplexity and a greedy answer): this page "
                "shows the outcome." if checking else ""))
            return redirect("model_detail", model_id=model.pk)
    models = RegisteredModel.objects.filter(team=request.team).select_related("parent", "created_by")
    return render(request, "registry/model_list.html", {"models": models, "form": form}, status=400)


def _detail_context(request, model, evaluation_form, adapter_form=None, adapter_report_form=None):
    adapters = adapters_of(model).select_related("base")
    return {
        "adapters": adapters,
        "adapter_form": adapter_form or AdapterRegisterForm(),
        "adapter_reports": adapter_reports(model, adapters),
        "adapter_report_form": adapter_report_form,
        "can_evaluate": may(request.membership, "models.evaluate"),
        "can_register": may(request.membership, "models.register"),
        "model": model,
        "estimate": memory.estimate(model),
        "children": model.children.filter(team=request.team).order_by("name"),
        "jobs": model.quantization_jobs.order_by("-created_at")[:10],
        "refusal": quantization_refusal(model),
        "can_serve": may(request.membership, "profiles.edit"),
        "serving_refusal": serving_refusal(model),
        "report": quality_report(model),
        "evaluation_form": evaluation_form,
        **_check_context(request, model),
    }


def _check_context(request, model):
    return {"model": model, "check_job": model.check_jobs.first(), "check_refusal": model_check_refusal(model),
            "can_check": may(request.membership, "models.register")}


@team_view("models.view")
def model_detail(request, model_id):
    model = get_object_or_404(RegisteredModel.objects.select_related("parent"), pk=model_id, team=request.team)
    return render(request, "registry/model_detail.html", _detail_context(request, model, EvaluationForm(model=model)))


@require_POST
@team_view("models.register")
def adapter_create(request, model_id):
    model = get_object_or_404(RegisteredModel.objects.select_related("parent"), pk=model_id, team=request.team)
    form = AdapterRegisterForm(request.POST)
    if form.is_valid():
        try:
            adapter = adapter_register(team=request.team, user=request.user, base=model, **form.cleaned_data)
        except ValidationError as error:
            form.add_error("source", error)
        else:
            audit_record(action=AuditAction.ADAPTER_REGISTERED, request=request, target=adapter_audit_name(adapter))
            messages.success(request, f"Registered the adapter {adapter.name}, served as {adapter.served_name}.")
            return redirect(f"{reverse('model_detail', args=[model.pk])}#adapters")
    context = _detail_context(request, model, EvaluationForm(model=model), adapter_form=form)
    return render(request, "registry/model_detail.html", context, status=400)


@require_POST
@team_view("models.register")
def adapter_remove(request, model_id, adapter_id):
    adapter = get_object_or_404(LoraAdapter, pk=adapter_id, base_id=model_id, team=request.team)
    try:
        adapter_delete(adapter=adapter)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        audit_record(action=AuditAction.ADAPTER_REMOVED, request=request, target=adapter_audit_name(adapter))
        messages.success(request, f"Removed the adapter {adapter.name} (its files stay where they are).")
    return redirect(f"{reverse('model_detail', args=[model_id])}#adapters")


@require_POST
@team_view("models.register")
def model_check_create(request, model_id):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    try:
        job = model_check_launch(team=request.team, user=request.user, model=model)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"check #{job.pk} of {model.name}")
        messages.info(request, f"Re-check of {model.name} queued: this page shows the outcome when it ends.")
    return redirect("model_detail", model_id=model.pk)


@team_view("models.view")
def model_check_live(request, model_id):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    return render(request, "registry/_model_check.html", _check_context(request, model))


@team_view("models.view")
def job_list(request):
    jobs = QuantizationJob.objects.filter(team=request.team).select_related("source", "result_model")[:200]
    return render(request, "registry/job_list.html", {"jobs": jobs})


@team_view("models.quantize")
def job_create(request, model_id):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    refusal = quantization_refusal(model)
    form = QuantizationForm(request.POST or None, request.FILES or None, model=model)
    if request.method == "POST" and refusal is None and form.is_valid():
        try:
            job = quantization_from_form(team=request.team, user=request.user, model=model, form=form)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            audit_record(action=AuditAction.JOB_LAUNCHED, request=request,
                         target=f"quantization #{job.pk} of {model.name}")
            for warning in form.warnings:
                messages.warning(request, warning)
            return redirect("quantization_job", job_id=job.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "registry/job_form.html", {"model": model, "form": form, "refusal": refusal,
                                                      "schemes": quantization_choices(model, form)},
                  status=status)


@team_view("models.view")
def job_detail(request, job_id):
    job = get_object_or_404(QuantizationJob.objects.select_related("source", "result_model", "host"), pk=job_id,
                            team=request.team)
    return render(request, "registry/job_detail.html", {"job": job, "events": job_events(job)})


@team_view("models.view")
def job_live(request, job_id):
    job = get_object_or_404(QuantizationJob.objects.select_related("source", "result_model"), pk=job_id,
                            team=request.team)
    return render(request, "registry/_job_live.html", {"job": job, "events": job_events(job)})


@require_POST
@team_view("models.quantize")
def job_cancel(request, job_id):
    job = get_object_or_404(QuantizationJob, pk=job_id, team=request.team)
    if quantization_cancel(job=job, user=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=f"quantization #{job.pk}")
        messages.info(request, "Cancelling: the worker stops the job within a few seconds.")
    else:
        messages.error(request, f"The job is already {job.get_state_display().lower()}.")
    return redirect("quantization_job", job_id=job.pk)


@require_POST
@team_view("models.evaluate")
def evaluation_create(request, model_id):
    model = get_object_or_404(RegisteredModel.objects.select_related("parent"), pk=model_id, team=request.team)
    form = EvaluationForm(request.POST, request.FILES, model=model)
    if form.is_valid():
        try:
            job = evaluation_from_form(team=request.team, user=request.user, model=model, form=form)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=evaluation_audit_name(job))
            return redirect("evaluation_job", job_id=job.pk)
    if form.data.get("adapter"):  # an adapter's button: its words go to the adapters' section
        context = _detail_context(request, model, EvaluationForm(model=model), adapter_report_form=form)
    else:
        context = _detail_context(request, model, form)
    return render(request, "registry/model_detail.html", context, status=400)


@team_view("models.view")
def evaluation_detail(request, job_id):
    job = get_object_or_404(EvaluationJob.objects.select_related("model", "baseline", "adapter"), pk=job_id,
                            team=request.team)
    return render(request, "registry/evaluation_detail.html", {"job": job, "events": job_events(job)})


@require_POST
@team_view("models.evaluate")
def evaluation_cancel(request, job_id):
    job = get_object_or_404(EvaluationJob.objects.select_related("model", "adapter"), pk=job_id, team=request.team)
    if cancel_job(job, actor=request.user):
        audit_record(action=AuditAction.JOB_CANCELLED, request=request, target=evaluation_audit_name(job))
        messages.info(request, "Cancelling: the worker stops the measurement within a few seconds.")
    else:
        messages.error(request, f"The report is already {job.get_state_display().lower()}.")
    return redirect("evaluation_job", job_id=job.pk)


@team_view("models.view")
def evaluation_live(request, job_id):
    job = get_object_or_404(EvaluationJob.objects.select_related("model", "baseline", "adapter"), pk=job_id,
                            team=request.team)
    return render(request, "registry/_evaluation_live.html", {"job": job, "events": job_events(job)})
