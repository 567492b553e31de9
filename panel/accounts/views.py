from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import SetPasswordForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.forms import GpuQuotaForm, InviteForm, RoleForm, TracePromptsForm, role_choices
from panel.accounts.models import Invitation, Membership, Role
from panel.accounts.services import (
    INVITE_LINK_DAYS,
    SESSION_TEAM_KEY,
    account_origin_note,
    invitation_accept,
    invitations_for,
    member_activate,
    member_invite,
    member_remove,
    member_role_change,
    member_setup_link,
    member_setup_user,
    team_gpu_quota_set,
    team_switch,
    team_trace_prompts_set,
)
from panel.accounts.throttle import signin_blocked
from panel.audit.models import AuditAction
from panel.audit.services import audit_record


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        address = request.META.get("REMOTE_ADDR", "")
        if signin_blocked(username, address):
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, f"Too many failed sign-ins. Wait {settings.SIGNIN_WINDOW_SECONDS // 60} minutes "
                                 "and try again.")
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs):
        # "Sign in with <name>" beside the form when single sign-on is on (panel/sso)
        return {**super().get_context_data(**kwargs), "sso_name": settings.SSO_NAME}



@require_POST
@login_required
def switch_team(request):
    try:
        team_id = int(request.POST.get("team", ""))
    except ValueError:
        raise Http404("No such team") from None
    membership = team_switch(request, team_id=team_id)
    if membership is None:
        raise Http404("No such team")
    messages.success(request, f"Now working in {membership.team}.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = resolve_url("home")
    return redirect(target)


@login_required
def no_team(request):
    if request.user.memberships.exists():
        return redirect("home")
    return render(request, "accounts/no_team.html", {"invitations": invitations_for(user=request.user)})


@require_POST
@login_required
def invitation_accept_view(request, invitation_id):
    """The signed-in account accepts a team's invitation (the only way an existing account joins a team)."""
    try:
        membership = invitation_accept(invitation_id=invitation_id, user=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("home")
    audit_record(action=AuditAction.MEMBER_ADDED, team=membership.team, actor=request.user, request=request,
                 target=request.user.get_username(), role=membership.role, accepted=True)
    request.session[SESSION_TEAM_KEY] = membership.team_id
    messages.success(request, f"You joined {membership.team} as {membership.get_role_display().lower()}.")
    return redirect("home")


# --- Members (owners and admins)

def _members_page(request, *, form=None, quota_form=None, status=200, setup_link=None):
    role = request.membership.role
    memberships = (Membership.objects.filter(team=request.team).select_related("user")
                   .order_by("user__username"))
    return render(request, "accounts/members.html", {
        "memberships": memberships, "form": form or InviteForm(actor_role=role), "role_choices": role_choices(role),
        "quota_form": quota_form or GpuQuotaForm(initial={"gpu_quota": request.team.gpu_quota}),
        "trace_form": TracePromptsForm(initial={"trace_prompts": request.team.trace_prompts}),
        "traces_sent": bool(settings.OTEL_ENDPOINT),
        "setup_link": request.build_absolute_uri(setup_link) if setup_link else None,
        "link_days": INVITE_LINK_DAYS}, status=status)


def _refused(request, membership, error):
    audit_record(action=AuditAction.REFUSED, request=request, target=f"member {membership.user}",
                 reason=str(error))
    raise error


@team_view("members.manage")
def member_list(request):
    return _members_page(request)


@require_POST
@team_view("members.manage")
def member_invite_view(request):
    form = InviteForm(request.POST, actor_role=request.membership.role)
    if not form.is_valid():
        return _members_page(request, form=form, status=400)
    try:
        membership, created = member_invite(team=request.team, actor=request.membership,
                                            who=form.cleaned_data["who"], role=form.cleaned_data["role"])
    except ValidationError as error:
        form.add_error("who", error)
        return _members_page(request, form=form, status=400)
    if isinstance(membership, Invitation):
        audit_record(action=AuditAction.MEMBER_ADDED, request=request, target=membership.user.get_username(),
                     role=membership.role, new_account=False, invited=True)
        messages.success(request, f"Invited {membership.user} as {membership.get_role_display().lower()}: they "
                                  "join once they accept it, signed in (Your account).")
        note = account_origin_note(user=membership.user, team=request.team)
        if note:
            messages.warning(request, note)
        return redirect("members")
    audit_record(action=AuditAction.MEMBER_ADDED, request=request, target=membership.user.get_username(),
                 role=membership.role, new_account=created)
    messages.success(request, f"Added {membership.user} as {membership.get_role_display().lower()}.")
    if not created:
        return redirect("members")
    # The link is rendered in this response only; it is never stored or logged.
    response = _members_page(request, setup_link=member_setup_link(user=membership.user))
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@team_view("team.gpu_quota")
def team_gpu_quota_view(request):
    form = GpuQuotaForm(request.POST)
    if not form.is_valid():
        return _members_page(request, quota_form=form, status=400)
    quota = form.cleaned_data["gpu_quota"]
    team_gpu_quota_set(actor=request.membership, quota=quota)
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target="the team's GPU quota",
                 gpu_quota="no limit" if quota is None else str(quota))
    messages.success(request, "GPU quota: " + ("no limit." if quota is None else f"at most {quota} GPUs at once."))
    return redirect("members")


@require_POST
@team_view("team.trace_prompts")
def team_trace_prompts_view(request):
    form = TracePromptsForm(request.POST)
    form.is_valid()  # a checkbox: absent is off
    on = form.cleaned_data["trace_prompts"]
    team_trace_prompts_set(actor=request.membership, on=on)
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target="prompts and answers in traces",
                 trace_prompts="on" if on else "off")
    messages.success(request, "Traces carry the team's prompts and answers." if on
                     else "Traces carry no prompt or answer text.")
    return redirect("members")


