"""A web process's advance on a key's per-minute limits and budgets: most requests of a key with a limit or a budget
are admitted in memory, without waiting on Redis (decision 0100).

An advance is taken from Redis, off any request's path, in one script call: it counts requests in the key's minute
window and holds tokens in the window's token counter, and holds money and tokens against each of the budgets the
key's requests spend from, in the same held counters that requests in flight use. Every process sees it as held, so a
budget still cannot be overshot: a request whose most fits what is left of its process's advance takes it from there
(its `Reservation.pool` is the advance), and one that does not fit, or the first requests of a key, go through the
admission script as before (gateway/admission.py). An advance is at most a tenth of what each limit has left when it is
taken, and none is taken when that does not cover one request: near a limit every request is judged by the script,
exactly. When a request ends, what it used stays spent and the rest of its hold goes back to the advance.

The window's part lapses with its minute (a new minute's is taken when a request needs it); the budget's part lasts
while the key is busy. An advance unused for TOKENWISE_GATEWAY_ADVANCE_IDLE_SECONDS (5), of a past month, or taken
under limits that have changed since, is given back in one call (what no request holds; requests in flight give back
their own holds when they end). A process that dies keeps its advance held until the held counters expire (an hour
after the key's last request), as requests in flight do; while another process holds an advance, a request may be
refused up to that much (a tenth of what was left, at most) before a limit is reached."""
import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from panel.budgets import reservations
from panel.core.redis_client import registered_script
from panel.gateway import rate_limits

log = logging.getLogger(__name__)

SHARE = 10  # an advance is at most this fraction (1/SHARE) of what each limit has left
REQUESTS = 16  # an advance asks for this many requests' worth of each limit
SWEEP_SECONDS = 1.0
WINDOW_SECONDS = 120  # a minute window's counters expire after two minutes, as the admission script sets them

# KEYS: the window's request and token counters (when the key has per-minute limits), then each budget scope's money
# and tokens counters, then each scope's held money and tokens. ARGV[1]: JSON {rate_keys, rpm, tpm, budgets: [[money
# units, tokens] as strings, "" for none], want: [requests, window tokens, money units, tokens], least: the same for
# one request (none of it is taken unless each part covers that), held_ttl}. Takes the smaller of what is wanted and a
# tenth of what each limit has left; returns [requests, window tokens, money units, tokens] taken, all 0 when none.
TAKE = """
local ask = cjson.decode(ARGV[1])
local share = ask.share
local function part(want, limit, used)
  if limit == '' or limit == 0 then return want end
  local left = tonumber(limit) - used
  if left <= 0 then return 0 end
  return math.min(want, math.floor(left / share))
end
local requests, window, money, tokens = ask.want[1], ask.want[2], ask.want[3], ask.want[4]
local used = 0
if ask.rate_keys > 0 then
  requests = part(requests, ask.rpm, tonumber(redis.call('GET', KEYS[1]) or '0'))
  window = part(window, ask.tpm, tonumber(redis.call('GET', KEYS[2]) or '0'))
  used = 2
end
local scopes = #ask.budgets
for i, limits in ipairs(ask.budgets) do
  local spent_money = tonumber(redis.call('GET', KEYS[used + 2 * i - 1]) or '0')
  local spent_tokens = tonumber(redis.call('GET', KEYS[used + 2 * i]) or '0')
  local held_money = tonumber(redis.call('GET', KEYS[used + 2 * scopes + 2 * i - 1]) or '0')
  local held_tokens = tonumber(redis.call('GET', KEYS[used + 2 * scopes + 2 * i]) or '0')
  money = part(money, limits[1], spent_money + held_money)
  tokens = part(tokens, limits[2], spent_tokens + held_tokens)
end
if requests < ask.least[1] or window < ask.least[2] or money < ask.least[3] or tokens < ask.least[4] then
  return {0, 0, 0, 0}
end
if ask.rate_keys > 0 then
  if requests > 0 then
    redis.call('INCRBY', KEYS[1], requests)
    redis.call('EXPIRE', KEYS[1], ask.window_ttl)
  end
  if window > 0 then
    redis.call('INCRBY', KEYS[2], window)
    redis.call('EXPIRE', KEYS[2], ask.window_ttl)
  end
end
for i = used + 2 * scopes + 1, used + 4 * scopes, 2 do
  redis.call('INCRBY', KEYS[i], money)
  redis.call('INCRBY', KEYS[i + 1], tokens)
  redis.call('EXPIRE', KEYS[i], ask.held_ttl)
  redis.call('EXPIRE', KEYS[i + 1], ask.held_ttl)
end
return {requests, window, money, tokens}
"""

