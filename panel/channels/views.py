from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.models import Role
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels import canary, rules, settings_export, settings_json
from panel.channels.forms import CanaryForm, ChannelForm, ImportForm, RouteForm, RuleForm, RuleSampleForm, ShadowForm
from panel.channels.models import Channel, Route, RouteRule, listed_channels, listed_routes
from panel.channels.sampling import sampling_words
from panel.channels.services import (
    PRESETS,
    channel_create,
    channel_delete,
    channel_test,
    channel_update,
    route_delete,
    route_save,
)
from panel.channels.shadow import FAILURES_IN_A_ROW, shadow_start, shadow_stop, shadow_summary
from panel.core.crypto import encryption_problem
from panel.core.forms import errors_into
from panel.registry.quality import served_model_quality


def _render(request, template, context, status=200):
    membership = request.membership
    context.update(can_admin=membership.allows(Role.ADMIN), can_test=may(membership, "channels.test"),
                   currency=getattr(settings, "TOKENWISE_CURRENCY", "USD"))
    return render(request, template, context, status=status)


def _channels(request):
    return Channel.objects.filter(team=request.team).select_related("deployment")


def _routes(request):
    return Route.objects.filter(team=request.team).prefetch_related("routechannel_set__channel")


@team_view("channels.view")
def channel_list(request):
    # A ladder's or sweep's step channels and routes are the job's own (panel/benchmarks/ownership.py).
    channels = listed_channels(request.team).select_related("deployment")
    routes = listed_routes(request.team).prefetch_related("routechannel_set__channel")
    context = {"channels": channels, "routes": routes, "presets": PRESETS,
               "encryption_problem": encryption_problem()}
    return _render(request, "channels/list.html", context)


@team_view("channels.edit")
def channel_create_view(request):
    preset = PRESETS.get(request.GET.get("preset", ""))
    form = ChannelForm(request.POST or None, team=request.team, initial=dict(preset["values"]) if preset else {})
    if request.method == "POST" and form.is_valid():
        try:
            channel = channel_create(team=request.team, user=request.user, api_key=form.cleaned_data["api_key"],
                                     **form.channel_fields())
        except ValidationError as error:
            form.add_error(None, error)
        else:
            audit_record(action=AuditAction.CREDENTIAL_CHANGED, request=request, target=channel.name,
                         credential=channel.credential_kind, created=True)
            for note in form.notes:
                messages.info(request, note)
            for warning in channel.warnings:
                messages.warning(request, warning)
            messages.success(request, f"Saved channel {channel.name}. Press Test to check it answers.")
            return redirect("channel_detail", channel_id=channel.pk)
    status = 400 if request.method == "POST" else 200
    return _render(request, "channels/channel_form.html", {"form": form, "preset": preset,
                                                          "encryption_problem": encryption_problem()}, status=status)


@team_view("channels.view")
def channel_detail(request, channel_id):
    channel = get_object_or_404(_channels(request), pk=channel_id)
    routes = Route.objects.filter(team=request.team, routechannel__channel=channel).distinct()
    return _render(request, "channels/channel_detail.html", {"channel": channel, "routes": routes,
                                                            "result": channel.last_test or None})


@team_view("channels.edit")
def channel_edit(request, channel_id):
    channel = get_object_or_404(_channels(request), pk=channel_id)
    form = ChannelForm(request.POST or None, team=request.team, instance=channel)
    if request.method == "POST" and form.is_valid():
        try:
            before = (channel.credential_kind, channel.credential_env, channel.credential_last4)
            channel = channel_update(channel=channel, api_key=form.cleaned_data["api_key"], **form.channel_fields())
        except ValidationError as error:
            form.add_error(None, error)
        else:
            if form.cleaned_data["api_key"] or before != (channel.credential_kind, channel.credential_env,
                                                          channel.credential_last4):
                audit_record(action=AuditAction.CREDENTIAL_CHANGED, request=request, target=channel.name,
                             credential=channel.credential_kind)
            if channel.changes:
                audit_record(action=AuditAction.CHANNEL_CHANGED, request=request, target=channel.name,
                             **{name: f"{old} → {new}" for name, (old, new) in channel.changes.items()})
            for note in form.notes:
                messages.info(request, note)
            for warning in channel.warnings:
                messages.warning(request, warning)
            messages.success(request, f"Saved channel {channel.name}.")
            return redirect("channel_detail", channel_id=channel.pk)
    status = 400 if request.method == "POST" else 200
    return _render(request, "channels/channel_form.html", {"form": form, "channel": channel,
                                                          "encryption_problem": encryption_problem()}, status=status)


