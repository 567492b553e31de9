"""Team keys: issued once, stored as a SHA-256 and the last four characters, looked up through a short cache."""
import hashlib
import secrets
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from panel.gateway.models import TeamKey

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


@dataclass(frozen=True)
class KeyInfo:
    id: int
    team_id: int
    allowed_models: tuple
    rpm_limit: int | None
    tpm_limit: int | None
    expires_at: object
    revoked: bool


class KeyCache:
    """sha256 -> KeyInfo (or None for "no such key"), kept for a few seconds so a request costs no query."""

    def __init__(self):
        self.entries = {}

    def get(self, digest):
        hit = self.entries.get(digest)
        if hit and hit[0] > time.monotonic():
            return hit[1], True
        return None, False

    def put(self, digest, info):
        if len(self.entries) > 50_000:
            self.entries.clear()
        self.entries[digest] = (time.monotonic() + settings.KEY_CACHE_SECONDS, info)


CACHE = KeyCache()


async def key_lookup(raw):
    """KeyInfo for a raw key, or None."""
    digest = key_hash(raw)
    info, hit = CACHE.get(digest)
    if hit:
        return info
    row = await TeamKey.objects.filter(key_hash=digest).values(
        "id", "team_id", "allowed_models", "rpm_limit", "tpm_limit", "expires_at", "revoked_at").afirst()
    info = None if row is None else KeyInfo(
        id=row["id"], team_id=row["team_id"], allowed_models=tuple(row["allowed_models"] or ()),
        rpm_limit=row["rpm_limit"], tpm_limit=row["tpm_limit"], expires_at=row["expires_at"],
        revoked=row["revoked_at"] is not None)
    CACHE.put(digest, info)
    return info