@require_POST
@team_view("members.manage")
def member_link_view(request, membership_id):
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, team=request.team)
    try:
        link = member_setup_link(user=membership.user)
    except ValidationError as error:
        messages.error(request, error.messages[0])
        return redirect("members")
    response = _members_page(request, setup_link=link)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@team_view("members.manage")
def member_role_view(request, membership_id):
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, team=request.team)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles owner, admin, member or viewer.")
        return _members_page(request, status=400)
    role = form.cleaned_data["role"]
    try:
        previous = member_role_change(actor=request.membership, membership=membership, role=role)
    except PermissionDenied as error:
        _refused(request, membership, error)
    except ValidationError as error:
        messages.error(request, error.messages[0])
        return _members_page(request, status=400)
    if previous != role:
        audit_record(action=AuditAction.ROLE_CHANGED, request=request, target=membership.user.get_username(),
                     before=previous, after=role)
        messages.success(request, f"{membership.user} is now {Role(role).label.lower()}.")
    return redirect("members")


@require_POST
@team_view("members.manage")
def member_remove_view(request, membership_id):
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, team=request.team)
    try:
        keys = member_remove(actor=request.membership, membership=membership, request=request)
    except PermissionDenied as error:
        _refused(request, membership, error)
    except ValidationError as error:
        messages.error(request, error.messages[0])
        return _members_page(request, status=400)
    audit_record(action=AuditAction.MEMBER_REMOVED, request=request, target=membership.user.get_username(),
                 role=membership.role)
    messages.success(request, f"Removed {membership.user} from {request.team}."
                     + (" The gateway key they issued is revoked." if keys == 1 else
                        f" The {keys} gateway keys they issued are revoked." if keys else ""))
    if membership.user_id == request.user.pk:
        return redirect("home")
    return redirect("members")


def account_setup(request, uidb64, token):
    """The one-time link an invited person opens to choose a password (no sign-in: they have none yet)."""
    user = member_setup_user(uidb64=uidb64, token=token)
    if user is None:
        return render(request, "accounts/setup.html", {"invalid": True}, status=404)
    form = SetPasswordForm(user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        member_activate(user=user, password=form.cleaned_data["new_password1"])
        # Holding the link and choosing the password is the sign-in: asking for it again straight away proves
        # nothing more (Django's own reset view does the same with post_reset_login).
        login(request, user, backend=settings.AUTHENTICATION_BACKENDS[0])
        messages.success(request, "Your password is set and you are signed in. Next time, sign in with your "
                                  f"username, {user.get_username()}, and this password.")
        return redirect("home")
    return render(request, "accounts/setup.html", {"form": form, "invited": user},
                  status=400 if request.method == "POST" else 200)
