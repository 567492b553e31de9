"""LoRA adapters (as on a model's page, a profile's and a deployment's, [0098]): register one on its base model (a
PEFT folder or a pip package, checked against the base), list and remove them, set a profile's LoRA settings, and
load or unload an adapter in a ready deployment's engine at run time."""
import datetime

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.accounts.decorators import maker_check
from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, validated
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.registry.adapters import adapter_audit_name, adapter_delete, adapter_register, adapters_of
from panel.registry.forms import AdapterRegisterForm
from panel.registry.models import LoraAdapter, RegisteredModel
from panel.serving.adapters import adapter_audit_target, adapter_load, adapter_unload, profile_lora_set
from panel.serving.models import Deployment, ServingProfile

router = Router(tags=["LoRA adapters"])

AdapterRegister = schema_from_form(AdapterRegisterForm, "AdapterRegister")


class AdapterOut(Schema):
    id: int
    name: str
    served_name: str = Field(description="The `model` clients send for it: the name of its route.")
    base_id: int
    path: str
    source: str
    rank: int
    alpha: float | None
    target_modules: list[str]
    hidden_size: int
    size_bytes: int
    created_at: datetime.datetime


class ProfileLora(Schema):
    max_loras: int = Field(description="Adapters one batch runs (--max-loras); 0 turns LoRA off.")
    max_lora_rank: int = Field(16, description="The largest adapter rank (--max-lora-rank): 1, 8, 16, 32, 64, ...")
    adapter_ids: list[int] = Field([], description="Adapters of the profile's model its engine loads at start.")


class ProfileLoraOut(Schema):
    profile_id: int
    max_loras: int
    max_lora_rank: int
    adapter_ids: list[int]


class LoadedOut(Schema):
    deployment_id: int
    loaded: list[AdapterOut]


def adapter_out(adapter):
    return {name: getattr(adapter, name) for name in AdapterOut.model_fields}


def loaded_out(deployment):
    return {"deployment_id": deployment.pk,
            "loaded": [adapter_out(row.adapter) for row in deployment.adapters.select_related("adapter")]}


@router.get("/models/{model_id}/adapters", auth=gate("models.view"), response=errors({200: list[AdapterOut]}),
            summary="The LoRA adapters a deployment of the model may serve")
def adapters_list(request, model_id: int):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    return [adapter_out(adapter) for adapter in adapters_of(model)]


@router.post("/models/{model_id}/adapters", auth=gate("models.register"), response=errors({201: AdapterOut}),
             summary="Register a LoRA adapter on the model, checked against it (architecture, hidden size)")
def adapters_register(request, model_id: int, body: AdapterRegister):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    data = validated(AdapterRegisterForm, body).cleaned_data
    try:
        adapter = adapter_register(team=request.team, user=request.user, base=model, **data)
    except ValidationError as error:
        raise Invalid({"source": error.messages}) from None  # where the page shows it
    audit_record(action=AuditAction.ADAPTER_REGISTERED, request=request, target=adapter_audit_name(adapter))
    return Status(201, adapter_out(adapter))


@router.delete("/adapters/{adapter_id}", auth=gate("models.register"), response=errors({204: None}),
               summary="Remove an adapter's registration (its files stay)")
def adapters_delete(request, adapter_id: int):
    adapter = get_object_or_404(LoraAdapter, pk=adapter_id, team=request.team)
    try:
        adapter_delete(adapter=adapter)
    except ValidationError as error:
        raise Invalid({"__all__": error.messages}) from None
    audit_record(action=AuditAction.ADAPTER_REMOVED, request=request, target=adapter_audit_name(adapter))
    return Status(204, None)


@router.put("/profiles/{profile_id}/lora", auth=gate("profiles.edit"), response=errors({200: ProfileLoraOut}),
            summary="A profile's LoRA settings and the adapters its engine loads at start")
def profiles_lora_set(request, profile_id: int, body: ProfileLora):
    profile = get_object_or_404(ServingProfile.objects.select_related("model"), pk=profile_id, team=request.team)
    maker_check(request, "profiles.edit", profile.created_by_id, profile.not_yours("change"))
    adapters = list(LoraAdapter.objects.filter(team=request.team, pk__in=body.adapter_ids))
    if len(adapters) != len(set(body.adapter_ids)):
        raise Invalid({"adapter_ids": ["No such adapter in this team."]})
    try:
        profile_lora_set(profile=profile, max_loras=body.max_loras, max_lora_rank=body.max_lora_rank,
                         adapters=adapters)
    except ValidationError as error:
        raise Invalid({"__all__": error.messages}) from None
    return {"profile_id": profile.pk, "max_loras": profile.max_loras, "max_lora_rank": profile.max_lora_rank,
            "adapter_ids": sorted(adapter.pk for adapter in adapters)}


def _deployment_adapter(request, deployment_id, adapter_id):
    deployment = get_object_or_404(Deployment.objects.select_related("profile__model"), pk=deployment_id,
                                   team=request.team)
    maker_check(request, "deployments.run", deployment.profile.created_by_id, deployment.profile.not_yours("launch"))
    return deployment, get_object_or_404(LoraAdapter, pk=adapter_id, team=request.team)


@router.post("/deployments/{deployment_id}/adapters/{adapter_id}/load", auth=gate("deployments.run"),
             response=errors({200: LoadedOut}),
             summary="Load an adapter into the ready engine (vLLM's load endpoint) and route its served name there")
def deployments_adapter_load(request, deployment_id: int, adapter_id: int):
    deployment, adapter = _deployment_adapter(request, deployment_id, adapter_id)
    try:
        adapter_load(deployment=deployment, adapter=adapter)
    except ValidationError as error:
        raise Invalid({"__all__": error.messages}) from None
    audit_record(action=AuditAction.ADAPTER_LOADED, request=request,
                 target=adapter_audit_target(deployment, adapter))
    return loaded_out(deployment)


@router.post("/deployments/{deployment_id}/adapters/{adapter_id}/unload", auth=gate("deployments.run"),
             response=errors({200: LoadedOut}), summary="Unload an adapter from the engine; its route goes quiet")
def deployments_adapter_unload(request, deployment_id: int, adapter_id: int):
    deployment, adapter = _deployment_adapter(request, deployment_id, adapter_id)
    try:
        adapter_unload(deployment=deployment, adapter=adapter)
    except ValidationError as error:
        raise Invalid({"__all__": error.messages}) from None
    audit_record(action=AuditAction.ADAPTER_UNLOADED, request=request,
                 target=adapter_audit_target(deployment, adapter))
    return loaded_out(deployment)
