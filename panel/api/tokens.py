"""The caller's own personal access tokens in this team (as on Your account): list, issue (shown once), revoke."""
import datetime
from typing import Literal

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.accounts.tokens import token_issue, token_revoke, tokens_of
from panel.api.auth import gate
from panel.api.errors import errors
from panel.audit.models import AuditAction
from panel.audit.services import audit_record

router = Router(tags=["personal access tokens"])


class TokenOut(Schema):
    id: int
    name: str
    masked: str
    role: str
    status: str
    created_at: datetime.datetime
    expires_at: datetime.datetime | None
    revoked_at: datetime.datetime | None
    last_used_at: datetime.datetime | None


class TokenIssued(TokenOut):
    token: str = Field(description="The token itself: shown once, never again.")


class TokenIssue(Schema):
    name: str = Field(..., max_length=100, description="What uses it, e.g. the deploy script.")
    role: Literal["owner", "admin", "member", "viewer"] | None = Field(
        None, description="At most your own role; empty: your role.")
    expires_at: datetime.datetime | None = Field(None, description="Empty: never.")


def token_out(token):
    return {name: getattr(token, name) for name in TokenOut.model_fields}


@router.get("/tokens", auth=gate("account.view"), response=errors({200: list[TokenOut]}))
def tokens_list(request):
    return [token_out(token) for token in tokens_of(user=request.user, team=request.team)]


# A token that could issue tokens would outlive its own revocation through the ones it made.
@router.post("/tokens", response=errors({201: TokenIssued}),
             auth=gate("tokens.create", token_refusal="A personal access token cannot issue tokens: create one on "
                                                      "Your account, signed in (or here with the browser's session)."))
def tokens_issue(request, body: TokenIssue, response: HttpResponse):
    """Issue a token, shown in this answer only. From a signed-in session only: a token cannot issue tokens."""
    response["Cache-Control"] = "no-store"  # the token is in this answer only
    token, raw = token_issue(membership=request.membership, name=body.name, role=body.role,
                             expires_at=body.expires_at)
    audit_record(action=AuditAction.TOKEN_ISSUED, request=request, target=f"{token.name} ({token.masked})",
                 role=token.role)
    return Status(201, {**token_out(token), "token": raw})


@router.post("/tokens/{token_id}/revoke", auth=gate("tokens.revoke"), response=errors({200: TokenOut}))
def tokens_revoke(request, token_id: int):
    token = get_object_or_404(tokens_of(user=request.user, team=request.team), pk=token_id)
    if token_revoke(token=token):
        audit_record(action=AuditAction.TOKEN_REVOKED, request=request, target=f"{token.name} ({token.masked})")
    return token_out(token)
