"""Gateway keys (as on Gateway keys): list, one key, issue (the key is in this answer only), revoke; whether
members issue their own keys, and the caps of theirs."""
import datetime

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.accounts.keys import key_issue_as, key_revoke_as, member_keys_set
from panel.accounts.models import TeamKey
from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import validated
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import Route
from panel.gateway.forms import KeyIssueForm, MemberKeysForm

router = Router(tags=["gateway keys"])


class KeyOut(Schema):
    id: int
    name: str
    masked: str
    status: str
    allowed_models: list[str]
    rpm_limit: int | None
    tpm_limit: int | None
    fit_to_budget: bool
    expires_at: datetime.datetime | None
    revoked_at: datetime.datetime | None
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None


class KeyIssued(KeyOut):
    key: str = Field(description="The key itself: shown once, never again.")


class KeyIssue(Schema):
    name: str = Field(..., max_length=100, description="What uses this key, e.g. the support bot's back end.")
    allowed_models: list[str] = Field([], max_length=200, description="Route model names; empty: every model.")
    rpm_limit: int | None = Field(None, ge=1, le=1_000_000)
    tpm_limit: int | None = Field(None, ge=1, le=1_000_000_000)
    fit_to_budget: bool = Field(False, description="Lower a request's max_tokens to what a budget has left instead "
                                                   "of refusing it (402).")
    expires_at: datetime.datetime | None = None


class MemberKeys(Schema):
    member_keys: bool = Field(description="Whether members may issue their own keys (and revoke those).")
    member_key_rpm_limit: int | None = Field(None, ge=1, le=1_000_000,
                                             description="The most requests per minute a member's key may allow; "
                                                         "null: no cap.")
    member_key_tpm_limit: int | None = Field(None, ge=1, le=1_000_000_000,
                                             description="The most tokens per minute a member's key may allow; "
                                                         "null: no cap.")


def member_keys_out(team):
    return {name: getattr(team, name) for name in MemberKeys.model_fields}


def key_out(key):
    return {name: getattr(key, name) for name in KeyOut.model_fields}


@router.get("/keys", auth=gate("keys.view"), response=errors({200: list[KeyOut]}))
def keys_list(request):
    return [key_out(key) for key in TeamKey.objects.filter(team=request.team)]


@router.get("/keys/members", auth=gate("keys.view"), response=errors({200: MemberKeys}),
            summary="Whether members issue their own keys, and their caps")
def member_keys_get(request):
    return member_keys_out(request.team)


@router.put("/keys/members", auth=gate("keys.manage"), response=errors({200: MemberKeys}),
            summary="Let members issue their own keys (or not), with caps")
def member_keys_put(request, body: MemberKeys):
    data = validated(MemberKeysForm, body.dict()).cleaned_data
    member_keys_set(team=request.team, allowed=data["member_keys"], rpm_limit=data["member_key_rpm_limit"],
                    tpm_limit=data["member_key_tpm_limit"])
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target="members' own gateway keys",
                 allowed=str(data["member_keys"]), rpm=str(data["member_key_rpm_limit"]),
                 tpm=str(data["member_key_tpm_limit"]))
    return member_keys_out(request.team)


@router.get("/keys/{key_id}", auth=gate("keys.view"), response=errors({200: KeyOut}))
def keys_get(request, key_id: int):
    return key_out(get_object_or_404(TeamKey, pk=key_id, team=request.team))


@router.post("/keys", auth=gate("keys.issue_own"), response=errors({201: KeyIssued}))
def keys_issue(request, body: KeyIssue, response: HttpResponse):
    """An admin issues any key; a member one for themselves, where the team lets members, within its caps."""
    response["Cache-Control"] = "no-store"  # the key is in this answer only
    routes = Route.objects.filter(team=request.team).values_list("model_name", flat=True)
    given = body.dict(exclude_unset=True)
    given["allowed_models"] = ",".join(given.get("allowed_models", []))
    data = validated(KeyIssueForm, given, route_names=list(routes)).cleaned_data
    key, raw = key_issue_as(membership=request.membership, user=request.user, name=data["name"],
                            allowed_models=data["allowed_models"], rpm_limit=data["rpm_limit"],
                            tpm_limit=data["tpm_limit"], expires_at=data["expires_at"],
                            fit_to_budget=data["fit_to_budget"])
    audit_record(action=AuditAction.KEY_ISSUED, request=request, target=f"{key.name} ({key.masked})")
    return Status(201, {**key_out(key), "key": raw})


@router.post("/keys/{key_id}/revoke", auth=gate("keys.issue_own"), response=errors({200: KeyOut}))
def keys_revoke(request, key_id: int):
    """An admin revokes any key of the team; a member the keys they issued."""
    key = get_object_or_404(TeamKey, pk=key_id, team=request.team)
    if key_revoke_as(membership=request.membership, user=request.user, key=key):
        audit_record(action=AuditAction.KEY_REVOKED, request=request, target=f"{key.name} ({key.masked})")
    return key_out(key)