@require_POST
@team_view("channels.test")
def channel_test_view(request, channel_id):
    channel = get_object_or_404(_channels(request), pk=channel_id)
    result = channel_test(channel)
    if result["ok"]:
        messages.success(request, f"{channel.name} answers: {result['latency_ms']:.0f} ms for both steps.")
    else:
        messages.error(request, f"{channel.name} failed the test; the diagnosis is below.")
    return redirect("channel_detail", channel_id=channel.pk)


@require_POST
@team_view("channels.edit")
def channel_delete_view(request, channel_id):
    channel = get_object_or_404(_channels(request), pk=channel_id)
    channel_delete(channel=channel)
    messages.info(request, f"Deleted channel {channel.name}.")
    return redirect("channels")


@team_view("routes.edit")
def route_create(request):
    return _route_form(request, None)


@team_view("routes.edit")
def route_edit(request, route_id):
    return _route_form(request, get_object_or_404(Route, pk=route_id, team=request.team))


def _route_form(request, route):
    form = RouteForm(request.POST or None, team=request.team, route=route)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            route = route_save(team=request.team, user=request.user, route=route, model_name=data["model_name"],
                               strategy=data["strategy"], fallback_on_error=data["fallback_on_error"],
                               enabled=data["enabled"], entries=form.entries(),
                               deadline_seconds=data["deadline_seconds"], balance=data["balance"],
                               affinity_header=data["affinity_header"], while_waking=data["while_waking"] or None,
                               spill_wait_ms=data["spill_wait_ms"])
        except ValidationError as error:
            errors_into(form, error)
        else:
            messages.success(request, f"Saved the route for {route.model_name}.")
            return redirect("route_detail", route_id=route.pk)  # where its rules and entries are
    status = 400 if request.method == "POST" else 200
    return _render(request, "channels/route_form.html", {"form": form, "route": route}, status=status)


@require_POST
@team_view("routes.edit")
def route_delete_view(request, route_id):
    route = get_object_or_404(Route, pk=route_id, team=request.team)
    route_delete(route=route)
    messages.info(request, f"Deleted the route for {route.model_name}.")
    return redirect("channels")


@team_view("settings.import")
def settings_import_view(request):
    form = ImportForm(request.POST or None, request.FILES or None)
    problems = []
    if request.method == "POST" and form.is_valid():
        try:
            result = settings_json.settings_import(team=request.team, user=request.user,
                                                   text=form.cleaned_data["payload"],
                                                   replace=form.cleaned_data["replace"])
        except ValidationError as error:
            # "$.channels.x.base_url: message" -> the path in code, the words as text
            problems = [tuple(message.split(": ", 1)) if message.startswith("$") and ": " in message
                        else ("", message) for message in error.messages]
        else:
            for warning in result.warnings:
                messages.warning(request, warning)
            names = ", ".join(channel.name for channel in result.channels)
            messages.success(request, f"Imported settings.json (format {result.format}): channels {names} and the "
                                      f"route for {result.route.model_name}.")
            return redirect("channels")
    status = 400 if request.method == "POST" else 200
    return _render(request, "channels/import.html", {"form": form, "problems": problems,
                                                    "routes": Route.objects.filter(team=request.team)},
                  status=status)


@team_view("settings.export")
def settings_export_view(request):
    kind = request.GET.get("format", "b").lower()
    route_id = request.GET.get("route") or None
    route = None
    if route_id is not None:
        if not route_id.isdigit():
            raise Http404("no such route")
        route = get_object_or_404(Route, pk=int(route_id), team=request.team)
    try:
        if kind == "a":
            if route is None:
                raise ValidationError("Format A describes one route: pick the route to export.")
            body = settings_export.export_a(route=route)
        elif kind == "b":
            body = settings_export.export_b(team=request.team, route=route)
        else:
            raise Http404("unknown format")
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("settings_import")
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="settings.json"'
    return response


# ------------------------------------------------------------------------------------------------- canary

def _route(request, route_id):
    return get_object_or_404(Route.objects.select_related("canary_channel"), pk=route_id, team=request.team)


