"""Your account: your password and the personal access tokens you hold in the current team (any member, viewers
included)."""
from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.forms import PasswordChangeForm
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.forms import TokenForm
from panel.accounts.services import invitations_for
from panel.accounts.tokens import token_issue, token_revoke, tokens_of
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.core.forms import errors_into


def _page(request, form=None, raw_token=None, password_form=None, status=200):
    return render(request, "accounts/account.html", {
        "tokens": tokens_of(user=request.user, team=request.team),
        "form": form or TokenForm(actor_role=request.membership.role), "raw_token": raw_token,
        "password_form": password_form or PasswordChangeForm(request.user),
        "api_url": request.build_absolute_uri("/api/v1/"), "invitations": invitations_for(user=request.user)},
        status=status)


@team_view("account.view")
def account(request):
    return _page(request)


@require_POST
@team_view("tokens.create")
def token_create(request):
    form = TokenForm(request.POST, actor_role=request.membership.role)
    if not form.is_valid():
        return _page(request, form, status=400)
    try:
        token, raw = token_issue(membership=request.membership, name=form.cleaned_data["name"],
                                 role=form.cleaned_data["role"], expires_at=form.cleaned_data["expires_at"])
    except ValidationError as error:
        errors_into(form, error)
        return _page(request, form, status=400)
    audit_record(action=AuditAction.TOKEN_ISSUED, request=request, target=f"{token.name} ({token.masked})",
                 role=token.role)
    # The token is rendered once, in this response, and never stored or shown again.
    response = _page(request, raw_token=raw)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@team_view("tokens.revoke")
def token_revoke_view(request, token_id):
    token = get_object_or_404(tokens_of(user=request.user, team=request.team), pk=token_id)
    if token_revoke(token=token):
        audit_record(action=AuditAction.TOKEN_REVOKED, request=request, target=f"{token.name} ({token.masked})")
        messages.success(request, f"Revoked {token.name} ({token.masked}).")
    else:
        messages.error(request, f"{token.name} was already revoked.")
    return redirect("account")


@require_POST
@team_view("account.password")
def password_change(request):
    """Change one's own password: the old one first, the new one twice and checked like an invited person's. This
    session stays signed in; every other session of the account ends (Django ties sessions to the password)."""
    form = PasswordChangeForm(request.user, request.POST)
    if not form.is_valid():
        return _page(request, password_form=form, status=400)
    form.save()
    update_session_auth_hash(request, form.user)
    audit_record(action=AuditAction.PASSWORD_CHANGED, request=request, target=request.user.get_username())
    messages.success(request, "Your password is changed. Other browsers signed in as you have been signed out; "
                              "your personal access tokens still work.")
    return redirect("account")
