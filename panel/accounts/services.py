"""Teams and memberships: the only place that creates them or changes roles."""
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes, force_str
from django.utils.http import urlsafe_base64_decode, urlsafe_base64_encode

from panel.accounts.models import AccessToken, Invitation, InvitedAccount, Membership, Role, Team, TeamKey
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record

SESSION_TEAM_KEY = "tokenwise_team_id"


@transaction.atomic
def team_create(*, name, owner):
    """Create a team with `owner` as its owner."""
    team = Team.objects.create(name=name)
    Membership.objects.create(team=team, user=owner, role=Role.OWNER)
    return team


def membership_add(*, team, user, role=Role.MEMBER):
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def membership_for(*, user, team_id):
    """The user's membership in team `team_id`, or None."""
    if not user.is_authenticated or team_id is None:
        return None
    return Membership.objects.select_related("team").filter(user=user, team_id=team_id).first()


def current_membership(request):
    """The membership of the team this session works in; falls back to the user's first team."""
    user = request.user
    if not user.is_authenticated:
        return None
    membership = membership_for(user=user, team_id=request.session.get(SESSION_TEAM_KEY))
    if membership is None:
        membership = Membership.objects.select_related("team").filter(user=user).order_by("team__name").first()
        if membership is not None:
            request.session[SESSION_TEAM_KEY] = membership.team_id
    return membership


def team_switch(request, *, team_id):
    """Make `team_id` the session's current team. Returns the membership, or None if the user is not in it."""
    membership = membership_for(user=request.user, team_id=team_id)
    if membership is not None:
        request.session[SESSION_TEAM_KEY] = membership.team_id
    return membership


@transaction.atomic
def admin_ensure(*, username, password, email=""):
    """Create the superuser `username` if it does not exist. Returns (user, created)."""
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    user = User.objects.create_superuser(username=username, email=email, password=password)
    return user, True


@transaction.atomic
def demo_team_ensure(*, owner, name="Demo team"):
    """The demo team that `make run` seeds, with `owner` as owner. Idempotent."""
    team = Team.objects.filter(name=name).first()
    if team is None:
        return team_create(name=name, owner=owner)
    membership_add(team=team, user=owner, role=Role.OWNER)
    return team


# --- Members: invite, change role, remove. The safeguards live here, so every caller gets them.

INVITE_LINK_DAYS = 3  # Django's PASSWORD_RESET_TIMEOUT default, which the set-password token follows


def _owners(team):
    return Membership.objects.filter(team=team, role=Role.OWNER)


def _check_actor(*, actor, target_role=None, new_role=None):
    """An admin manages members and admins only: never an owner, never making one."""
    if actor.role == Role.OWNER:
        return
    if target_role == Role.OWNER:
        raise PermissionDenied("Only an owner can change or remove an owner.")
    if new_role == Role.OWNER:
        raise PermissionDenied("Only an owner can make someone an owner.")


def _username_for(email):
    """A free username from an email's local part (alice@x -> alice, alice2, ...)."""
    User = get_user_model()
    base = "".join(ch for ch in email.split("@", 1)[0] if ch.isalnum() or ch in "._-")[:140] or "user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}{n}"
    return name