@team_view("channels.view")
def route_detail(request, route_id):
    """A route's channels and its canary: share, guards, why it was rolled back, and the controls (admins)."""
    route = _route(request, route_id)
    return _render(request, "channels/route_detail.html", _route_context(route, CanaryForm(route=route)))


def _route_context(route, form, shadow_form=None):
    shadow = route.shadow_tests.select_related("candidate").first()
    return {"route": route, "entries": route.entries(), "canary_form": form, "rule_rows": rules.rule_traffic(route),
            "sampling_words": sampling_words(route), "samples_kept": route.samples.count(),
            "shadow": shadow, "shadow_summary": shadow_summary(shadow) if shadow else None,
            "shadow_form": shadow_form or ShadowForm(route=route), "shadow_failures": FAILURES_IN_A_ROW,
            "stable_percent": 100 - route.canary_percent,
            "candidate_quality": served_model_quality(route.canary_channel),
            "guards": {"json": settings.CANARY_JSON_FAILURE_PERCENT, "errors": settings.CANARY_ERROR_PERCENT,
                       "p99": settings.CANARY_P99_RATIO_PERCENT / 100, "minimum": settings.CANARY_MIN_REQUESTS,
                       "step_minutes": settings.CANARY_STEP_SECONDS / 60}}


@require_POST
@team_view("canaries.run")
def canary_start_view(request, route_id):
    route = _route(request, route_id)
    form = CanaryForm(request.POST, route=route)
    if form.is_valid():
        try:
            canary.canary_start(route=route, channel=form.cleaned_data["channel"], request=request,
                                percent=form.cleaned_data["percent"], auto=form.cleaned_data["auto"])
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"Canary started: {form.cleaned_data['percent']}% of {route.model_name} goes "
                                      f"to {form.cleaned_data['channel'].name}.")
            return redirect("route_detail", route_id=route.pk)
    return _render(request, "channels/route_detail.html", _route_context(route, form), status=400)


@require_POST
@team_view("shadows.run")
def shadow_start_view(request, route_id):
    route = _route(request, route_id)
    form = ShadowForm(request.POST, route=route)
    if form.is_valid():
        data = form.cleaned_data
        try:
            shadow_start(route=route, channel=data["channel"], percent=data["percent"], budget=data["budget"],
                         min_similarity=data["min_similarity"], user=request.user, request=request)
        except ValidationError as error:
            errors_into(form, error)
        else:
            messages.success(request, f"Shadow test started: {data['percent']}% of {route.model_name}'s answered "
                                      f"requests are copied to {data['channel'].name}.")
            return redirect(reverse("route_detail", args=[route.pk]) + "#shadow")
    return _render(request, "channels/route_detail.html", _route_context(route, CanaryForm(route=route), form),
                   status=400)


@require_POST
@team_view("shadows.run")
def shadow_stop_view(request, route_id):
    route = _route(request, route_id)
    running = route.shadow_tests.filter(state="running").first()
    if running is None or not shadow_stop(shadow=running, user=request.user, request=request):
        messages.error(request, "No shadow test runs on this route.")
    else:
        messages.success(request, "Shadow test stopped.")
    return redirect(reverse("route_detail", args=[route.pk]) + "#shadow")


@require_POST
@team_view("canaries.run")
def canary_promote_view(request, route_id):
    route = _route(request, route_id)
    reason = request.POST.get("override_reason", "").strip() if request.POST.get("override") else ""
    if request.POST.get("override") and not (request.POST.get("confirm") and reason):
        messages.error(request, "To promote without a passing verdict, tick the confirmation and give a reason "
                                "(the audit log keeps it). Nothing was promoted.")
        return redirect("route_detail", route_id=route.pk)
    try:
        outcome = canary.canary_check_and_promote(route=route, request=request, override_reason=reason)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("route_detail", route_id=route.pk)
    if outcome == "rolled_back":
        messages.error(request, f"Not promoted: a guard tripped and the canary was rolled back. "
                                f"{Route.objects.get(pk=route.pk).canary_reason}")
    else:
        messages.success(request, f"Promoted: {route.canary_percent}% of {route.model_name} goes to "
                                  f"{route.canary_channel.name}.")
    return redirect("route_detail", route_id=route.pk)


