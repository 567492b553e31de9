"""Channel cooldowns, shared by every gateway process through Redis: after a few consecutive failed requests a
channel rests, and requests try it last; when the rest is over, one request across all processes is let through to
it first (the half-open probe): its success clears the channel, its failure starts another rest.

Per channel, in Redis: `tw:cd:<id>:fails` (consecutive failed requests, any process), `tw:cd:<id>:cool` (present
while the channel rests) and `tw:cd:<id>:probe` (held by the one request that probes it). One script call orders a
request's channels, one counts a failure; a success costs a call only for a channel that has failures on record.

A set of channels with no failure on record is taken as clean without asking Redis again: while the process's
subscription to announcements is live (panel/core/changes.py), until a failure of one of them is announced (the
script that counts a failure announces it); without one, for CLEAN_SECONDS, renewed by a refresher while in use.

When Redis cannot be reached the gateway keeps answering: each process falls back to its own per-process cooldowns
(the behaviour before they were shared) and asks Redis again after REDIS_RETRY_SECONDS."""
import logging
import time

from redis.exceptions import RedisError

from panel.core import changes
from panel.core.redis_client import async_redis
from panel.core.refresher import Refresher

log = logging.getLogger(__name__)

COOLDOWN_AFTER_FAILURES = 3
COOLDOWN_SECONDS = 30.0
PROBE_SECONDS = 60.0  # a probe that never ended (its client left, its process died) frees the channel after this
FAILURES_TTL_SECONDS = 3600  # consecutive failures older than this are forgotten
REDIS_RETRY_SECONDS = 5.0
# Without a live subscription, a set of channels that Redis showed with no failure on record is taken as clean for
# this long without asking again, so a channel that starts failing in another process is seen here this late. While
# requests use the set, a refresher asks Redis every half of it and renews it, so they need no round trip of their own.
CLEAN_SECONDS = 0.5
LIVE_ROUND_SECONDS = 5.0  # the refresher's round while the subscription holds the sets: it only looks for its loss

# KEYS: per channel its fails, cool and probe keys. ARGV: threshold, probe ms.
# Returns per channel: 0 usable, 1 resting (try last), 2 usable and this request is its probe; then failure counts.
ORDER = """
local states, counts = {}, {}
for i = 1, #KEYS, 3 do
  local fails = tonumber(redis.call('GET', KEYS[i]) or '0')
  local state = 0
  if fails >= tonumber(ARGV[1]) then
    if redis.call('EXISTS', KEYS[i + 1]) == 1 then
      state = 1
    elseif redis.call('SET', KEYS[i + 2], '1', 'NX', 'PX', ARGV[2]) then
      state = 2
    else
      state = 1
    end
  end
  table.insert(states, state)
  table.insert(counts, fails)
end
return {states, counts}
"""

# KEYS: fails, cool, probe. ARGV: threshold, cooldown ms, failures ttl s, the changes' channel, the announcement.
# Returns {failures, 1 if a rest began}.
FAILED = """
local fails = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
if fails < tonumber(ARGV[1]) then return {fails, 0} end
local began = redis.call('EXISTS', KEYS[2]) == 0 and 1 or 0
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
redis.call('DEL', KEYS[3])
return {fails, began}
"""


def _keys(channel_id):
    return f"tw:cd:{channel_id}:fails", f"tw:cd:{channel_id}:cool", f"tw:cd:{channel_id}:probe"