@transaction.atomic
def member_invite(*, team, actor, who, role):
    """Add a user to `team` by username or email. Returns (Membership or Invitation, created_user).

    An existing user (by username, or by email when exactly one account has it) gets an Invitation to accept. An
    unknown email creates an inactive account with no password (recorded as this team's InvitedAccount): the
    caller shows the admin a one-time set-password link (`member_setup_link`) to pass on, since the panel sends no
    mail. An unknown username is an error, and so is an email of an account another team's invitation created
    (whoever holds it was chosen by that team's admin; see InvitedAccount)."""
    User = get_user_model()
    who = (who or "").strip()
    _check_actor(actor=actor, new_role=role)
    if not who:
        raise ValidationError("Enter a username or an email address.")
    user = User.objects.filter(username=who).first()
    created = False
    if user is None and "@" in who:
        try:
            validate_email(who)
        except ValidationError:
            raise ValidationError(f"{who!r} is not a valid email address.") from None
        matches = list(User.objects.filter(email__iexact=who)[:2])
        if len(matches) > 1:
            raise ValidationError(f"Several accounts use {who}: invite by username instead.")
        if matches:
            user = matches[0]
            origin = InvitedAccount.objects.select_related("team").filter(user=user).first()
            if origin is not None and not origin.binds_by_email(team):
                # The address is only what another team's admin typed, and they chose who holds the account.
                raise ValidationError(f"{who} is the address of an account that {origin.team_name}'s invitation "
                                      "created, and nobody has verified it: ask the person for their username and "
                                      "invite by username.")
        else:
            user = User.objects.create_user(username=_username_for(who), email=who, is_active=False)
            user.set_unusable_password()
            user.save(update_fields=["password"])
            InvitedAccount.objects.create(user=user, team=team, team_name=team.name, invited_by=actor.user)
            created = True
    if user is None:
        raise ValidationError(f"No account is named {who!r}. Invite by email to create one.")
    if Membership.objects.filter(team=team, user=user).exists():
        raise ValidationError(f"{user.get_username()} is already a member of {team}.")
    if not created and not user.is_active and not user.has_usable_password():
        # A pending account stays in the one team that invited it: that team's admins can hand out its set-password
        # link, and no other team's admin may (they would pick the password and so enter the first team).
        raise ValidationError(f"{user.get_username()} was invited to another team and has not set a password yet; "
                              "invite them again once they have.")
    if not created:
        # An existing account joins only when it accepts, signed in: whoever set its password (an earlier invite
        # link) cannot be let into this team by its email address alone.
        if Invitation.objects.filter(team=team, user=user).exists():
            raise ValidationError(f"{user.get_username()} is already invited to {team}.")
        return Invitation.objects.create(team=team, user=user, role=role, invited_by=actor.user), False
    return Membership.objects.create(team=team, user=user, role=role), created


def account_origin_note(*, user, team):
    """Words for `team`'s admin when `user`'s account was created by another team's invitation and its email was
    never verified ("" otherwise): they should be sure the account is the person they mean."""
    origin = InvitedAccount.objects.filter(user=user).first()
    if origin is None or origin.binds_by_email(team):
        return ""
    return (f"{user.get_username()}'s account was created by {origin.team_name}'s invitation and its email address "
            "is not verified: make sure it is the person you mean.")


def invitations_for(*, user):
    """The invitations waiting for `user` to accept."""
    return list(Invitation.objects.filter(user=user).select_related("team", "invited_by").order_by("created_at"))


@transaction.atomic
def invitation_accept(*, invitation_id, user):
    """The signed-in `user` accepts their invitation: the membership is made and the invitation removed. Another
    user's invitation is not found (ValidationError)."""
    invitation = Invitation.objects.select_for_update().filter(pk=invitation_id, user=user).first()
    if invitation is None:
        raise ValidationError("That invitation is not yours, or it was already used.")
    membership, _ = Membership.objects.get_or_create(team=invitation.team, user=user,
                                                     defaults={"role": invitation.role})
    invitation.delete()
    return membership


def member_setup_link(*, user):
    """The path of a one-time set-password link for an invited account that has not signed in yet. It stops working
    once the password is set (the token covers the password hash) or after PASSWORD_RESET_TIMEOUT."""
    if user.is_active or user.has_usable_password():
        raise ValidationError(f"{user.get_username()} has already set a password.")
    return reverse("account_setup", kwargs={"uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
                                            "token": default_token_generator.make_token(user)})


def member_setup_user(*, uidb64, token):
    """The invited, not yet active user a set-password link belongs to, or None for a bad or used link."""
    User = get_user_model()
    try:
        user = User.objects.get(pk=int(force_str(urlsafe_base64_decode(uidb64))))
    except (ValueError, TypeError, OverflowError, User.DoesNotExist):
        return None
    if user.is_active or user.has_usable_password() or not default_token_generator.check_token(user, token):
        return None
    return user


