"""The team the caller works in, and its members (owners and admins manage them, as on the Members page)."""
import datetime

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.accounts.forms import InviteForm, RoleForm
from panel.accounts.models import Membership
from panel.accounts.services import (
    account_origin_note,
    member_invite,
    member_remove,
    member_role_change,
    member_setup_link,
)
from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import schema_from_form, validated
from panel.audit.models import AuditAction
from panel.audit.services import audit_record

router = Router(tags=["team and members"])


class TeamOut(Schema):
    id: int
    name: str
    slug: str
    role: str
    via: str


class MemberOut(Schema):
    id: int
    username: str
    email: str
    role: str
    active: bool
    joined_at: datetime.datetime


class InvitedOut(MemberOut):
    setup_link: str | None
    note: str = Field("", description="Said when another team's invitation created the account and its email "
                                      "address is not verified.")


MemberInvite = schema_from_form(InviteForm, "MemberInvite")
MemberRole = schema_from_form(RoleForm, "MemberRole")


def member_out(membership):
    user = membership.user
    return {"id": membership.pk, "username": user.get_username(), "email": user.email, "role": membership.role,
            "active": user.is_active, "joined_at": membership.created_at}


def _membership(request, membership_id):
    return get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, team=request.team)


def _refused(request, membership, error):
    audit_record(action=AuditAction.REFUSED, request=request, target=f"member {membership.user}", reason=str(error))
    raise error


@router.get("/team", auth=gate("team.view"), response=errors({200: TeamOut}),
            summary="The team this token or session works in")
def team_current(request):
    team = request.team
    return {"id": team.pk, "name": team.name, "slug": team.slug, "role": request.membership.role,
            "via": "token" if getattr(request, "access_token", None) else "session"}


@router.get("/members", auth=gate("members.manage"), response=errors({200: list[MemberOut]}))
def members_list(request):
    rows = Membership.objects.filter(team=request.team).select_related("user").order_by("user__username")
    return [member_out(membership) for membership in rows]


@router.post("/members", auth=gate("members.manage"), response=errors({201: InvitedOut}),
             summary="Add a member by username, or invite an email (its one-time set-password link is returned)")
def members_invite(request, body: MemberInvite, response: HttpResponse):
    response["Cache-Control"] = "no-store"  # a set-password link is in this answer only
    form = validated(InviteForm, body, actor_role=request.membership.role)
    try:
        membership, created = member_invite(team=request.team, actor=request.membership,
                                            who=form.cleaned_data["who"], role=form.cleaned_data["role"])
    except PermissionDenied as error:
        audit_record(action=AuditAction.REFUSED, request=request, target=f"invite {form.cleaned_data['who']}"[:300],
                     reason=str(error))
        raise
    audit_record(action=AuditAction.MEMBER_ADDED, request=request, target=membership.user.get_username(),
                 role=membership.role, new_account=created)
    link = request.build_absolute_uri(member_setup_link(user=membership.user)) if created else None
    note = account_origin_note(user=membership.user, team=request.team)
    return Status(201, {**member_out(membership), "setup_link": link, "note": note})


@router.patch("/members/{membership_id}", auth=gate("members.manage"), response=errors({200: MemberOut}))
def members_role(request, membership_id: int, body: MemberRole):
    membership = _membership(request, membership_id)
    role = validated(RoleForm, body).cleaned_data["role"]
    try:
        previous = member_role_change(actor=request.membership, membership=membership, role=role)
    except PermissionDenied as error:
        _refused(request, membership, error)
    if previous != role:
        audit_record(action=AuditAction.ROLE_CHANGED, request=request, target=membership.user.get_username(),
                     before=previous, after=role)
    membership.role = role
    return member_out(membership)


@router.delete("/members/{membership_id}", auth=gate("members.manage"), response=errors({204: None}))
def members_remove(request, membership_id: int):
    membership = _membership(request, membership_id)
    try:
        member_remove(actor=request.membership, membership=membership, request=request)
    except PermissionDenied as error:
        _refused(request, membership, error)
    audit_record(action=AuditAction.MEMBER_REMOVED, request=request, target=membership.user.get_username(),
                 role=membership.role)
    return Status(204, None)