@require_POST
@team_view("canaries.run")
def canary_stop_view(request, route_id):
    route = _route(request, route_id)
    try:
        canary.canary_stop(route=route, request=request)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.info(request, f"Canary stopped: {route.model_name} goes to its own channels only.")
    return redirect("route_detail", route_id=route.pk)


# ------------------------------------------------------------------------------------------------- routing rules

@team_view("routes.edit")
def rule_create_view(request, route_id):
    return _rule_form(request, _route(request, route_id), None)


@team_view("routes.edit")
def rule_edit_view(request, route_id, rule_id):
    route = _route(request, route_id)
    return _rule_form(request, route, get_object_or_404(RouteRule, pk=rule_id, route=route))


def _rule_form(request, route, rule):
    # Bound on every POST, an empty one included (`request.POST or None` would leave it unbound: no cleaned data).
    form = RuleForm(request.POST if request.method == "POST" else None, route=route, rule=rule)
    if request.method == "POST" and "try" in request.POST:
        return _rule_try(request, route, rule, form)
    if request.method == "POST":
        valid = form.is_valid()
        fields = form.rule_fields()
        try:
            if not valid:  # report the service's problems too, so every error shows at once
                raise ValidationError(rules.rule_check(route=route, **fields) or {})
            saved = rules.rule_save(route=route, rule=rule, **fields)
        except ValidationError as error:
            for field, problems in getattr(error, "message_dict", {}).items():
                target = "channel_0" if field == "channels" else field
                if target == "__all__" or target not in form.fields:
                    target = None
                if target is None or target not in form.errors:
                    form.add_error(target, problems)
        else:
            audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name,
                         rule=saved.name, change="created" if rule is None else "changed",
                         conditions=saved.conditions_text, channels=[c.name for c in saved.channel_list()])
            messages.success(request, f"Saved the rule {saved.name}.")
            return redirect("route_detail", route_id=route.pk)
    status = 400 if request.method == "POST" else 200
    return _render(request, "channels/rule_form.html", {"form": form, "route": route, "rule": rule,
                                                        "sample_form": RuleSampleForm(route=route)}, status=status)


def _rule_try(request, route, rule, form):
    """The Try button: the rule as the form has it now (saved or not) on the sample request. Nothing is written."""
    form.is_valid()  # its errors show beside the fields; the conditions that parsed are tried
    fields = form.rule_fields()
    sample = RuleSampleForm(request.POST, route=route)
    trial = None
    if sample.is_valid():
        trying = RouteRule(pk=rule.pk if rule else None, route=route, position=rule.position if rule else 0,
                           name=fields["name"], api=fields["api"], tools=fields["tools"],
                           tokens_over=fields["tokens_over"], tokens_under=fields["tokens_under"],
                           header_name=fields["header_name"].lower(), header_value=fields["header_value"],
                           key=fields["key"])
        trying.tried_channels = fields["channels"]
        key = sample.cleaned_data["sample_key"]
        facts = rules.request_facts(api=sample.cleaned_data["sample_api"], body=sample.cleaned_data["body"],
                                    headers=sample.cleaned_data["headers"], key_id=key.pk if key else None)
        trial = rules.rule_try(route=route, rule=trying, facts=facts)
    return _render(request, "channels/rule_form.html", {"form": form, "route": route, "rule": rule,
                                                        "sample_form": sample, "trial": trial},
                   status=200 if trial else 400)


@require_POST
@team_view("routes.edit")
def rule_move_view(request, route_id, rule_id):
    route = _route(request, route_id)
    rule = get_object_or_404(RouteRule, pk=rule_id, route=route)
    offset = -1 if request.POST.get("direction") == "up" else 1
    rules.rule_move(rule=rule, offset=offset)
    audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name, rule=rule.name,
                 change="moved up" if offset < 0 else "moved down")
    return redirect(f"{reverse('route_detail', args=[route.pk])}#rules")


@require_POST
@team_view("routes.edit")
def rule_delete_view(request, route_id, rule_id):
    route = _route(request, route_id)
    rule = get_object_or_404(RouteRule, pk=rule_id, route=route)
    rules.rule_delete(rule=rule)
    audit_record(action=AuditAction.ROUTE_RULE_CHANGED, request=request, target=route.model_name, rule=rule.name,
                 change="deleted")
    messages.info(request, f"Deleted the rule {rule.name}.")
    return redirect(f"{reverse('route_detail', args=[route.pk])}#rules")
