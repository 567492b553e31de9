"""Balancing a route's replicas: which of its interchangeable local channels (the leading local channels of the
strategy's order, a deployment's replicas) a request goes to first, by the route's policy, and in which order the
others take over when it fails before the answer starts.

Policies: round-robin (one counter per route, shared by every gateway process); least in flight; session affinity
(the route's header, else an Anthropic body's metadata.user_id, else the key: one session stays on one replica);
prefix-aware (a rendezvous hash of the prompt's leading part, the tools and the system prompt, so the requests that
share a long prefix meet the engine that has it cached), with bounded load: a request spills to the least-loaded
replica when its own would have more than LOAD_FACTOR × the mean in flight, plus LOAD_SLACK.

In-flight counts are Redis sorted sets shared by every gateway process (`tw:inflight:<channel>`: request id ->
start time), so a request a crashed process never released leaves them after STALE_SECONDS. One script call
places a request (reads the counts, picks, adds the request to its replica); one removes it when the request ends.
When Redis cannot be reached, each process balances on its own: its own round-robin counter, the hash without the
load bound, and no in-flight counts.

A replica that fails is not retried: the next replica is the retry (attempts.py tries the targets in order), so a
request that has not sent a byte to its client moves on at once."""
import hashlib
import itertools
import logging
import time
from dataclasses import dataclass, replace

from redis.exceptions import RedisError

from panel.channels.models import ChannelKind, RouteBalance
from panel.core.redis_client import async_redis
from panel.gateway.kv_placement import kv_choice

log = logging.getLogger(__name__)

LOAD_FACTOR = 1.25  # consistent hashing with bounded loads: at most this × the mean in flight before spilling
LOAD_SLACK = 1  # ... plus one: with a handful in flight, one tenant's burst of two stays on its cached replica
STALE_SECONDS = 900  # longer than a channel's longest attempt (600 s by default): an entry older is a lost release
HELD_SECONDS = 600  # a prefix unused this long is forgotten by its replica's share (its KV blocks are likely gone)
PREFIX_CHARS = 8192  # how much of the leading text the prefix hash reads (tools + system prompt, or the prompt)

POLICIES = {RouteBalance.ROUND_ROBIN: 1, RouteBalance.LEAST_IN_FLIGHT: 2, RouteBalance.SESSION_AFFINITY: 3,
            RouteBalance.PREFIX_AWARE: 4, RouteBalance.KV_EVENTS: 4}
KV_PLACED = 5  # the script's policy for a request whose prefix an engine's own events place (gateway/kv_placement.py)

# KEYS: each replica's in-flight set, each replica's held-prefixes set, the route's round-robin counter.
# ARGV: now ms, stale ms, request id, policy (POLICIES), load factor, load slack, the prefix digest, held ms, then
# the replicas' preferred order (1-based). Returns {chosen index, in-flight count of each replica before this one}.
PLACE = """
local n = (#KEYS - 1) / 2
local now, stale = tonumber(ARGV[1]), tonumber(ARGV[2])
local policy = tonumber(ARGV[4])
local counts, total = {}, 0
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - stale)
  counts[i] = redis.call('ZCARD', KEYS[i])
  total = total + counts[i]
end
local function turn()
  local value = redis.call('INCR', KEYS[2 * n + 1])
  redis.call('PEXPIRE', KEYS[2 * n + 1], stale)
  return (value - 1) % n + 1
end
local function least(first)
  local best = first
  for step = 0, n - 1 do
    local i = (first - 1 + step) % n + 1
    if counts[i] < counts[best] then best = i end
  end
  return best
end
local chosen = tonumber(ARGV[9])
if policy == 1 then
  chosen = turn()
elseif policy == 2 then
  chosen = least(turn())
elseif policy == 4 or policy == 5 then
  -- The prefix's home: the replica that holds it, else its preferred one unless that holds its share of the
  -- prefixes already (then the one holding fewest), so tenants split evenly and stay where their cache is.
  -- Placed by an engine's KV events (5): the replica whose engine holds the longest prefix is its home.
  local held_ms, digest = tonumber(ARGV[8]), ARGV[7]
  local held, held_total, holder = {}, 0, nil
  for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[n + i], '-inf', now - held_ms)
    held[i] = redis.call('ZCARD', KEYS[n + i])
    held_total = held_total + held[i]
    if not holder and redis.call('ZSCORE', KEYS[n + i], digest) then holder = i end
  end
  if policy == 5 then
    for i = 1, n do
      if i ~= chosen then redis.call('ZREM', KEYS[n + i], digest) end
    end
  elseif holder then
    chosen = holder
  else
    local share = math.ceil((held_total + 1) / n)
    if held[chosen] + 1 > share then
      for k = 9, #ARGV do
        local i = tonumber(ARGV[k])
        if held[i] < held[chosen] then chosen = i end
      end
    end
  end
  redis.call('ZADD', KEYS[n + chosen], now, digest)
  redis.call('PEXPIRE', KEYS[n + chosen], held_ms)
  -- This request alone spills when its home is well above the mean in flight (the prefix stays at home).
  local bound = math.ceil(tonumber(ARGV[5]) * (total + 1) / n) + tonumber(ARGV[6])
  if counts[chosen] + 1 > bound then
    local best = chosen
    for k = 9, #ARGV do
      local i = tonumber(ARGV[k])
      if counts[i] < counts[best] then best = i end
    end
    chosen = best
  end
end
redis.call('ZADD', KEYS[chosen], now, ARGV[3])
redis.call('PEXPIRE', KEYS[chosen], stale)
return {chosen, counts}
"""