@transaction.atomic
def member_activate(*, user, password):
    """Set the invited user's password and let them sign in (the link is spent: the hash changed)."""
    user.set_password(password)
    user.is_active = True
    user.save(update_fields=["password", "is_active"])
    return user


@transaction.atomic
def member_role_change(*, actor, membership, role):
    """Give `membership` the role `role`. Returns the previous role."""
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    _check_actor(actor=actor, target_role=membership.role, new_role=role)
    previous = membership.role
    if role != Role.OWNER and last_owner(membership):
        raise ValidationError(f"{membership.user} is the last owner of {membership.team}: make someone else an "
                              "owner first.")
    membership.role = role
    membership.save(update_fields=["role"])
    return previous


@transaction.atomic
def member_remove(*, actor, membership, request=None):
    """Remove `membership` from its team (the user's account stays), and in the same transaction revoke what would
    still act for them there: their personal access tokens of the team, and, when they were below admin, the
    gateway keys they issued themself (an admin's keys are the team's apps' keys: they stay). One audit event for
    each kind revoked, with the count. Returns the number of keys revoked."""
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    _check_actor(actor=actor, target_role=membership.role)
    if last_owner(membership):
        raise ValidationError(f"{membership.user} is the last owner of {membership.team} and cannot be removed.")
    return membership_end(membership=membership, request=request, actor=actor.user)


def last_owner(membership):
    """Whether `membership` is its team's only owner (a team never loses its last owner)."""
    return membership.role == Role.OWNER and _owners(membership.team).count() <= 1


def membership_end(*, membership, request=None, actor=None, username=""):
    """Delete `membership` and revoke what would still act for its member in the team: their personal access
    tokens, and, when they were below admin, the gateway keys they issued themself. One audit event for each kind
    revoked, with the count, by `actor` (a user) or `username` (the identity provider). Returns the number of keys
    revoked. The caller checks who may (member_remove) and holds the transaction."""
    team, user, now = membership.team, membership.user, timezone.now()
    membership.delete()
    keys = 0
    if not may(membership, "keys.manage"):  # effective in every gateway process within TOKENWISE_KEY_CACHE_SECONDS
        keys = TeamKey.objects.filter(team=team, created_by=user, revoked_at__isnull=True).update(revoked_at=now)
    tokens = AccessToken.objects.filter(team=team, user=user, revoked_at__isnull=True).update(revoked_at=now)
    by = {"actor": actor} if actor is not None else {"username": username}
    for action, count, kind in ((AuditAction.KEY_REVOKED, keys, "keys"), (AuditAction.TOKEN_REVOKED, tokens,
                                                                            "tokens")):
        if count:
            audit_record(action=action, request=request, team=team, target=user.get_username(),
                         reason="member removed", **by, **{kind: count})
    return keys


def team_trace_prompts_set(*, actor, on):
    """Let the team's prompts and answers into its gateway requests' OpenTelemetry spans, or keep them out. Only an
    owner may: the text leaves the panel for whoever reads the traces."""
    if actor.role != Role.OWNER:
        raise PermissionDenied("Only an owner of the team decides whether its prompts go into traces.")
    Team.objects.filter(pk=actor.team_id).update(trace_prompts=on)
    actor.team.trace_prompts = on


@transaction.atomic
def team_gpu_quota_set(*, actor, quota):
    """Set the most GPUs `actor`'s team's deployments may hold at once (None: no limit). Only an owner may: an admin
    could otherwise lift the limit the owner set. Deployments already running keep running; the next launch is
    checked (serving/quota.py)."""
    if actor.role != Role.OWNER:
        raise PermissionDenied("Only an owner of the team sets its GPU quota.")
    if quota is not None and quota < 0:
        raise ValidationError({"gpu_quota": ["The GPU quota is a number of GPUs, 0 or more (empty: no limit)."]})
    Team.objects.filter(pk=actor.team_id).update(gpu_quota=quota)
    actor.team.gpu_quota = quota
