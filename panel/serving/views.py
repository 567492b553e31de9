import time

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Case, Count, Q, When
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import maker_check, team_view
from panel.accounts.roles import may, may_on
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.jobs.services import job_events
from panel.registry.adapters import adapters_of
from panel.registry.models import ModelState, RegisteredModel
from panel.registry.services import check_failed_refusal
from panel.serving.configfile import ConfigFileError
from panel.serving.forms import ImportForm, LaunchForm, ProfileLoraForm, ScaleForm, ServingProfileForm
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, DeploymentState, ScalePolicy, ServingProfile
from panel.serving.profile_fields import PRESETS
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
    profile_name_free,
    profile_values,
)


def _listed(deployments):
    """Deployments as lists show them: one row each, their replicas counted on it."""
    ready = (Count("other_replicas", filter=Q(other_replicas__state=DeploymentState.READY))
             + Case(When(state=DeploymentState.READY, then=1), default=0))
    return (deployments.filter(replica_of__isnull=True).select_related("profile", "host")
            .annotate(replica_count=Count("other_replicas") + 1, replicas_ready=ready))


def _home_context(request, import_form):
    return {
        # A ladder's or sweep's step profiles and deployments are the job's: its page shows them.
        "profiles": ServingProfile.objects.filter(team=request.team, benchmark_step__isnull=True)
        .select_related("model"),
        "deployments": _listed(Deployment.objects.filter(team=request.team,
                                                          profile__benchmark_step__isnull=True))[:50],
        "presets": PRESETS,
        "import_form": import_form,
    }


@team_view("serving.view")
def serving_home(request):
    return render(request, "serving/home.html", _home_context(request, ImportForm()))


def _model_to_serve(request):
    """The model a "Serve this model" link names (`?model=<id>`), of this team (else 404); None without one."""
    model_id = request.GET.get("model")
    if model_id is None:
        return None
    if not model_id.isdigit():
        raise Http404("no such model")
    return get_object_or_404(RegisteredModel, pk=int(model_id), team=request.team)


@team_view("profiles.edit")
def profile_create(request):
    preset = PRESETS.get(request.GET.get("preset", ""))
    initial = dict(preset["values"]) if preset else {}
    model = _model_to_serve(request)
    if model is not None:
        try:
            initial.update(profile_defaults(model=model))
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return redirect("model_detail", model_id=model.pk)
        initial["name"] = profile_name_free(team=request.team, name=initial["name"])
    form = ServingProfileForm(request.POST or None, team=request.team, initial=initial)
    if request.method == "POST" and form.is_valid():
        profile = form.save(commit=False)
        profile.team, profile.created_by = request.team, request.user
        profile.save()
        for warning in form.warnings:
            messages.warning(request, warning)
        messages.success(request, f"Saved profile {profile.name}.")
        return redirect("profile_detail", profile_id=profile.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "serving/profile_form.html", {"form": form, "preset": preset, "model": model},
                  status=status)


@team_view("profiles.edit")
def profile_edit(request, profile_id):
    profile = get_object_or_404(ServingProfile, pk=profile_id, team=request.team)
    maker_check(request, "profiles.edit", profile.created_by_id, profile.not_yours("change"))
    form = ServingProfileForm(request.POST or None, team=request.team, instance=profile)
    running = _running_words(profile)
    if request.method == "POST" and form.is_valid():
        form.save()
        for warning in form.warnings:
            messages.warning(request, warning)
        messages.success(request, f"Saved profile {profile.name}.")
        if running and form.has_changed():
            messages.warning(request, f"{running} still runs with the settings it was launched with: stop it and "
                                      f"launch again to apply these.")
        return redirect("profile_detail", profile_id=profile.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "serving/profile_form.html", {"form": form, "profile": profile, "running": running},
                  status=status)


