"""Team keys: issued once, stored as a SHA-256 and the last four characters. The gateway looks them up through a
short cache (panel/gateway/keys.py)."""
import hashlib
import secrets

from django.core.exceptions import ValidationError
from django.utils import timezone

from panel.accounts.models import TeamKey

PREFIX = "tw-"


def key_hash(raw):
    return hashlib.sha256(raw.encode()).hexdigest()


def key_issue(*, team, user, name, allowed_models=(), rpm_limit=None, tpm_limit=None, expires_at=None):
    """Create a key. Returns (TeamKey, raw key): the raw key exists only in this return value."""
    name = (name or "").strip()
    if not name:
        raise ValidationError("Give the key a name (what uses it).")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError("The expiry must be in the future.")
    raw = PREFIX + secrets.token_urlsafe(32)  # 256 random bits
    key = TeamKey.objects.create(team=team, created_by=user, name=name[:100], key_hash=key_hash(raw),
                                 last4=raw[-4:], allowed_models=sorted(set(allowed_models)), rpm_limit=rpm_limit,
                                 tpm_limit=tpm_limit, expires_at=expires_at)
    return key, raw


def key_revoke(*, key, user=None):
    """Revoke a key (effective in every gateway process within TOKENWISE_KEY_CACHE_SECONDS)."""
    if key.revoked_at:
        return False
    key.revoked_at = timezone.now()
    key.save(update_fields=["revoked_at"])
    return True
