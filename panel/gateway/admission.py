"""May a request go, and which agent session is it: the key's per-minute limits (gateway/rate_limits.py), its team's,
its own and its tags' monthly budgets (budgets/enforcement.py) and the session lookup (gateway/sessions.py), asked of
Redis in one script call, so a request waits on one round trip before the upstream is called, not four.

The script keeps each part's rules and their order: a key over a per-minute limit is refused (429) before its request is
counted in the window, and a key with a tokens-per-minute limit holds each request's most (its prompt's estimate and
max_tokens) in the window until it ends, so concurrent requests cannot pass the limit (a request whose most alone is
over it is refused with 400); a counted request over a budget, or whose maximum the budget's rest cannot cover beside
what requests in flight hold, is refused (402); an admitted request holds its maximum against each budget
(budgets/reservations.py) and becomes a turn of a session. A part that does not apply (no limits, no budget, no prompt
to hash) is left out, and a request with none of them costs no call. A key with neither limits nor budgets does not
wait for its session at all: the lookup (the prompt's hashes, then Redis) runs when the request ends, in one round
trip with its count, and its fields reach the usage row. When Redis cannot be reached the request goes,
without session fields.

A busy key's requests mostly skip the script: each web process holds an advance on the key's limits and budgets
(gateway/advances.py), and a request whose most fits what is left of it is admitted in memory, its session looked
up at its end as a plain key's is."""
import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from panel.budgets import enforcement as budgets
from panel.budgets import reservations
from panel.channels.rules import input_token_estimate
from panel.core.redis_client import registered_script
from panel.gateway import advances, rate_limits, sessions

log = logging.getLogger(__name__)

# KEYS: the window's request and token counters (when the key has limits), each budget scope's money and token counters,
# then each scope's held money and tokens, then the key's prefix keys, one per prompt block (sessions.prefix_keys: the
# shortest prompt first). ARGV[1]: JSON {rate_keys, rpm, tpm, tpm_hold (the request's most in tokens, held in the token
# window), budgets: [[money units, tokens] as strings, "" for none], hold: false or [money units, tokens] as strings
# (then the held keys are in KEYS), held_ttl, session: false or {declared, new, state_prefix, ttl}, counted: true on a
# second try whose request the first already counted in its minute}; ARGV[2]: this
# request's block hashes as JSON, for the session's new state. Returns {verdict, budget counters, session id, turn, the
# session's previous state}: verdict 0 admitted, 1 over requests per minute, 2 over tokens per minute, 3 a budget spent,
# 4 the request's maximum does not fit a budget (then {4, counters, the budget's index, its held money, its held
# tokens}), 5 the request's most alone is over the tokens-per-minute limit. The session's state key is named inside the
# script (it depends on the session found): fine on one Redis server, which is what the gateway uses; a Redis Cluster
# would need the keys in KEYS.
ADMIT = """
local function reached(value, limit)
  -- whole numbers as strings, compared exactly: a Lua number is exact only to 2^53, and money is in 1e-8 units
  if limit == '' then return false end
  if string.sub(value, 1, 1) == '-' then return false end
  if #value ~= #limit then return #value > #limit end
  return value >= limit
end

local ask = cjson.decode(ARGV[1])
local used = 0
if ask.rate_keys > 0 then
  local requests = tonumber(redis.call('GET', KEYS[1]) or '0')
  local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
  if not ask.counted and ask.rpm > 0 and requests >= ask.rpm then return {1} end
  if ask.tpm > 0 and ask.tpm_hold > ask.tpm then return {5} end
  if ask.tpm > 0 and tokens + ask.tpm_hold > ask.tpm then return {2} end
  if not ask.counted then  -- a second try with max_tokens fitted to a budget was counted by the first
    redis.call('INCR', KEYS[1])
    redis.call('EXPIRE', KEYS[1], 120)
  end
  used = 2
end

local function over(spent, held, asked, limit)
  -- money units and tokens stay below 2^53 here (a budget under 90 million), where a Lua number is exact
  return limit ~= '' and tonumber(spent) + held + tonumber(asked) > tonumber(limit)
end

local counters, spent = {}, false
local scopes = #ask.budgets
for _, limits in ipairs(ask.budgets) do
  local money = redis.call('GET', KEYS[used + 1]) or '0'
  local tokens = redis.call('GET', KEYS[used + 2]) or '0'
  table.insert(counters, money)
  table.insert(counters, tokens)
  spent = spent or reached(money, limits[1]) or reached(tokens, limits[2])
  used = used + 2
end
if spent then return {3, counters} end
if ask.hold then
  for i, limits in ipairs(ask.budgets) do
    local held_money = tonumber(redis.call('GET', KEYS[used + 2 * i - 1]) or '0')
    local held_tokens = tonumber(redis.call('GET', KEYS[used + 2 * i]) or '0')
    if over(counters[2 * i - 1], held_money, ask.hold[1], limits[1])
        or over(counters[2 * i], held_tokens, ask.hold[2], limits[2]) then
      return {4, counters, i, held_money, held_tokens}
    end
  end
  for i = used + 1, used + 2 * scopes, 2 do
    redis.call('INCRBY', KEYS[i], ask.hold[1])
    redis.call('INCRBY', KEYS[i + 1], ask.hold[2])
    redis.call('EXPIRE', KEYS[i], ask.held_ttl)
    redis.call('EXPIRE', KEYS[i + 1], ask.held_ttl)
  end
  used = used + 2 * scopes
end

if ask.tpm_hold > 0 then  -- admitted: its most counts in the window now, the rest is given back when it ends
  redis.call('INCRBY', KEYS[2], ask.tpm_hold)
  redis.call('EXPIRE', KEYS[2], 120)
end

local session = ask.session
if not session then return {0, counters} end
local id = session.declared
if id == '' then
  for i = #KEYS, used + 1, -1 do  -- the longest earlier prompt of this key that this one extends
    local found = redis.call('GET', KEYS[i])
    if found then id = found break end
  end
end
if id == '' then id = session.new end
local state_key = session.state_prefix .. id
local previous = redis.call('GET', state_key) or ''
local turn = 1
local ok, state = pcall(cjson.decode, previous)
if ok and type(state) == 'table' then turn = (tonumber(state.turn) or 0) + 1 end
redis.call('SET', state_key, '{"turn": ' .. turn .. ', "hashes": ' .. ARGV[2] .. '}', 'EX', session.ttl)
redis.call('SET', KEYS[#KEYS], id, 'EX', session.ttl)
return {0, counters, id, turn, previous}
"""

