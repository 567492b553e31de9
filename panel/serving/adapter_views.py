"""The LoRA pages' actions ([0098]): a profile's LoRA settings, and an adapter loaded into or unloaded from a ready
deployment's engine at run time. Thin: the checks and the engine calls are serving/adapters.py's."""
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from panel.accounts.decorators import maker_check, team_view
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.registry.models import LoraAdapter
from panel.serving.adapters import adapter_audit_target, adapter_load, adapter_unload, profile_lora_set
from panel.serving.forms import ProfileLoraForm
from panel.serving.models import Deployment, ServingProfile


@require_POST
@team_view("profiles.edit")
def profile_lora(request, profile_id):
    profile = get_object_or_404(ServingProfile.objects.select_related("model"), pk=profile_id, team=request.team)
    maker_check(request, "profiles.edit", profile.created_by_id, profile.not_yours("change"))
    form = ProfileLoraForm(request.POST, profile=profile)
    try:
        if not form.is_valid():
            raise ValidationError([m for ms in form.errors.values() for m in ms])
        profile_lora_set(profile=profile, **form.cleaned_data)
    except ValidationError as error:
        for message in error.messages:
            messages.error(request, message)
    else:
        messages.success(request, "LoRA settings saved: a deployment launched from now on serves them.")
    return redirect("profile_detail", profile_id=profile.pk)


def _deployment_and_adapter(request, deployment_id, adapter_id):
    deployment = get_object_or_404(Deployment.objects.select_related("profile__model"), pk=deployment_id,
                                   team=request.team)
    maker_check(request, "deployments.run", deployment.profile.created_by_id, deployment.profile.not_yours("launch"))
    return deployment, get_object_or_404(LoraAdapter, pk=adapter_id, team=request.team)


@require_POST
@team_view("deployments.run")
def deployment_adapter_load(request, deployment_id):
    deployment, adapter = _deployment_and_adapter(request, deployment_id, request.POST.get("adapter") or 0)
    try:
        adapter_load(deployment=deployment, adapter=adapter)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        audit_record(action=AuditAction.ADAPTER_LOADED, request=request,
                     target=adapter_audit_target(deployment, adapter))
        messages.success(request, f"Loaded {adapter.name}: requests for {adapter.served_name} go to this engine.")
    return redirect("deployment_detail", deployment_id=deployment.pk)


@require_POST
@team_view("deployments.run")
def deployment_adapter_unload(request, deployment_id, adapter_id):
    deployment, adapter = _deployment_and_adapter(request, deployment_id, adapter_id)
    try:
        adapter_unload(deployment=deployment, adapter=adapter)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        audit_record(action=AuditAction.ADAPTER_UNLOADED, request=request,
                     target=adapter_audit_target(deployment, adapter))
        messages.success(request, f"Unloaded {adapter.name}.")
    return redirect("deployment_detail", deployment_id=deployment.pk)
