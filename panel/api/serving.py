"""Serving profiles and deployments (as on Serving): profiles with config.toml import/export, and deployments —
launch, status, logs, stop."""
import datetime
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.accounts.decorators import maker_check
from panel.accounts.roles import may
from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import schema_from_form, validated
from panel.api.schemas import JobEventOut, JobOut, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_events
from panel.registry.models import RegisteredModel
from panel.serving.configfile import ConfigFileError
from panel.serving.forms import PROFILE_FIELDS, ImportForm, LaunchForm, ScaleForm, ServingProfileForm
from panel.serving.models import Deployment, ScalePolicy, ServingProfile
from panel.serving.scaling import policy_off, policy_save
from panel.serving.services import (
    EXPORTS,
    deployment_launch,
    deployment_stop,
    deployment_warnings,
    launch_argv,
    profile_check,
    profile_defaults,
    profile_export_file,
    profile_import,
)

router = Router(tags=["serving profiles and deployments"])

ProfileCreate = schema_from_form(ServingProfileForm, "ProfileCreate")
ProfileChange = schema_from_form(ServingProfileForm, "ProfileChange", partial=True)
DeploymentLaunch = schema_from_form(LaunchForm, "DeploymentLaunch")
ScaleChange = schema_from_form(ScaleForm, "ScaleChange")


class ProfileOut(Schema):
    id: int
    model_id: int
    values: dict[str, Any] = Field(description="Every profile field, as on the form.")
    created_at: datetime.datetime
    updated_at: datetime.datetime


class ProfileDetail(ProfileOut):
    command: list[str]
    errors: dict[str, list[str]]
    warnings: list[str]


class ProfileImport(Schema):
    name: str = Field(..., max_length=100)
    config: str = Field(..., max_length=ImportForm.MAX_BYTES, description="The config.toml text.")


class ProfileFromModel(Schema):
    name: str = Field("", max_length=100, description="The profile's name; empty: the model's name.")


class ReplicaOut(Schema):
    id: int
    number: int
    state: str
    host: str | None
    base_url: str
    restarts: int


class ScaleOut(Schema):
    min_replicas: int
    max_replicas: int
    up_waiting: float = Field(description="Requests waiting per replica that, kept for up_after_seconds, add one.")
    up_kv_percent: float = Field(description="KV-cache use (%) that, kept for up_after_seconds, adds one.")
    up_after_seconds: int
    down_after_seconds: int = Field(description="Quiet seconds after which one replica drains and stops.")
    last_decision: str = Field(description="What the scaler last did or could not do, in words.")
    last_decision_at: datetime.datetime | None


class DeploymentOut(JobOut):
    replica_of_id: int | None = Field(description="The deployment this row is a replica of (null: the first).")
    replicas: list[ReplicaOut] = Field(description="Every replica of the deployment, the first one first.")
    scaling: ScaleOut | None = Field(description="Scale on queue (null: a fixed number of replicas).")
    profile_id: int
    profile: str
    host: str | None
    base_url: str
    served_model_name: str
    restart_on_crash: bool
    restarts: int
    ready_at: datetime.datetime | None
    verification: dict[str, Any]
    warnings: list[str]


class DeploymentLogs(Schema):
    id: int
    state: str
    log_tail: str
    events: list[JobEventOut]


def profile_out(profile, *, detail=False):
    out = {"id": profile.pk, "model_id": profile.model_id, "created_at": profile.created_at,
           "updated_at": profile.updated_at,
           "values": {name: (profile.model_id if name == "model" else getattr(profile, name))
                      for name in PROFILE_FIELDS}}
    if detail:
        verdict = profile_check(profile)
        try:
            command = launch_argv(profile, port=profile.port or 8000)
        except ConfigFileError:  # saved before one of its extra flags was refused: `errors` says why
            command = []
        out.update(command=command,
                   errors={str(field): list(messages) for field, messages in verdict.errors.items()},
                   warnings=list(verdict.warnings))
    return out


