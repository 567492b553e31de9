"""Spill to the cloud on overload (`Route.spill_wait_ms`): a request whose first channel is a local engine that
would keep it waiting longer than the route's spill wait goes to the route's remote channels first instead of
queueing there; the local channels stay behind them as fallbacks.

The expected wait is the requests in flight on the engine beyond its batch slots (the profile's max_num_seqs), this
one included, × the engine's measured time per request ÷ the slots (the slots free up in parallel). In flight: the
Redis sets that gateway/balancing.py keeps (`tw:inflight:<channel>`), shared by every gateway process; a route that
balances replicas has counted the request on its replica already, any other route counts it here. Time per
request: a moving average of the engine's recent answers (`tw:reqtime:<channel>`, milliseconds, each new answer
weighing REQTIME_WEIGHT), written when a request it answered ends.

An engine is a local channel's deployment or a vLLM pool's engines (ENGINE_KINDS: a pool's batch slots are set on its
channel). No spill when the route's first channel is no engine, no cloud channel follows it, the request is in a
canary's arm (the canary compares its candidate), nothing is measured yet, or Redis is unreachable. A spilled
request's usage row says `spilled`; its attempt trail starts with the engine's "spilled" step and the wait it
avoided. If the remote channels fail and the request falls back to the engine, it is not counted there."""
import logging
import time

from redis.exceptions import RedisError

from panel.channels.models import ChannelKind
from panel.core.redis_client import async_redis
from panel.gateway.balancing import BALANCER, STALE_SECONDS, Lease, inflight_key

log = logging.getLogger(__name__)

ENGINE_KINDS = (ChannelKind.LOCAL, ChannelKind.POOL)  # the channels whose engines the spill rule measures
REQTIME_WEIGHT = 0.2  # of the newest answer in the moving average
REQTIME_TTL_SECONDS = 3600  # an engine unused this long is measured afresh

# KEYS: the engine's in-flight set, its time per request. ARGV: now ms, stale ms, request id, add (1: count this
# request here). Returns {in flight, this one included; time per request in ms or false}.
LOOK = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[2]))
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return {redis.call('ZCARD', KEYS[1]), redis.call('GET', KEYS[2])}
"""

# KEYS: the engine's time per request. ARGV: this answer's ms, weight, ttl s.
OBSERVE = """
local old = tonumber(redis.call('GET', KEYS[1]))
local value = tonumber(ARGV[1])
if old then value = old + tonumber(ARGV[2]) * (value - old) end
redis.call('SET', KEYS[1], tostring(value), 'EX', tonumber(ARGV[3]))
return tostring(value)
"""


def reqtime_key(channel_id):
    return f"tw:reqtime:{channel_id}"


def expected_wait_ms(in_flight, slots, per_request_ms):
    """How long a request waits for a batch slot: the requests beyond the slots (this one included) × the time per
    request ÷ the slots; 0 while a slot is free."""
    waiting = in_flight - max(int(slots or 1), 1)
    return waiting * per_request_ms / max(int(slots or 1), 1) if waiting > 0 else 0.0


def spill_order(targets):
    """The cloud channels first, in their order, then the engines (local channels and vLLM pools)."""
    remote = [target for target in targets if target.channel.kind not in ENGINE_KINDS]
    return remote + [target for target in targets if target.channel.kind in ENGINE_KINDS]


class Spill:
    def __init__(self, client=None):
        self._client = client
        self._scripts = None

    def client(self):
        return self._client if self._client is not None else async_redis()

    def scripts(self):
        client = self.client()
        if self._scripts is None or self._scripts[0] is not client:
            self._scripts = (client, client.register_script(LOOK), client.register_script(OBSERVE))
        return self._scripts[1:]

    async def place(self, route, targets, *, lease, request_id, fields, trail):
        """(targets in the order to try, the lease the request holds). `lease` is the balancer's (or None); when
        the request is counted on the engine here, the returned lease is that one; when it spills, None."""
        if not route.spill_wait_ms or not targets or fields.get("canary"):
            return targets, lease
        engine = targets[0]
        if engine.batch_slots is None or not any(t.channel.kind not in ENGINE_KINDS for t in targets[1:]):
            return targets, lease
        counted = lease is not None and lease.key == inflight_key(engine.id)
        look, _ = self.scripts()
        try:
            in_flight, per_request = await look(
                keys=[inflight_key(engine.id), reqtime_key(engine.id)],
                args=[int(time.time() * 1000), STALE_SECONDS * 1000, request_id, "0" if counted else "1"])
        except (RedisError, OSError) as error:
            log.debug("no spill check without Redis (%s)", type(error).__name__)
            return targets, lease
        own = lease if counted else Lease(inflight_key(engine.id), request_id)
        wait = expected_wait_ms(int(in_flight), engine.batch_slots, float(per_request)) if per_request else 0.0
        if wait <= route.spill_wait_ms:
            return targets, own
        await BALANCER.release(own)
        fields["spilled"] = True
        trail.append({"channel": engine.name, "channel_id": engine.id, "outcome": "spilled", "ms": 0,
                      "status": None, "expected_wait_ms": round(wait)})
        return spill_order(targets), None

    async def observe(self, target, latency_ms):
        """A request the engine `target` answered took `latency_ms`: fold it into its time per request."""
        _, observe = self.scripts()
        try:
            await observe(keys=[reqtime_key(target.id)], args=[round(latency_ms, 1), REQTIME_WEIGHT,
                                                                REQTIME_TTL_SECONDS])
        except (RedisError, OSError) as error:
            log.debug("time per request not kept (%s)", type(error).__name__)


SPILL = Spill()