@dataclass(frozen=True)
class Lease:
    """A request counted in flight on one replica until `release`."""

    key: str
    member: str


def inflight_key(channel_id):
    return f"tw:inflight:{channel_id}"


def held_key(channel_id):
    """The prefixes a replica is home to (digest -> last use), for prefix-aware placement."""
    return f"tw:held:{channel_id}"


def pool_size(targets):
    """How many of the leading targets are local channels: the replicas a policy spreads over."""
    return sum(1 for _ in itertools.takewhile(lambda target: target.channel.kind == ChannelKind.LOCAL, targets))


def _text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict)
                       and isinstance(part.get("text"), str))
    return ""


def prefix_text(body):
    """The prompt's leading part that many requests share: the tools and the system prompt (OpenAI system or
    developer messages at the start, or Anthropic's `system`), else the first message; a completions prompt's
    start. At most PREFIX_CHARS characters."""
    parts = [str(body.get("tools") or "")[:PREFIX_CHARS]] if body.get("tools") else []
    if "system" in body:
        parts.append(_text(body["system"]))
    messages = body.get("messages")
    if isinstance(messages, list):
        leading = list(itertools.takewhile(
            lambda message: isinstance(message, dict) and message.get("role") in ("system", "developer"), messages))
        parts.extend(_text(message.get("content")) for message in leading)
        if not leading and "system" not in body and messages and isinstance(messages[0], dict):
            parts.append(_text(messages[0].get("content")))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt[:PREFIX_CHARS])
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        parts.append(prompt[0][:PREFIX_CHARS])
    return "\x1f".join(parts)[:PREFIX_CHARS]


def _header(headers, wanted):
    wanted = wanted.lower().encode("latin-1")
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("latin-1").strip()
    return ""


def affinity_text(body, headers, *, header_name, key_id):
    """What keeps a session on one replica: the route's header, else metadata.user_id, else the key."""
    named = _header(headers, header_name) if header_name else ""
    if not named:
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        named = user_id if isinstance(user_id, str) else ""
    return named or f"key:{key_id}"