def _running_words(profile):
    """"Deployment #3" / "Deployments #3 and #4" of `profile` that are running or about to, else ""."""
    numbers = [f"#{pk}" for pk in profile.deployments.filter(state__in=ACTIVE_DEPLOYMENT_STATES)
               .order_by("pk").values_list("pk", flat=True)]
    if not numbers:
        return ""
    return f"Deployment {numbers[0]}" if len(numbers) == 1 else (
        f"Deployments {', '.join(numbers[:-1])} and {numbers[-1]}")


@require_POST
@team_view("profiles.edit")
def profile_import_view(request):
    form = ImportForm(request.POST, request.FILES)
    if form.is_valid():
        try:
            profile = profile_import(team=request.team, user=request.user, text=form.cleaned_data["text"],
                                     name=form.cleaned_data["name"])
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Imported {profile.name} from config.toml.")
            return redirect("profile_detail", profile_id=profile.pk)
    return render(request, "serving/home.html", _home_context(request, form), status=400)


def _command_preview(profile):
    """The launch command; without a fixed port it says where the port goes (picked at launch), not 8000."""
    try:
        argv = launch_argv(profile, port=profile.port or 0)
    except ConfigFileError as error:  # saved before one of its extra flags was refused
        return "Cannot launch until the profile is edited: " + " ".join(error.problems)
    if profile.port is None:
        argv = [("--port=<picked at launch>" if token == "--port=0" else token) for token in argv]
    return " ".join(argv)


def _running(profile):
    """The profile's active deployments, one row each (a replica set by its first row)."""
    return profile.deployments.filter(replica_of__isnull=True, state__in=list(ACTIVE_DEPLOYMENT_STATES)) \
        .order_by("pk")


@team_view("serving.view")
def profile_detail(request, profile_id):
    profile = get_object_or_404(ServingProfile.objects.select_related("model"), pk=profile_id, team=request.team)
    context = {
        "profile": profile,
        "values": profile_values(profile),
        "command": _command_preview(profile),
        "verdict": profile_check(profile),
        "launch_form": LaunchForm(running=_running(profile)),
        "may_change": may_on(request.membership, "profiles.edit", profile.created_by_id),
        "may_launch": may_on(request.membership, "deployments.run", profile.created_by_id),
        "launch_refusal": (check_failed_refusal(profile.model, doing="served")
                           if profile.model.state == ModelState.BROKEN else None),  # no Launch button then
        "deployments": _listed(profile.deployments.all())[:20],
        "lora_form": ProfileLoraForm(profile=profile),
    }
    return render(request, "serving/profile_detail.html", context)


@team_view("serving.view")
def profile_export(request, profile_id, kind):
    profile = get_object_or_404(ServingProfile.objects.select_related("model"), pk=profile_id, team=request.team)
    if kind not in EXPORTS:
        return HttpResponse("unknown export", status=404)
    try:
        filename, content_type, body = profile_export_file(profile, kind)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("profile_detail", profile_id=profile.pk)
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@require_POST
@team_view("deployments.run")
def deployment_create(request, profile_id):
    profile = get_object_or_404(ServingProfile.objects.select_related("model"), pk=profile_id, team=request.team)
    maker_check(request, "deployments.run", profile.created_by_id, profile.not_yours("launch"))
    form = LaunchForm(request.POST, running=_running(profile))
    if not form.is_valid():
        messages.error(request, " ".join(m for ms in form.errors.values() for m in ms))
        return redirect("profile_detail", profile_id=profile.pk)
    if form.cleaned_data["attach_to_route"] and not may(request.membership, "routes.edit"):
        messages.error(request, "Only an admin may attach a deployment to the team's existing route.")
        return redirect("profile_detail", profile_id=profile.pk)
    try:
        deployment = deployment_launch(team=request.team, user=request.user, profile=profile,
                                       host=form.cleaned_data["host"], replicas=form.cleaned_data["replicas"],
                                       restart_on_crash=form.cleaned_data["restart_on_crash"],
                                       attach_to_route=form.cleaned_data["attach_to_route"],
                                       max_replicas=form.cleaned_data["max_replicas"])
    except ValidationError as error:
        for message in error.messages:
            messages.error(request, message)
        return redirect("profile_detail", profile_id=profile.pk)
    audit_record(action=AuditAction.DEPLOYMENT_STARTED, request=request,
                 target=f"{profile.name} #{deployment.pk} on {deployment.host.host}")
    for warning in deployment_warnings(deployment):
        messages.warning(request, warning)
    return redirect("deployment_detail", deployment_id=deployment.pk)


