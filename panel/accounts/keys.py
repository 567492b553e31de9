"""Team keys: issued once, stored as a SHA-256 and the last four characters. The gateway looks them up through a
short cache (panel/gateway/keys.py). Admins issue and revoke any key; members their own, where the team lets them,
within its per-minute caps."""
import hashlib
import secrets

from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from panel.accounts.models import TeamKey
from panel.accounts.roles import may

PREFIX = "tw-"


def key_hash(raw):
    return hashlib.sha256(raw.encode()).hexdigest()


def key_issue(*, team, user, name, allowed_models=(), rpm_limit=None, tpm_limit=None, expires_at=None,
              fit_to_budget=False):
    """Create a key. Returns (TeamKey, raw key): the raw key exists only in this return value."""
    name = (name or "").strip()
    if not name:
        raise ValidationError("Give the key a name (what uses it).")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError("The expiry must be in the future.")
    raw = PREFIX + secrets.token_urlsafe(32)  # 256 random bits
    key = TeamKey.objects.create(team=team, created_by=user, name=name[:100], key_hash=key_hash(raw),
                                 last4=raw[-4:], allowed_models=sorted(set(allowed_models)), rpm_limit=rpm_limit,
                                 tpm_limit=tpm_limit, expires_at=expires_at, fit_to_budget=fit_to_budget)
    return key, raw


def member_key_limits(team, *, rpm_limit, tpm_limit):
    """(requests, tokens) per minute of a key a member issues for themselves: the team's caps where the member gave
    none. PermissionDenied where the team does not let members issue keys, ValidationError where a limit is over
    its cap, both in words."""
    if not team.member_keys:
        raise PermissionDenied("Only this team's admins issue keys. An admin can let members issue their own keys "
                               "on Gateway keys.")
    limits = []
    for given, cap, unit in ((rpm_limit, team.member_key_rpm_limit, "requests"),
                             (tpm_limit, team.member_key_tpm_limit, "tokens")):
        if cap is not None and given is not None and given > cap:
            raise ValidationError(f"A key a member issues allows at most {cap:,} {unit} per minute in this team.")
        limits.append(given if given is not None else cap)
    return tuple(limits)


def member_keys_set(*, team, allowed, rpm_limit=None, tpm_limit=None):
    """Let members issue their own keys (or not), with the most each may allow per minute (None: no cap)."""
    team.member_keys, team.member_key_rpm_limit, team.member_key_tpm_limit = allowed, rpm_limit, tpm_limit
    team.save(update_fields=["member_keys", "member_key_rpm_limit", "member_key_tpm_limit"])


def key_issue_as(*, membership, user, name, allowed_models=(), rpm_limit=None, tpm_limit=None, expires_at=None,
                 fit_to_budget=False):
    """Issue a key as `membership` may: an admin any key; a member one of their own, where the team lets members,
    within its caps (member_key_limits). Returns (TeamKey, raw key); ValidationError in words."""
    if not may(membership, "keys.manage"):
        rpm_limit, tpm_limit = member_key_limits(membership.team, rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    return key_issue(team=membership.team, user=user, name=name, allowed_models=allowed_models, rpm_limit=rpm_limit,
                     tpm_limit=tpm_limit, expires_at=expires_at, fit_to_budget=fit_to_budget)


def key_revoke_as(*, membership, user, key):
    """Revoke `key` as `membership` may: an admin any key of the team, a member the keys they issued."""
    if not may(membership, "keys.manage") and key.created_by_id != user.pk:
        raise PermissionDenied("A member revokes only the keys they issued; an admin revokes the others.")
    return key_revoke(key=key, user=user)


def key_revoke(*, key, user=None):
    """Revoke a key (effective in every gateway process within TOKENWISE_KEY_CACHE_SECONDS)."""
    if key.revoked_at:
        return False
    key.revoked_at = timezone.now()
    key.save(update_fields=["revoked_at"])
    return True
