from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.keys import key_issue, key_revoke
from panel.accounts.models import TeamKey
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import Route
from panel.gateway.forms import KeyIssueForm


def _route_names(team):
    return list(Route.objects.filter(team=team).values_list("model_name", flat=True))


@team_view("keys.view")
def key_list(request):
    form = KeyIssueForm(route_names=_route_names(request.team))
    return render(request, "gateway/keys.html", _context(request, form))


def _context(request, form, raw_key=None):
    return {"keys": TeamKey.objects.filter(team=request.team), "form": form, "raw_key": raw_key,
            "gateway_url": request.build_absolute_uri("/v1"), "route_names": _route_names(request.team)}


@require_POST
@team_view("keys.manage")
def key_create(request):
    form = KeyIssueForm(request.POST, route_names=_route_names(request.team))
    if not form.is_valid():
        return render(request, "gateway/keys.html", _context(request, form), status=400)
    data = form.cleaned_data
    key, raw = key_issue(team=request.team, user=request.user, name=data["name"], allowed_models=data["allowed_models"],
                         rpm_limit=data["rpm_limit"], tpm_limit=data["tpm_limit"], expires_at=data["expires_at"])
    audit_record(action=AuditAction.KEY_ISSUED, request=request, target=f"{key.name} ({key.masked})")
    # The raw key is rendered once, in this response, and never stored or shown again.
    response = render(request, "gateway/keys.html",
                      _context(request, KeyIssueForm(route_names=_route_names(request.team)), raw_key=raw))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@team_view("keys.manage")
def key_revoke_view(request, key_id):
    key = get_object_or_404(TeamKey, pk=key_id, team=request.team)
    if key_revoke(key=key, user=request.user):
        audit_record(action=AuditAction.KEY_REVOKED, request=request, target=f"{key.name} ({key.masked})")
        messages.success(request, f"Revoked {key.name} ({key.masked}).")
    else:
        messages.error(request, f"{key.name} was already revoked.")
    return redirect("keys")