def admit_script():
    return registered_script(ADMIT)


def _session_request(key, asked):
    return {"declared": asked.declared, "new": asked.new_id, "state_prefix": sessions.state_prefix(key.team_id),
            "ttl": sessions.SESSION_SECONDS}


def _session_call(key, asked):
    """The admission script's call for the session part alone: (text, keys, args)."""
    request = {"rate_keys": 0, "rpm": 0, "tpm": 0, "tpm_hold": 0, "budgets": [], "hold": False,
               "held_ttl": reservations.HELD_SECONDS, "counted": False, "session": _session_request(key, asked)}
    return ADMIT, sessions.prefix_keys(key.id, asked.hashes), [json.dumps(request), json.dumps(asked.hashes)]


@dataclass
class SessionLookup:
    """The session of a request admitted without a Redis call (a key without limits or budgets, or one admitted from
    its process's advance): looked up when the request ends, in the same round trip as its count
    (`Exchange.settle`), or alone (`await lookup()`)."""

    key: object
    body: dict
    headers: list
    asked: object = None

    def call(self):
        """The lookup's (script text, keys, args), None when the request has no prompt to hash."""
        self.asked = sessions.session_ask(body=self.body, headers=self.headers)
        return None if self.asked is None else _session_call(self.key, self.asked)

    def fields(self, answer):
        """The usage row's session fields from the script's answer ({} for an error: the row goes without)."""
        try:
            if isinstance(answer, Exception):
                raise answer
            return sessions.session_fields(self.asked, session_id=answer[2].decode(), turn=answer[3],
                                           previous=answer[4])
        except Exception as error:  # noqa: BLE001 - an outage or an answer of another shape: the row goes without
            log.warning("session of key %s unreadable (%s); the request is recorded without it", self.key.id,
                        type(error).__name__)
            return {}

    async def __call__(self):
        call = self.call()
        if call is None:
            return {}
        text, keys, args = call
        try:
            answer = await registered_script(text)(keys=keys, args=args)
        except (RedisError, OSError) as error:
            answer = error
        return self.fields(answer)


SESSION_WAIT_SECONDS = 5.0  # past the Redis client's own socket timeout


async def session_fields(task):
    """The fields a deferred session lookup found, once it is done ({} when it failed or took too long)."""
    try:
        return await asyncio.wait_for(asyncio.shield(task), SESSION_WAIT_SECONDS)
    except Exception:  # noqa: BLE001 - a lookup that failed leaves the row without session fields, as an outage does
        task.cancel()
        return {}


