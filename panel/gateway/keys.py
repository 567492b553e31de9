"""The gateway's view of team keys: a raw key to what a request needs of it, through a cache of a few seconds so
a request costs no query. Keys are issued and revoked in panel/accounts/keys.py."""
import time
from dataclasses import dataclass

from django.conf import settings

from panel.accounts.keys import key_hash
from panel.accounts.models import TeamKey


@dataclass(frozen=True)
class KeyInfo:
    id: int
    team_id: int
    allowed_models: tuple
    rpm_limit: int | None
    tpm_limit: int | None
    expires_at: object
    revoked: bool
    last4: str = ""  # for the log line of a failed request, never the key


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
        "id", "team_id", "allowed_models", "rpm_limit", "tpm_limit", "expires_at", "revoked_at", "last4").afirst()
    info = None if row is None else KeyInfo(
        id=row["id"], team_id=row["team_id"], allowed_models=tuple(row["allowed_models"] or ()),
        rpm_limit=row["rpm_limit"], tpm_limit=row["tpm_limit"], expires_at=row["expires_at"],
        revoked=row["revoked_at"] is not None, last4=row["last4"])
    CACHE.put(digest, info)
    return info