def deployment_out(deployment):
    out = {name: getattr(deployment, name) for name in DeploymentOut.model_fields
           if name not in ("profile", "host", "warnings", "replicas", "scaling")}
    out.update(profile=deployment.profile.name, host=deployment.host.host if deployment.host else None,
               warnings=list(deployment_warnings(deployment)),
               replicas=[{"id": replica.pk, "number": replica.replica_number, "state": replica.state,
                          "host": replica.host.host if replica.host else None, "base_url": replica.base_url,
                          "restarts": replica.restarts} for replica in deployment.replicas()],
               scaling=scale_out(ScalePolicy.objects.filter(deployment_id=deployment.head_id).first()))
    return out


def scale_out(policy):
    if policy is None:
        return None
    return {"min_replicas": policy.min_replicas, "max_replicas": policy.max_replicas, "up_waiting": policy.up_waiting,
            "up_kv_percent": round(policy.up_kv_cache * 100, 1), "up_after_seconds": policy.up_after_seconds,
            "down_after_seconds": policy.down_after_seconds, "last_decision": policy.last_decision,
            "last_decision_at": policy.last_decision_at}


def _profiles(request):
    return ServingProfile.objects.filter(team=request.team).select_related("model")


def _deployment(request, deployment_id):
    return get_object_or_404(Deployment.objects.select_related("profile__model", "host"), pk=deployment_id,
                             team=request.team)


@router.get("/profiles", auth=gate("serving.view"), response=errors({200: list[ProfileOut]}))
def profiles_list(request):
    return [profile_out(profile) for profile in _profiles(request).order_by("name")]


@router.post("/profiles/import", auth=gate("profiles.edit"), response=errors({201: ProfileDetail}),
             summary="Create a profile from a config.toml (everything checked; nothing saved on error)")
def profiles_import(request, body: ProfileImport):
    form = validated(ImportForm, {"name": body.name, "config": body.config})
    profile = profile_import(team=request.team, user=request.user, text=form.cleaned_data["text"],
                             name=form.cleaned_data["name"])
    return Status(201, profile_out(profile, detail=True))


@router.get("/profiles/{profile_id}", auth=gate("serving.view"), response=errors({200: ProfileDetail}),
            summary="A profile with its vLLM command and the rules' verdict")
def profiles_get(request, profile_id: int):
    return profile_out(get_object_or_404(_profiles(request), pk=profile_id), detail=True)


def _profile_saved(request, form):
    profile = form.save(commit=False)
    profile.team, profile.created_by = request.team, request.user
    profile.save()
    return Status(201, profile_out(profile, detail=True))


@router.post("/profiles", auth=gate("profiles.edit"), response=errors({201: ProfileDetail}))
def profiles_create(request, body: ProfileCreate):
    return _profile_saved(request, validated(ServingProfileForm, body, team=request.team))


@router.post("/profiles/from-model/{model_id}", auth=gate("profiles.edit"), response=errors({201: ProfileDetail}),
             summary="Create a profile that serves a model as its checkpoint needs (the model page's \"Serve this "
                     "model\"): its quantization and bits, dtype auto, its own length; nothing saved on error")
def profiles_from_model(request, model_id: int, body: ProfileFromModel = None):
    model = get_object_or_404(RegisteredModel, pk=model_id, team=request.team)
    # A taken name is refused, not replaced by a free one: a script's retry must not leave a second profile.
    values = profile_defaults(model=model, name=body.name if body else "")
    return _profile_saved(request, validated(ServingProfileForm, values, team=request.team))


@router.patch("/profiles/{profile_id}", auth=gate("profiles.edit"), response=errors({200: ProfileDetail}),
              summary="Change a profile (fields not sent keep their values)")
def profiles_change(request, profile_id: int, body: ProfileChange):
    profile = get_object_or_404(_profiles(request), pk=profile_id)
    maker_check(request, "profiles.edit", profile.created_by_id, profile.not_yours("change"))
    form = validated(ServingProfileForm, body, team=request.team, instance=profile)
    return profile_out(form.save(), detail=True)


EXPORT_TYPES = {kind: content_type for kind, (_, content_type) in EXPORTS.items()}


@router.get("/profiles/{profile_id}/export/{kind}", auth=gate("serving.view"), response=errors({200: str}),
            openapi_extra={"responses": {200: {"description": "The file", "content": {
                content_type: {"schema": {"type": "string"}} for content_type in EXPORT_TYPES.values()}}}},
            summary="config.toml (toml), vllm_deploy.sh (sh) or vLLM's --config YAML (yaml)")