def prefix_digest(text):
    """A short hash of a prompt's prefix (or a session's key): what Redis holds, never the text."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def rendezvous(digest, pool):
    """The pool's indexes, best first, for a prefix digest (highest random weight hashing: a replica that comes or
    goes moves only its own share of the prefixes)."""
    key = bytes.fromhex(digest)

    def weight(index):
        return hashlib.blake2b(str(pool[index].id).encode(), key=key, digest_size=8).digest()

    return sorted(range(len(pool)), key=weight, reverse=True)


class Balancer:
    """The in-flight counts and round-robin counters of every gateway process (Redis), and this process's own
    round-robin turns as the fallback."""

    def __init__(self, client=None, held_seconds=HELD_SECONDS):
        self._client = client
        self._script = None
        self.held_seconds = held_seconds
        self.turns = {}  # route id -> this process's round-robin counter, used while Redis is unreachable

    def client(self):
        return self._client if self._client is not None else async_redis()

    def script(self):
        client = self.client()
        if self._script is None or self._script[0] is not client:
            self._script = (client, client.register_script(PLACE))
        return self._script[1]

    async def place(self, route, targets, *, body, headers, key_id, request_id, trail=None, api="chat"):
        """(targets in the order to try, Lease or None). Only the leading local channels are reordered. A route
        balanced by KV events adds a step to `trail` (the request's attempt trail) saying how it placed."""
        policy = route.balance
        if policy not in POLICIES:
            return targets, None
        # A canary's candidate, when this request is in its arm, stays first: it is compared with the route.
        head = targets[:1] if targets and route.canary is not None and targets[0] is route.canary else []
        size = pool_size(targets[len(head):])
        if size < 2:
            return targets, None
        pool, rest = targets[len(head):len(head) + size], targets[len(head) + size:]
        digest, code, kv = "", POLICIES[policy], None
        if policy in (RouteBalance.PREFIX_AWARE, RouteBalance.KV_EVENTS):
            digest = prefix_digest(prefix_text(body))
            preferred = rendezvous(digest, pool)
            if policy == RouteBalance.KV_EVENTS:
                kv = await kv_choice(pool, body, api)
                if kv.index is not None:
                    code, preferred = KV_PLACED, [kv.index, *(index for index in preferred if index != kv.index)]
        elif policy == RouteBalance.SESSION_AFFINITY:
            preferred = rendezvous(prefix_digest(affinity_text(body, headers, header_name=route.affinity_header,
                                                             key_id=key_id)), pool)
        else:
            preferred = list(range(size))
        keys = ([inflight_key(target.id) for target in pool] + [held_key(target.id) for target in pool]
                + [f"tw:rr:{route.route_id}"])
        try:
            chosen, counts = await self.script()(keys=keys, args=[
                int(time.time() * 1000), STALE_SECONDS * 1000, request_id, code, LOAD_FACTOR,
                LOAD_SLACK, digest, int(self.held_seconds * 1000), *(index + 1 for index in preferred)])
            chosen -= 1
            counts = [int(count) for count in counts]
            lease = Lease(keys[chosen], request_id)
        except (RedisError, OSError) as error:
            log.debug("replica balancing without Redis (%s)", type(error).__name__)
            chosen, counts, lease = self._local_choice(route, policy, preferred), [0] * size, None
        if kv is not None and trail is not None:
            words = kv.words if kv.index in (None, chosen) else f"{kv.words}; sent on by the load bound"
            trail.append({"channel": pool[kv.index if kv.index is not None else chosen].name,
                          "channel_id": pool[kv.index if kv.index is not None else chosen].id,
                          "outcome": kv.outcome, "ms": 0, "status": None, "note": words,
                          "blocks": list(kv.blocks)})
        return head + arrange(pool, preferred, chosen, counts) + rest, lease

    def _local_choice(self, route, policy, preferred):
        if policy in (RouteBalance.ROUND_ROBIN, RouteBalance.LEAST_IN_FLIGHT):
            turn = self.turns.get(route.route_id, 0)
            self.turns[route.route_id] = turn + 1
            return preferred[turn % len(preferred)]
        return preferred[0]

    async def release(self, lease):
        """The request has ended: it no longer counts in flight on its replica."""
        if lease is None:
            return
        try:
            await self.client().zrem(lease.key, lease.member)
        except (RedisError, OSError) as error:  # the entry goes stale after STALE_SECONDS instead
            log.debug("in-flight entry not released (%s)", type(error).__name__)


def arrange(pool, preferred, chosen, counts):
    """The pool in the order to try: the chosen replica, then the others by fewest in flight, then by preference.
    Each is tried once (no retries on the same replica: the next one is the retry)."""
    rank = {index: position for position, index in enumerate(preferred)}
    others = sorted((index for index in range(len(pool)) if index != chosen),
                    key=lambda index: (counts[index], rank[index]))
    return [replace(pool[index], max_retries=0) for index in [chosen, *others]]


BALANCER = Balancer()

