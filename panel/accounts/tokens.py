"""Personal access tokens for the management API: issued once to a member of a team, stored as a SHA-256 and the
last four characters (as gateway keys are, panel/accounts/keys.py), with an expiry and revocation. A token acts for
its member with the lower of its own role and the member's role in the team at the time of use, so demoting or
removing a member takes effect on their tokens at once."""
import secrets

from django.core.exceptions import ValidationError
from django.utils import timezone

from panel.accounts.keys import key_hash
from panel.accounts.models import ROLE_RANK, AccessToken, Membership, Role

PREFIX = "twp-"
MAX_ACTIVE_PER_MEMBER = 50
LAST_USED_EVERY_SECONDS = 60  # last_used_at is written at most this often per token


def token_issue(*, membership, name, role=None, expires_at=None):
    """Create a token for `membership` (its user in its team). `role` may be lower than the member's, never
    higher. Returns (AccessToken, raw token): the raw token exists only in this return value."""
    name = (name or "").strip()
    errors = {}
    if not name:
        errors["name"] = ["Give the token a name (what uses it, e.g. the deploy script)."]
    elif len(name) > 100:
        errors["name"] = ["A token name is 100 characters at most."]
    role = role or membership.role
    if role not in Role.values:
        errors["role"] = ["Choose owner, admin, member or viewer."]
    elif ROLE_RANK[Role(role)] > ROLE_RANK[Role(membership.role)]:
        errors["role"] = [f"A token cannot do more than you: your role in {membership.team} is "
                          f"{Role(membership.role).label.lower()}."]
    if expires_at is not None and expires_at <= timezone.now():
        errors["expires_at"] = ["The expiry must be in the future."]
    active = AccessToken.objects.filter(user=membership.user, team=membership.team, revoked_at__isnull=True)
    if active.count() >= MAX_ACTIVE_PER_MEMBER:
        errors["name"] = [f"You have {MAX_ACTIVE_PER_MEMBER} tokens in this team already: revoke one first."]
    if errors:
        raise ValidationError(errors)
    raw = PREFIX + secrets.token_urlsafe(32)  # 256 random bits
    token = AccessToken.objects.create(user=membership.user, team=membership.team, name=name, role=role,
                                       token_hash=key_hash(raw), last4=raw[-4:], expires_at=expires_at)
    return token, raw


def token_revoke(*, token):
    """Revoke a token (at once: every API request looks its token up). False when it already was."""
    if token.revoked_at:
        return False
    token.revoked_at = timezone.now()
    AccessToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=token.revoked_at)
    return True


def token_membership(raw):
    """(token, membership acting with the token's effective role) for a raw token, or (None, None) when it is
    unknown, revoked, expired, its member left the team or the account is disabled. The membership returned is not
    saved: its `role` is the lower of the two roles."""
    if not isinstance(raw, str) or not raw.startswith(PREFIX) or len(raw) > 200:
        return None, None
    token = AccessToken.objects.select_related("user", "team").filter(token_hash=key_hash(raw)).first()
    if token is None or token.status != "active" or not token.user.is_active:
        return None, None
    membership = Membership.objects.select_related("team", "user").filter(user=token.user, team=token.team).first()
    if membership is None:
        return None, None
    if ROLE_RANK[Role(token.role)] < ROLE_RANK[Role(membership.role)]:
        membership.role = token.role
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > LAST_USED_EVERY_SECONDS:
        AccessToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token, membership


def tokens_of(*, user, team):
    return AccessToken.objects.filter(user=user, team=team)
