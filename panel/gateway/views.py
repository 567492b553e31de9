from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.keys import key_issue_as, key_revoke_as, member_keys_set
from panel.accounts.models import Membership, Role, TeamKey
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import Route
from panel.gateway.forms import KeyIssueForm, MemberKeysForm


def _route_names(team):
    return list(Route.objects.filter(team=team).values_list("model_name", flat=True))


@team_view("keys.view")
def key_list(request):
    form = KeyIssueForm(route_names=_route_names(request.team))
    return render(request, "gateway/keys.html", _context(request, form))


def _context(request, form, raw_key=None, member_form=None):
    team, admin = request.team, may(request.membership, "keys.manage")
    keys = list(TeamKey.objects.filter(team=team))
    for key in keys:  # an admin revokes any key, a member the ones they issued
        key.revocable = key.status == "active" and (admin or (
            key.created_by_id == request.user.pk and may(request.membership, "keys.issue_own")))
    return {"keys": keys, "form": form, "raw_key": raw_key,
            "gateway_url": request.build_absolute_uri("/v1"), "route_names": _route_names(team),
            "can_manage": admin, "can_issue": admin or (team.member_keys and may(request.membership,
                                                                                  "keys.issue_own")),
            "member_form": member_form or (MemberKeysForm(instance=team) if admin else None),
            "admins": Membership.objects.filter(team=team, role__in=(Role.OWNER, Role.ADMIN))
            .select_related("user").order_by("user__username")}


@require_POST
@team_view("keys.issue_own")
def key_create(request):
    form = KeyIssueForm(request.POST, route_names=_route_names(request.team))
    if not form.is_valid():
        return render(request, "gateway/keys.html", _context(request, form), status=400)
    data = form.cleaned_data
    try:
        key, raw = key_issue_as(membership=request.membership, user=request.user, name=data["name"],
                                allowed_models=data["allowed_models"], rpm_limit=data["rpm_limit"],
                                tpm_limit=data["tpm_limit"], expires_at=data["expires_at"],
                                fit_to_budget=data["fit_to_budget"])
    except ValidationError as error:
        form.add_error(None, error)
        return render(request, "gateway/keys.html", _context(request, form), status=400)
    audit_record(action=AuditAction.KEY_ISSUED, request=request, target=f"{key.name} ({key.masked})")
    # The raw key is rendered once, in this response, and never stored or shown again.
    response = render(request, "gateway/keys.html",
                      _context(request, KeyIssueForm(route_names=_route_names(request.team)), raw_key=raw))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@team_view("keys.issue_own")
def key_revoke_view(request, key_id):
    key = get_object_or_404(TeamKey, pk=key_id, team=request.team)
    if key_revoke_as(membership=request.membership, user=request.user, key=key):
        audit_record(action=AuditAction.KEY_REVOKED, request=request, target=f"{key.name} ({key.masked})")
        messages.success(request, f"Revoked {key.name} ({key.masked}).")
    else:
        messages.error(request, f"{key.name} was already revoked.")
    return redirect("keys")


@require_POST
@team_view("keys.manage")
def member_keys_view(request):
    """Whether members issue their own keys, and the caps of such keys."""
    form = MemberKeysForm(request.POST, instance=request.team)
    if not form.is_valid():
        return render(request, "gateway/keys.html",
                      _context(request, KeyIssueForm(route_names=_route_names(request.team)), member_form=form),
                      status=400)
    data = form.cleaned_data
    member_keys_set(team=request.team, allowed=data["member_keys"], rpm_limit=data["member_key_rpm_limit"],
                    tpm_limit=data["member_key_tpm_limit"])
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target="members' own gateway keys",
                 allowed=str(data["member_keys"]), rpm=str(data["member_key_rpm_limit"]),
                 tpm=str(data["member_key_tpm_limit"]))
    messages.success(request, "Members may now issue their own keys." if data["member_keys"]
                     else "Only admins issue keys now.")
    return redirect("keys")
