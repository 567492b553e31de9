"""The gateway's view of team keys: a raw key to what a request needs of it, through a cache of a few seconds so
a request costs no query. While a key is in use, a refresher (panel/core/refresher.py) reads it again before its
entry expires, so its requests never wait on the query either. Keys are issued and revoked in
panel/accounts/keys.py."""
import time
from dataclasses import dataclass

from django.conf import settings

from panel.accounts.keys import key_hash
from panel.accounts.models import TeamKey
from panel.core.refresher import Refresher


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
    fit_to_budget: bool = False  # lower max_tokens to what a budget has left instead of a 402


KNOWN_KEYS_CACHED = 50_000  # far more keys than an installation issues; only the oldest entry leaves past it
UNKNOWN_KEYS_CACHED = 1_000  # a client retrying with a wrong key costs no query; a flood of random keys stays here


class KeyCache:
    """sha256 -> KeyInfo, kept for a few seconds so a request costs no query. "No such key" answers are kept apart
    in a small table of their own (the oldest leaves first): random keys, which anyone can send, never evict the
    keys of real clients."""

    def __init__(self):
        self.known = {}
        self.unknown = {}

    def get(self, digest):
        hit = self.known.get(digest)
        if hit is not None:
            REFRESHER.touch(digest)
        else:
            hit = self.unknown.get(digest)
        if hit and hit[0] > time.monotonic():
            return hit[1], True
        return None, False

    def due(self, within):
        """The digests of the keys used lately whose entries expire within `within` seconds."""
        now = time.monotonic()
        return [digest for digest in REFRESHER.in_use()
                if digest in self.known and self.known[digest][0] - now < within]

    def put(self, digest, info):
        entries, bound = (self.unknown, UNKNOWN_KEYS_CACHED) if info is None else (self.known, KNOWN_KEYS_CACHED)
        self.known.pop(digest, None)
        self.unknown.pop(digest, None)  # a key deleted or issued since: one answer, in its table
        entries[digest] = (time.monotonic() + settings.KEY_CACHE_SECONDS, info)
        while len(entries) > bound:
            entries.pop(next(iter(entries)))  # the oldest: dicts keep insertion order


FIELDS = ("id", "team_id", "allowed_models", "rpm_limit", "tpm_limit", "expires_at", "revoked_at", "last4",
          "fit_to_budget", "key_hash")


def key_info(row):
    return KeyInfo(id=row["id"], team_id=row["team_id"], allowed_models=tuple(row["allowed_models"] or ()),
                   rpm_limit=row["rpm_limit"], tpm_limit=row["tpm_limit"], expires_at=row["expires_at"],
                   revoked=row["revoked_at"] is not None, last4=row["last4"], fit_to_budget=row["fit_to_budget"])


async def key_lookup(raw):
    """KeyInfo for a raw key, or None."""
    digest = key_hash(raw)
    info, hit = CACHE.get(digest)
    if hit:
        return info
    row = await TeamKey.objects.filter(key_hash=digest).values(*FIELDS).afirst()
    info = None if row is None else key_info(row)
    CACHE.put(digest, info)
    return info


async def _refresh():
    """The refresher's round: the keys in use whose entries expire before the round after next, read again in one
    query (a key deleted since is cached as unknown)."""
    due = CACHE.due(2 * _refresh_interval())
    if not due:
        return
    found = {row["key_hash"]: key_info(row) async for row in TeamKey.objects.filter(key_hash__in=due).values(*FIELDS)}
    for digest in due:
        CACHE.put(digest, found.get(digest))


def _refresh_interval():
    """A fifth of the cache's time: a key is read again about a second before its entry would expire."""
    return settings.KEY_CACHE_SECONDS / 5


CACHE = KeyCache()
REFRESHER = Refresher("team keys", _refresh, _refresh_interval)