def profiles_export(request, profile_id: int, kind: Literal["toml", "sh", "yaml"]) -> HttpResponse:
    profile = get_object_or_404(_profiles(request), pk=profile_id)
    filename, content_type, body = profile_export_file(profile, kind)
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@router.get("/deployments", auth=gate("serving.view"), response=errors({200: list[DeploymentOut]}))
def deployments_list(request):
    rows = Deployment.objects.filter(team=request.team).select_related("profile__model", "host")[:200]
    return [deployment_out(deployment) for deployment in rows]


@router.get("/deployments/{deployment_id}", auth=gate("serving.view"), response=errors({200: DeploymentOut}))
def deployments_get(request, deployment_id: int):
    return deployment_out(_deployment(request, deployment_id))


@router.get("/deployments/{deployment_id}/logs", auth=gate("serving.view"), response=errors({200: DeploymentLogs}),
            summary="The engine's log tail and the deployment's history")
def deployments_logs(request, deployment_id: int):
    deployment = _deployment(request, deployment_id)
    return {"id": deployment.pk, "state": deployment.state, "log_tail": deployment.log_tail,
            "events": job_events_out(job_events(deployment))}


@router.post("/profiles/{profile_id}/deployments", auth=gate("deployments.run"), response=errors({201: DeploymentOut}),
             summary="Launch a profile on a GPU worker (the one with the most free memory, or the one named)")
def deployments_launch(request, profile_id: int, body: DeploymentLaunch):
    profile = get_object_or_404(_profiles(request), pk=profile_id)
    maker_check(request, "deployments.run", profile.created_by_id, profile.not_yours("launch"))
    data = validated(LaunchForm, body).cleaned_data
    if data["attach_to_route"] and not may(request.membership, "routes.edit"):
        raise ValidationError({"attach_to_route": ["Only an admin may attach a deployment to the team's existing "
                                                   "route."]})
    deployment = deployment_launch(team=request.team, user=request.user, profile=profile, host=data["host"],
                                   replicas=data["replicas"], restart_on_crash=data["restart_on_crash"],
                                   attach_to_route=data["attach_to_route"], max_replicas=data["max_replicas"])
    audit_record(action=AuditAction.DEPLOYMENT_STARTED, request=request,
                 target=f"{profile.name} #{deployment.pk} on {deployment.host.host}")
    return Status(201, deployment_out(deployment))


@router.post("/deployments/{deployment_id}/stop", auth=gate("deployments.run"), response=errors({200: DeploymentOut}))
def deployments_stop(request, deployment_id: int):
    deployment = _deployment(request, deployment_id)
    if deployment_stop(deployment=deployment, user=request.user):
        audit_record(action=AuditAction.DEPLOYMENT_STOPPED, request=request,
                     target=f"{deployment.profile.name} #{deployment.pk}")
    return deployment_out(_deployment(request, deployment_id))


@router.put("/deployments/{deployment_id}/scaling", auth=gate("deployments.run"),
            response=errors({200: DeploymentOut}),
            summary="Scale on queue: set the deployment's fewest and most replicas and when to add or remove one")
def deployments_scaling_set(request, deployment_id: int, body: ScaleChange):
    deployment = _deployment(request, deployment_id)
    form = validated(ScaleForm, body)
    policy = policy_save(deployment=deployment, **form.policy_values())
    audit_record(action=AuditAction.DEPLOYMENT_SCALING, request=request,
                 target=f"{deployment.profile.name} #{deployment.head_id}",
                 detail={"min_replicas": policy.min_replicas, "max_replicas": policy.max_replicas})
    return deployment_out(_deployment(request, deployment_id))


@router.delete("/deployments/{deployment_id}/scaling", auth=gate("deployments.run"),
               response=errors({200: DeploymentOut}),
               summary="Scale no more: the deployment keeps the replicas it has")
def deployments_scaling_off(request, deployment_id: int):
    deployment = _deployment(request, deployment_id)
    if policy_off(deployment=deployment):
        audit_record(action=AuditAction.DEPLOYMENT_SCALING, request=request,
                     target=f"{deployment.profile.name} #{deployment.head_id}", detail={"off": True})
    return deployment_out(_deployment(request, deployment_id))