class LocalCooldown:
    """Consecutive failures per channel in this process: the fallback while Redis is unreachable."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.failures = {}
        self.until = {}

    def cooled(self, channel_id):
        return self.until.get(channel_id, 0) > time.monotonic()

    def order(self, targets):
        return sorted(targets, key=lambda target: self.cooled(target.id))

    def failed(self, channel_id):
        count = self.failures.get(channel_id, 0) + 1
        self.failures[channel_id] = count
        if count >= COOLDOWN_AFTER_FAILURES:
            began = not self.cooled(channel_id)
            self.until[channel_id] = time.monotonic() + self.seconds
            return count, began
        return count, False

    def succeeded(self, channel_id):
        self.failures.pop(channel_id, None)
        self.until.pop(channel_id, None)


class Cooldown:
    """The cooldowns of every gateway process (Redis), with this process's own as the fallback."""

    def __init__(self, seconds=COOLDOWN_SECONDS, client=None):
        self.seconds = seconds
        self.local = LocalCooldown(seconds)
        self._client = client
        self._scripts = None
        self.redis_down_until = 0.0
        self.on_record = set()  # channels with failures on record in Redis, as this process last saw them
        # tuple of channel ids -> (monotonic time until which it is taken as clean, the live subscription under
        # which Redis showed it clean, which holds it until a failure is announced, or None)
        self.clean_until = {}
        self.failures_seen = 0  # failures counted here or announced: a read that saw one begin holds nothing
        self.refresher = Refresher("channel cooldowns", self.refresh, self.refresh_interval)
        changes.on("cool", self.heard)

    def client(self):
        return self._client if self._client is not None else async_redis()

    def scripts(self):
        client = self.client()
        if self._scripts is None or self._scripts[0] is not client:
            self._scripts = (client, client.register_script(ORDER), client.register_script(FAILED))
        return self._scripts

    def redis_usable(self):
        return time.monotonic() >= self.redis_down_until

    def redis_failed(self, error):
        if self.redis_usable():
            log.warning("channel cooldowns unreadable in Redis (%s); this process keeps its own for %g s",
                        type(error).__name__, REDIS_RETRY_SECONDS)
        self.redis_down_until = time.monotonic() + REDIS_RETRY_SECONDS

    async def order(self, targets):
        """Resting channels go last: they are tried only when everything else failed. A channel whose rest is over
        goes first for exactly one request across all processes (its probe); for the others it still rests."""
        targets = list(targets)
        if not targets or not self.redis_usable():
            return self.local.order(targets)
        ids = tuple(target.id for target in targets)
        now, token, seen = time.monotonic(), changes.token(), self.failures_seen
        self.refresher.touch(ids)
        clean = self.clean_until.get(ids)
        if clean is not None and (clean[0] > now or changes.holds(clean[1], token)):
            return targets
        keys = [name for target in targets for name in _keys(target.id)]
        try:
            states, counts = await self.scripts()[1](
                keys=keys, args=[COOLDOWN_AFTER_FAILURES, int(PROBE_SECONDS * 1000)])
        except (RedisError, OSError) as error:
            self.redis_failed(error)
            return self.local.order(targets)
        for target, count in zip(targets, counts):
            if int(count):
                self.on_record.add(target.id)
            else:
                self.on_record.discard(target.id)
        if not any(int(count) for count in counts) and seen == self.failures_seen:
            self.taken_clean(ids, time.monotonic(), token)
        resting = {target.id for target, state in zip(targets, states) if int(state) == 1}
        return sorted(targets, key=lambda target: target.id in resting)

    def taken_clean(self, ids, since, token=None):
        if len(self.clean_until) > 10_000:
            self.clean_until.clear()
        self.clean_until[ids] = (since + CLEAN_SECONDS, token)

    def heard(self, ident):
        """A failure announced by any process (this one's too): no set is taken as clean any more."""
        self.failures_seen += 1
        self.clean_until.clear()
        self.on_record.add(int(ident))

    def refresh_interval(self):
        return CLEAN_SECONDS / 2 if changes.token() is None else LIVE_ROUND_SECONDS

    async def refresh(self):
        """The refresher's round: the failure counts of the channels of every set ordered lately and not held by
        the live subscription, in one Redis call; a set with none on record is taken as clean (held by the
        subscription, or for another CLEAN_SECONDS without one), any other is dropped (its next request runs the
        ordering script, probes and rests included)."""
        now, token = time.monotonic(), changes.token()
        sets = [ids for ids in self.refresher.in_use()
                if not changes.holds(self.clean_until.get(ids, (0, None))[1], token)]
        if not sets or not self.redis_usable():
            return
        channels = sorted({channel_id for ids in sets for channel_id in ids})
        failures_before = self.failures_seen
        try:
            counts = await self.client().mget([_keys(channel_id)[0] for channel_id in channels])
        except (RedisError, OSError) as error:
            self.redis_failed(error)
            return
        if self.failures_seen != failures_before:
            return  # a failure was counted meanwhile: what Redis said may not show it
        failing = {channel_id for channel_id, count in zip(channels, counts) if int(count or 0)}
        self.on_record |= failing
        for ids in sets:
            if failing.intersection(ids):
                self.clean_until.pop(ids, None)
            else:
                self.taken_clean(ids, now, token)

    async def failed(self, channel_id):
        """Count a failed request: (consecutive failures, True when it starts a rest)."""
        self.failures_seen += 1
        self.clean_until.clear()
        if self.redis_usable():
            try:
                failures, began = await self.scripts()[2](
                    keys=_keys(channel_id), args=[COOLDOWN_AFTER_FAILURES, int(self.seconds * 1000),
                                                  FAILURES_TTL_SECONDS, changes.CHANNEL, f"cool:{channel_id}"])
                self.on_record.add(channel_id)
                return int(failures), bool(int(began))
            except (RedisError, OSError) as error:
                self.redis_failed(error)
        return self.local.failed(channel_id)

    async def succeeded(self, channel_id):
        """A channel answered: its failures are forgotten and a rest (or probe) ends, in every process."""
        self.local.succeeded(channel_id)
        if channel_id not in self.on_record or not self.redis_usable():
            return
        try:
            await self.client().delete(*_keys(channel_id))
            self.on_record.discard(channel_id)
        except (RedisError, OSError) as error:
            self.redis_failed(error)


COOLDOWN = Cooldown()