def _deployment(request, deployment_id):
    return get_object_or_404(Deployment.objects.select_related("profile__model", "host"), pk=deployment_id,
                             team=request.team)


def _scale_policy(deployment):
    return ScalePolicy.objects.filter(deployment_id=deployment.head_id).first()


def _detail_context(deployment):
    replicas = deployment.replicas()
    return {"deployment": deployment, "events": job_events(deployment), "replicas": replicas,
            "scale_policy": _scale_policy(deployment),
            "replica_figures": [(replica, replica.engine_figures()) for replica in replicas],
            "all_final": deployment.replicas_final(replicas),
            "asleep_hours": deployment.nap_seconds(since=0, until=time.time()) / 3600}


@team_view("serving.view")
def deployment_detail(request, deployment_id):
    deployment = _deployment(request, deployment_id)
    context = _detail_context(deployment)
    context["scale_form"] = ScaleForm(initial=ScaleForm.initial_for(context["scale_policy"], len(
        [replica for replica in context["replicas"] if replica.is_active])))
    loaded = list(deployment.adapters.select_related("adapter"))
    context["loaded_adapters"] = loaded
    context["loadable_adapters"] = adapters_of(deployment.profile.model).exclude(
        pk__in=[row.adapter_id for row in loaded]) if deployment.profile.serves_lora else []
    return render(request, "serving/deployment_detail.html", context)


@require_POST
@team_view("deployments.run")
def deployment_scale_view(request, deployment_id):
    """Turn scale on queue on, change it, or turn it off ("off" in the POST)."""
    deployment = _deployment(request, deployment_id)
    target = f"{deployment.profile.name} #{deployment.head_id}"
    if request.POST.get("off"):
        if policy_off(deployment=deployment):
            audit_record(action=AuditAction.DEPLOYMENT_SCALING, request=request, target=target, detail={"off": True})
            messages.success(request, "Scaling is off: the deployment keeps the replicas it has.")
        return redirect("deployment_detail", deployment_id=deployment.pk)
    form = ScaleForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(m for ms in form.errors.values() for m in ms))
        return redirect("deployment_detail", deployment_id=deployment.pk)
    try:
        policy = policy_save(deployment=deployment, **form.policy_values())
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("deployment_detail", deployment_id=deployment.pk)
    audit_record(action=AuditAction.DEPLOYMENT_SCALING, request=request, target=target,
                 detail={"min_replicas": policy.min_replicas, "max_replicas": policy.max_replicas})
    messages.success(request, f"Scales between {policy.min_replicas} and {policy.max_replicas} replicas.")
    return redirect("deployment_detail", deployment_id=deployment.pk)


@team_view("serving.view")
def deployment_live(request, deployment_id):
    deployment = _deployment(request, deployment_id)
    return render(request, "serving/_deployment_live.html", _detail_context(deployment))


@require_POST
@team_view("deployments.run")
def deployment_stop_view(request, deployment_id):
    deployment = _deployment(request, deployment_id)
    if request.POST.get("confirmed") != "1":
        messages.error(request, "Stop needs a confirmation: press Stop and confirm. The deployment still runs.")
    elif deployment_stop(deployment=deployment, user=request.user):
        # No flash message: the live region says "Stopping…" while it stops, and no more once it has stopped.
        audit_record(action=AuditAction.DEPLOYMENT_STOPPED, request=request,
                     target=f"{deployment.profile.name} #{deployment.pk}")
    else:
        messages.error(request, f"The deployment is already {deployment.get_state_display().lower()}.")
    return redirect("deployment_detail", deployment_id=deployment.pk)