# KEYS: the window's request and token counters (or none), then each scope's held money and tokens. ARGV: requests,
# window tokens, money units, tokens given back.
GIVE_BACK = """
local used = 0
if #KEYS % 2 == 0 and tonumber(ARGV[5]) == 1 then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  redis.call('DECRBY', KEYS[2], ARGV[2])
  used = 2
end
for i = used + 1, #KEYS, 2 do
  redis.call('DECRBY', KEYS[i], ARGV[3])
  redis.call('DECRBY', KEYS[i + 1], ARGV[4])
end
return 0
"""


@dataclass
class Need:
    """What one request takes of an advance: a request in the window (when the key has a requests-per-minute limit),
    its most in the window's tokens (a tokens-per-minute limit), its maximum in money units and tokens (budgets)."""

    requests: int
    window_tokens: int
    money: int
    tokens: int


@dataclass
class Advance:
    """One process's advance on one key's limits, for requests that spend from the budgets `scopes`. The window's
    part (`requests`, `window_tokens` left) is of minute `minute`; `money`, `tokens` are left of the budgets' part,
    of which `money_held`, `tokens_held` are held in Redis (what is left plus what requests in flight took)."""

    slot: tuple  # (key id, the scopes' identities)
    month: str
    terms: tuple  # the limits it was taken under: (rpm, tpm, the scopes' limits); others than the key's now: given back
    window_keys: tuple  # (requests, tokens) of `minute`, or () for a key without per-minute limits
    held_keys: tuple  # money then tokens held, per scope
    counter_keys: tuple  # money then tokens spent, per scope
    minute: int = 0
    requests: int = 0
    window_tokens: int = 0
    money: int = 0
    tokens: int = 0
    money_held: int = 0
    tokens_held: int = 0
    live: bool = True
    used_at: float = field(default_factory=time.monotonic)
    topping_up: bool = False

    def covers(self, need, minute):
        windowed = bool(self.window_keys)
        return (self.live and (not windowed or self.minute == minute)
                and self.requests >= need.requests and self.window_tokens >= need.window_tokens
                and self.money >= need.money and self.tokens >= need.tokens)

    def take(self, need):
        self.requests -= need.requests
        self.window_tokens -= need.window_tokens
        self.money -= need.money
        self.tokens -= need.tokens
        self.used_at = time.monotonic()

    def low(self, need, minute):
        """Whether it is worth topping up: it would not cover a few more requests like this one."""
        ahead = Need(*(4 * value for value in (need.requests, need.window_tokens, need.money, need.tokens)))
        return not self.topping_up and not (self.covers(ahead, minute))

    # What a request of this advance gives back when it ends (budgets.count, rate_limits.count_tokens).

    def settle(self, held_money, held_tokens, money, tokens):
        """A request that held (`held_money`, `held_tokens`) of this advance spent (`money`, `tokens`): the rest goes
        back to the advance. Returns what is to be released from Redis's held counters: what it spent (its hold as
        a whole when the advance was given back since: then nothing of it is the advance's any more)."""
        if not self.live:
            return held_money, held_tokens
        spent_money, spent_tokens = min(money, held_money), min(tokens, held_tokens)
        self.money += held_money - spent_money
        self.tokens += held_tokens - spent_tokens
        self.money_held -= spent_money
        self.tokens_held -= spent_tokens
        return spent_money, spent_tokens

    def window_back(self, minute, tokens):
        """Window tokens a request held and did not use: back to the advance, while it is of that minute. Returns
        whether it took them (else they lapse with the window, as the advance's part does)."""
        if self.live and self.window_keys and self.minute == minute:
            self.window_tokens += tokens
            return True
        return False


_advances = {}  # (key id, the scopes' identities) -> Advance
_seen = {}  # (key id, scopes) -> when a request of it was last admitted by the script
_sweeper = None
_pending = set()


def find(key_id, scope_ids, month, terms):
    """This process's live advance for a key's requests spending from `scope_ids` this `month` under `terms`; one
    of another month or other terms is given back."""
    found = _advances.get((key_id, scope_ids))
    if found is None:
        return None
    if found.month != month or found.terms != terms:
        _give_back(found)
        return None
    return found


def admit(key, *, scope_ids, month, terms, minute, need):
    """Take `need` from this process's advance for the key, if it covers it; the advance, or None (then the
    admission script decides). Asks for a top-up in the background when the advance runs low."""
    advance = find(key.id, scope_ids, month, terms)
    if advance is None or not advance.covers(need, minute):
        return None
    advance.take(need)
    return advance