@dataclass
class Admission:
    """The answer for one request: `rate_limited` (which limit, retry after seconds) or `budget_spent` (the
    refusal's words) when refused, else the usage row's session fields (empty without a session)."""

    rate_limited: tuple | None = None
    budget_spent: str | None = None
    too_large: str | None = None  # the request's most alone is over its key's tokens per minute
    session: dict = field(default_factory=dict)
    reservation: reservations.Reservation | None = None  # what the request holds against its budgets
    # A key without limits or budgets, or one admitted from its advance: its session is looked up when the request
    # ends, in one round trip with its count (`Exchange.settle`), so that neither the lookup's round trip nor its
    # CPU is in the first token's way.
    session_lookup: SessionLookup | None = None
    lowered: tuple | None = None  # (asked, given): max_tokens fitted to what a budget had left
    # The request set no max_tokens and a budget holds it: the limit the gateway set in its body, so that the answer
    # cannot outgrow the hold (the default, or what the budget had left: then `lowered` says from what).
    limit_added: int | None = None

    def adapted(self):
        """What admission changed in the request's body, in the words of the x-tokenwise-adapted header."""
        if self.limit_added is not None:
            why = "what the budget has left" if self.lowered else "what a request without one is held for"
            return [f"max_tokens set to {self.limit_added:,} (the request set none; {why})"]
        if self.lowered is not None:
            return ["max_tokens lowered from {:,} to {:,} (what the budget has left)".format(*self.lowered)]
        return []


async def admit(key, *, body, headers, session=True, channels=(), counted=False, tags=(), hold=None):
    """Check `key`'s per-minute limits and budgets, count the request in its window and, when it may go, hold its
    maximum (at the highest price among `channels`, its route's) against its budgets and give it its session
    (`session=False`: a request that is no turn of one, such as a token count or the panel's own request; `hold`,
    when given, says whether it holds: a count does not): one Redis call. The budgets are the team's, the key's
    (`key` may be the panel's stand-in for its team, whose id is None: no key budget) and those of `tags`.

    A request without max_tokens that a budget holds gets the limit it is held for set in `body`; when that does not
    fit, or when the key fits max_tokens to its budgets, a second call holds it with `body`'s limit lowered in place
    to what the budget has left."""
    return await _admit(key, body=body, headers=headers, session=session and key.id is not None,
                        hold=session if hold is None else hold, channels=channels, counted=counted, tags=tags,
                        limit_given=reservations.limit_set(body))


async def _admit(key, *, body, headers, session, hold, channels, counted, tags, limit_given):
    limited = bool(key.rpm_limit or key.tpm_limit)
    scopes, month = await budgets.scopes_for(key, tags)
    if not limited and not scopes:  # the prompt's hashes too are worked out after the first byte
        return Admission(session_lookup=SessionLookup(key, body, headers) if session else None)
    minute, retry_after = rate_limits.window()
    held = reservations.scope_held_keys(scopes, month) if hold else []
    # A budget holds the prompt's bound (what it may be billed at most); the per-minute window its estimate, as
    # rules use: a rate is no money, a window overshot for a minute corrects itself, and the bound (a token per
    # byte) would refuse as too large prompts that fit the limit.
    prompt = reservations.prompt_bound(body, await budgets.excess_for(key.team_id, channels)) if held else None
    request_max = reservations.maximum(prompt.tokens, body, channels, limit_given=limit_given) if held else None
    tpm_hold = input_token_estimate(body) + reservations.completion_limit(body) if key.tpm_limit and session else 0
    window_keys = rate_limits.window_keys(key.id, minute) if limited else ()
    counter_keys = budgets.scope_counter_keys(scopes, month)
    advance = _Advanced(key, scopes, month, minute, request_max, tpm_hold, (window_keys, counter_keys, held)) if (
        hold and not counted and key.id is not None and settings.GATEWAY_ADVANCES) else None
    if advance is not None and (taken := advance.take()) is not None:
        limit_added = _limit_added(body, request_max, limit_given)
        return Admission(reservation=reservations.reservation(
            held, request_max, window_key=window_keys[1] if tpm_hold else None, window_tokens=tpm_hold, prompt=prompt,
            channels=channels, pool=taken, window_minute=minute), limit_added=limit_added,
            session_lookup=SessionLookup(key, body, headers) if session else None)
    asked = sessions.session_ask(body=body, headers=headers) if session else None
    keys = [*window_keys, *counter_keys, *held, *(sessions.prefix_keys(key.id, asked.hashes) if asked else ())]
    request = {"rate_keys": 2 if limited else 0, "rpm": key.rpm_limit or 0, "tpm": key.tpm_limit or 0,
               "tpm_hold": tpm_hold,
               "budgets": budgets.scope_limits(scopes),
               "hold": bool(request_max) and [str(request_max.money_units), str(request_max.tokens)],
               "held_ttl": reservations.HELD_SECONDS, "counted": counted,
               "session": asked is not None and _session_request(key, asked)}
    try:
        answer = await admit_script()(keys=keys, args=[json.dumps(request),
                                                       json.dumps(asked.hashes if asked else [])])
    except (RedisError, OSError) as error:  # fail open: a Redis outage must not refuse every request
        log.warning("limits, budgets and session of key %s unreadable (%s); letting the request through", key.id,
                    type(error).__name__)
        return Admission()
    verdict = answer[0]
    if verdict in (1, 2):
        return Admission(rate_limited=("requests per minute" if verdict == 1 else "tokens per minute", retry_after))
    if verdict == 5:
        return Admission(too_large=(f"this request may use up to {tpm_hold:,} tokens (its prompt, estimated, and "
                                    f"max_tokens {reservations.completion_limit(body):,}), more than this key's "
                                    f"limit of {key.tpm_limit:,} tokens per minute: lower max_tokens"))
    if verdict == 3:
        return Admission(budget_spent=budgets.verdict(scopes, answer[1], month))
    if verdict == 4:
        return await _fit(key, body=body, headers=headers, session=session, hold=hold, channels=channels, tags=tags,
                          limit_given=limit_given, scopes=scopes, answer=answer, request_max=request_max)
    limit_added = _limit_added(body, request_max, limit_given)
    if advance is not None:
        advance.admitted()
    held = reservations.reservation(held, request_max, window_key=keys[1] if tpm_hold else None,
                                    window_tokens=tpm_hold, prompt=prompt, channels=channels)
    if asked is None:
        return Admission(reservation=held, limit_added=limit_added)
    session_id, turn, previous = answer[2].decode(), answer[3], answer[4]
    return Admission(session=sessions.session_fields(asked, session_id=session_id, turn=turn, previous=previous),
                     reservation=held, limit_added=limit_added)