def after_admission(key, *, scope_ids, month, terms, minute, need, keys):
    """A request of `key` was admitted (from its advance or by the script): top its advance up, or take one when the
    key's requests come often enough (a second one within the idle time an advance is kept), in the background.
    `keys`: (window keys, counter keys, held keys) as the admission script uses them."""
    slot = (key.id, scope_ids)
    advance = find(key.id, scope_ids, month, terms)
    now = time.monotonic()
    if advance is None:
        if len(_seen) > 10_000:  # keys seen once long ago: forget them
            _seen.clear()
        seen, _seen[slot] = _seen.get(slot), now
        if seen is None or now - seen > settings.GATEWAY_ADVANCE_IDLE_SECONDS:
            return
        window_keys, counter_keys, held_keys = keys
        advance = _advances[slot] = Advance(slot, month, terms, tuple(window_keys), tuple(held_keys),
                                            tuple(counter_keys))
    elif not advance.low(need, minute):
        return
    advance.topping_up = True
    task = asyncio.ensure_future(_top_up(advance, terms, minute, need, key))
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    _sweep_start()


async def _top_up(advance, terms, minute, need, key):
    rpm, tpm, scope_limits = terms
    window_keys = rate_limits.window_keys(key.id, minute) if advance.window_keys else ()
    want = [REQUESTS * need.requests, REQUESTS * need.window_tokens, REQUESTS * need.money, REQUESTS * need.tokens]
    request = {"rate_keys": 2 if window_keys else 0, "rpm": rpm or 0, "tpm": tpm or 0,
               "budgets": [list(limits) for limits in scope_limits], "want": want,
               "least": [need.requests, need.window_tokens, need.money, need.tokens], "share": SHARE,
               "held_ttl": reservations.HELD_SECONDS, "window_ttl": WINDOW_SECONDS}
    try:
        taken = await registered_script(TAKE)(keys=[*window_keys, *advance.counter_keys, *advance.held_keys],
                                              args=[json.dumps(request)])
    except (RedisError, OSError) as error:
        log.warning("no advance on key %s's limits (%s); its requests are admitted one by one", key.id,
                    type(error).__name__)
        return
    finally:
        advance.topping_up = False
    requests, window, money, tokens = (int(value) for value in taken)
    if not any((requests, window, money, tokens, advance.requests, advance.window_tokens, advance.money_held,
                advance.tokens_held)):
        advance.live = False  # none to be had near a limit, none held: nothing to keep
        if _advances.get(advance.slot) is advance:
            del _advances[advance.slot]
        return
    if not advance.live:  # given back while the call was under way: give this back too
        await _release(advance, (requests, window, money, tokens), window_keys)
        return
    if window_keys and advance.minute != minute:  # a new minute: the last one's part lapsed with it
        advance.minute, advance.requests, advance.window_tokens, advance.window_keys = minute, 0, 0, window_keys
    advance.requests += requests
    advance.window_tokens += window
    advance.money += money
    advance.tokens += tokens
    advance.money_held += money
    advance.tokens_held += tokens


def _give_back(advance):
    """Stop using an advance and give back what no request holds, in the background."""
    if not advance.live:
        return None
    advance.live = False
    if _advances.get(advance.slot) is advance:
        del _advances[advance.slot]
    current = advance.window_keys and advance.minute == rate_limits.window()[0]
    parts = (advance.requests if current else 0, advance.window_tokens if current else 0,
             advance.money, advance.tokens)
    task = asyncio.ensure_future(_release(advance, parts, advance.window_keys if current else ()))
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    return task


async def _release(advance, parts, window_keys):
    requests, window, money, tokens = parts
    if not any(parts):
        return
    try:
        await registered_script(GIVE_BACK)(keys=[*window_keys, *advance.held_keys],
                                           args=[requests, window, money, tokens, 1 if window_keys else 0])
    except (RedisError, OSError) as error:
        log.warning("key %s's advance not given back (%s); it is held until its counters expire", advance.slot[0],
                    type(error).__name__)


def _sweep_start():
    global _sweeper
    if _sweeper is None or _sweeper.done():
        _sweeper = asyncio.ensure_future(_sweep())


async def _sweep():
    """Give back the advances unused for TOKENWISE_GATEWAY_ADVANCE_IDLE_SECONDS, until none is left."""
    while _advances:
        await asyncio.sleep(SWEEP_SECONDS)
        now = time.monotonic()
        idle = settings.GATEWAY_ADVANCE_IDLE_SECONDS
        for advance in [found for found in _advances.values() if now - found.used_at > idle]:
            _give_back(advance)


async def give_back_all():
    """Give back every advance of this process, and wait until Redis has them (at the server's shutdown; tests)."""
    tasks = [_give_back(advance) for advance in list(_advances.values())]
    _seen.clear()
    await asyncio.gather(*(task for task in tasks if task is not None), return_exceptions=True)