def _limit_added(body, request_max, limit_given):
    """A request without max_tokens that a budget holds gets the limit it is held for (the answer may not outgrow
    what is held for it): that limit, or None."""
    if request_max is None or limit_given or not reservations.limit_settable(body):
        return None
    reservations.set_completion_limit(body, request_max.completion_tokens)
    return request_max.completion_tokens


class _Advanced:
    """A request that may be admitted from its process's advance on its key's limits (gateway/advances.py)."""

    def __init__(self, key, scopes, month, minute, request_max, tpm_hold, keys):
        self.key, self.month, self.minute, self.keys = key, month, minute, keys
        self.scope_ids = tuple((scope, ident) for scope, ident, _ in scopes)
        self.terms = (key.rpm_limit or 0, key.tpm_limit or 0,
                      tuple(tuple(limits) for limits in budgets.scope_limits(scopes)))
        money, tokens = (request_max.money_units, request_max.tokens) if request_max else (0, 0)
        self.need = advances.Need(1 if key.rpm_limit else 0, tpm_hold, money, tokens)

    def take(self):
        """The advance this request's need was taken from, or None (then the admission script decides)."""
        taken = advances.admit(self.key, scope_ids=self.scope_ids, month=self.month, terms=self.terms,
                               minute=self.minute, need=self.need)
        if taken is not None:
            self.admitted()
        return taken

    def admitted(self):
        advances.after_admission(self.key, scope_ids=self.scope_ids, month=self.month, terms=self.terms,
                                 minute=self.minute, need=self.need, keys=self.keys)


async def _fit(key, *, body, headers, session, hold, channels, tags, limit_given, scopes, answer, request_max):
    """A request whose maximum does not fit a budget (the one at answer[2]): refused in words, or, when it set no
    max_tokens or its key fits max_tokens to its budgets, held again with its limit lowered to what is left (not
    counted in its minute twice)."""
    index, counters, held = answer[2] - 1, answer[1], (answer[3], answer[4])
    fits = (key.fit_to_budget or not limit_given) and reservations.limit_settable(body)
    fit = reservations.fitting_completion(scopes, index, counters, held, request_max, channels) if fits else None
    if fit is None:
        return Admission(budget_spent=reservations.shortfall_words(scopes, index, counters, held, request_max))
    reservations.set_completion_limit(body, fit)
    again = await _admit(key, body=body, headers=headers, session=session, hold=hold, channels=channels,
                         counted=True, tags=tags, limit_given=limit_given)
    return dataclasses.replace(again, lowered=(request_max.completion_tokens, (again.lowered or (0, fit))[1]))
