"""What the gateway asks of budgets: which budgets a request spends from (`scopes_for`, read in admission's one
Redis call; `verdict` words a spent one), and what a finished request spent (`count`), against its team's, its
key's and its tags' budgets.

Budgets are cached per team for TOKENWISE_BUDGET_CACHE_SECONDS like keys are (panel/gateway/keys.py), and read
again ahead of expiry while in use (panel/core/refresher.py), so a request costs no database query; the spend is
read before (for the gateway, in its one admission call to Redis: gateway/admission.py; a team without budgets
reads none) and counted after, in one script call. A request whose maximum (budgets/reservations.py) fits is held
and let finish; one that used more than it held teaches its route's channels to hold more (`learn`)."""
import asyncio
import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal

from asgiref.sync import sync_to_async
from django.conf import settings
from redis.exceptions import RedisError

from panel.budgets import reservations
from panel.budgets.counters import (
    ADD,
    RAISE_EXCESS,
    TTL_SECONDS,
    budget_owner,
    counter_keys,
    excess_key,
    money_from_units,
    money_units,
    month_bounds,
    month_of,
    tag_ident,
)
from panel.budgets.models import Budget
from panel.budgets.services import ALERT_AT, budget_crossed
from panel.core.redis_client import async_redis, registered_script, sync_redis
from panel.core.refresher import Refresher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    money: Decimal | None
    tokens: int | None


@dataclass(frozen=True)
class TeamBudgets:
    team: Limits | None
    keys: dict
    tags: dict = field(default_factory=dict)  # tag -> Limits
    # channel id -> (tokens per request, per media part) its prompts billed beyond their bound (`learn`)
    excess: dict = field(default_factory=dict)


_cache = {}  # team id -> (expires at, TeamBudgets or None)


async def budgets_for(team_id):
    """The team's budgets (None when it has none), from the cache or one query."""
    now = time.monotonic()
    REFRESHER.touch(team_id)
    hit = _cache.get(team_id)
    if hit and hit[0] > now:
        return hit[1]
    return (await _load([team_id]))[team_id]


async def _load(team_ids):
    """{team id: TeamBudgets or None} in one query, cached."""
    found = {team_id: [None, {}, {}] for team_id in team_ids}
    async for row in Budget.objects.filter(team_id__in=team_ids).values("team_id", "key_id", "tag", "money_per_month",
                                                                        "tokens_per_month"):
        limits, budgets = Limits(row["money_per_month"], row["tokens_per_month"]), found[row["team_id"]]
        if row["tag"]:
            budgets[2][row["tag"]] = limits
        elif row["key_id"] is None:
            budgets[0] = limits
        else:
            budgets[1][row["key_id"]] = limits
    if len(_cache) > 10_000:
        _cache.clear()
    expires = time.monotonic() + settings.BUDGET_CACHE_SECONDS
    with_budgets = [team_id for team_id, (team, keys, tags) in found.items() if team or keys or tags]
    excess = await _excess_load(with_budgets)
    for team_id, (team, keys, tags) in found.items():
        _cache[team_id] = (expires, TeamBudgets(team, keys, tags, excess.get(team_id, {}))
                           if team_id in excess else None)
    return {team_id: _cache[team_id][1] for team_id in team_ids}


async def _excess_load(team_ids):
    """{team id: {channel id: (tokens per request, per media part)}} of the teams with budgets, in one pipeline; a
    team's channels taught nothing when Redis cannot be read."""
    if not team_ids:
        return {}
    try:
        pipe = async_redis().pipeline(transaction=False)
        for team_id in team_ids:
            pipe.hgetall(excess_key(team_id))
        hashes = await pipe.execute()
    except (RedisError, OSError) as error:
        log.warning("channel excess unreadable (%s); holds go by the allowances alone", type(error).__name__)
        hashes = [{}] * len(team_ids)
    return {team_id: _excess_parse(found) for team_id, found in zip(team_ids, hashes)}


def _excess_parse(found):
    excess = {}
    for name, value in found.items():
        channel, _, part = (name.decode() if isinstance(name, bytes) else name).partition(":")
        per_request, per_media = excess.get(int(channel), (0, 0))
        excess[int(channel)] = (per_request, int(value)) if part == "media" else (int(value), per_media)
    return excess


async def excess_for(team_id, channels):
    """The most any of `channels` taught (tokens per request, per media part) of a team with budgets, from the
    budgets' cache."""
    budgets = await budgets_for(team_id)
    taught = [budgets.excess.get(channel.id, (0, 0)) for channel in channels] if budgets else []
    return max((request for request, _ in taught), default=0), max((media for _, media in taught), default=0)


async def _refresh():
    """The refresher's round: the budgets of the teams in use whose entries expire before the round after next,
    read again in one query."""
    now, ahead = time.monotonic(), 2 * _refresh_interval()
    due = [team_id for team_id in REFRESHER.in_use() if _cache.get(team_id, (0,))[0] - now < ahead]
    if due:
        await _load(due)


def _refresh_interval():
    """A fifth of the cache's time: a team's budgets are read again about a second before they would expire."""
    return settings.BUDGET_CACHE_SECONDS / 5


REFRESHER = Refresher("budgets", _refresh, _refresh_interval)


def _scopes(budgets, key, tags):
    if budgets.team is not None:
        yield "team", key.team_id, budgets.team
    if key.id in budgets.keys:
        yield "key", key.id, budgets.keys[key.id]
    for tag in tags:
        if tag in budgets.tags:
            yield "tag", tag_ident(key.team_id, tag), budgets.tags[tag]


def _renews(month):
    return month_bounds(month)[1].strftime("%Y-%m-%d")


async def scopes_for(key, tags=()):
    """([(scope, ident, Limits)] of the budgets a request of `key` carrying `tags` spends against, this month): none
    for a team without budgets. The gateway reads their counters in its admission call (gateway/admission.py) and
    words a refusal with `verdict`."""
    budgets = await budgets_for(key.team_id)
    return ([] if budgets is None else list(_scopes(budgets, key, tags))), month_of()


def scope_counter_keys(scopes, month):
    """The counters of `scopes`, money then tokens per scope, in the order `verdict` reads their values."""
    return [name for scope, ident, _ in scopes for name in counter_keys(month, scope, ident)]


def scope_limits(scopes):
    """Per scope [money limit in units, tokens limit] as whole-number strings ("" for none), for a Redis script to
    compare with the counters exactly as `verdict` does."""
    return [["" if limits.money is None else str(money_units(limits.money)),
             "" if limits.tokens is None else str(limits.tokens)] for _, _, limits in scopes]


def verdict(scopes, values, month):
    """The refusal's words for the first of `scopes` ((scope, ident, Limits)) whose counters (`values`: money and
    tokens per scope, as MGET gives them) reached its limit, else None."""
    currency = getattr(settings, "TOKENWISE_CURRENCY", "USD")
    for index, (scope, ident, limits) in enumerate(scopes):
        whose = budget_owner(scope, ident)
        money, tokens = money_from_units(values[2 * index]), int(values[2 * index + 1] or 0)
        if limits.money is not None and money >= limits.money:
            return (f"{whose} monthly budget of {limits.money} {currency} is spent ({money:.2f} {currency} this "
                    f"month); it renews on {_renews(month)} (UTC) or when a team admin raises it")
        if limits.tokens is not None and tokens >= limits.tokens:
            return (f"{whose} monthly budget of {limits.tokens} tokens is spent ({tokens} tokens this month); it "
                    f"renews on {_renews(month)} (UTC) or when a team admin raises it")
    return None


def add_script():
    return registered_script(ADD)


async def count(key, cost, tokens, *, team_id=None, reservation=None, tags=()):
    """Add a finished request's cost and tokens to the month's counters of its team, key and each of its `tags`
    (`key` None, or the panel's stand-in for its team whose id is None: a request made inside the panel, counted
    against its team), and release what it held (`reservation`, from admission); one that used more than it held
    teaches its channels (`learn`). Counted whether or not a budget exists yet, so a budget set later counts this
    month's spend at once. A request that takes a budget past 80% or 100% raises that notice (once a month, through
    panel/notifications) in the background. One script call; the gateway sends it with its other calls at a
    request's end (`counting`)."""
    counted = counting(key, cost, tokens, team_id=team_id, reservation=reservation, tags=tags)
    if counted is None:
        return
    try:
        _, keys, args = counted.call
        results = await add_script()(keys=keys, args=args)
    except (RedisError, OSError) as error:
        counted.failed(error)
        return
    await counted.done(results)


def counting(key, cost, tokens, *, team_id=None, reservation=None, tags=()):
    """`count` in two halves, for a caller that sends the call with others: a `Counting` whose `call` is the script's
    (text, keys, args) and whose `done(results)` does the rest; None when there is nothing to count."""
    team_id = key.team_id if key is not None else team_id
    if team_id is None or (cost <= 0 and tokens <= 0 and reservation is None):
        return None
    month = month_of()
    units = money_units(cost)
    keyed = key is not None and key.id is not None  # the panel's own requests come with their team, without a key
    scopes = ([("team", team_id)] + ([("key", key.id)] if keyed else [])
              + [("tag", tag_ident(team_id, tag)) for tag in tags])
    held = reservation or reservations.Reservation((), 0, 0)
    released = (held.money_units, held.tokens) if held.pool is None else held.pool.settle(
        held.money_units, held.tokens, units, tokens)  # taken from an advance: the rest goes back to it
    counters = [name for scope, ident in scopes for name in counter_keys(month, scope, ident)]
    call = (ADD, [*counters, *held.keys], [units, tokens, TTL_SECONDS, len(counters), *released])
    return Counting(call, key, team_id, keyed, scopes, held, units, tokens, tags, month)


@dataclass
class Counting:
    """One request's count, sent (`call`), then finished with what Redis answered (`done`)."""

    call: tuple
    key: object
    team_id: int
    keyed: bool
    scopes: list
    held: reservations.Reservation
    units: int
    tokens: int
    tags: tuple
    month: str

    def failed(self, error):
        log.warning("budget counters not updated (%s); the reconciliation will catch up", type(error).__name__)

    async def done(self, results):
        """Teach the channels what the request used past its hold, and raise the notices its spend crossed."""
        key, team_id, tags = self.key, self.team_id, self.tags
        await learn(team_id, self.held, self.tokens)
        budgets = await budgets_for(team_id)
        if budgets is None:
            return
        limits_of = {("team", team_id): budgets.team,
                     **({("key", key.id): budgets.keys.get(key.id)} if self.keyed else {}),
                     **{("tag", tag_ident(team_id, tag)): budgets.tags.get(tag) for tag in tags}}
        for index, (scope, ident) in enumerate(self.scopes):
            limits = limits_of.get((scope, ident))
            if limits is None:
                continue
            money, tokens_now = money_from_units(results[2 * index]), int(results[2 * index + 1])
            levels = crossed(limits, before=(money - money_from_units(self.units), tokens_now - self.tokens),
                             after=(money, tokens_now))
            if levels:
                task = asyncio.ensure_future(sync_to_async(budget_crossed, thread_sensitive=False)(
                    team_id=team_id, key_id=ident if scope == "key" else None, levels=levels, month=self.month,
                    tag=ident.split(":", 1)[1] if scope == "tag" else ""))
                _pending.add(task)
                task.add_done_callback(_pending.discard)


_pending = set()  # notices being raised: kept referenced until done


async def learn(team_id, reservation, tokens):
    """A request that used more `tokens` than its `reservation` held: its route's channels billed a prompt beyond
    its bound. Logged, and kept for the channels (in Redis for every process, in this process' cache at once), so
    that later holds on them cover it. Costs nothing when the hold covered the request."""
    taught = reservations.excess_seen(reservation, tokens)
    if taught is None:
        return
    per_request, per_media = taught
    names = ", ".join(name for _, name in reservation.channels) or "-"
    log.warning("a request of team %s used %s tokens, more than the %s its budgets held: its prompt billed more than "
                "its bound on channel %s (a chat template larger than TOKENWISE_BUDGET_TEMPLATE_TOKENS or media "
                "parts larger than TOKENWISE_BUDGET_MEDIA_TOKENS), or the channel ignored max_tokens; its holds now "
                "add %s tokens per request and %s per media part", team_id, tokens, reservation.tokens, names,
                per_request, per_media)
    fields = [value for channel_id, _ in reservation.channels
              for value in (str(channel_id), per_request, f"{channel_id}:media", per_media)]
    try:
        await registered_script(RAISE_EXCESS)(keys=[excess_key(team_id)], args=fields)
    except (RedisError, OSError) as error:
        log.warning("channel excess not kept (%s); this process' holds cover it", type(error).__name__)
    hit = _cache.get(team_id)
    if hit and hit[1] is not None:
        for channel_id, _ in reservation.channels:
            known = hit[1].excess.get(channel_id, (0, 0))
            hit[1].excess[channel_id] = (max(known[0], per_request), max(known[1], per_media))


def crossed(limits, *, before, after):
    """The notice levels ("alert" at 80%, "exhausted" at 100%) that went from below to at-or-above."""
    levels = []
    for level, share in (("alert", ALERT_AT), ("exhausted", Decimal(1))):
        for limit, old, new in ((limits.money, before[0], after[0]), (limits.tokens, before[1], after[1])):
            if limit is not None and old < limit * share <= new:
                levels.append(level)
                break
    return levels


# ---------------------------------------------------------------------------------------- without an event loop
# For panel traffic sent outside the gateway's event loop (the benchmark runner: its load runs in an event loop of
# its own, and the async Redis client above belongs to the loop that first used it), through a plain Redis client.

def team_limits_sync(team_id):
    row = Budget.objects.filter(team_id=team_id, key__isnull=True, tag="").values("money_per_month",
                                                                          "tokens_per_month").first()
    return None if row is None else Limits(row["money_per_month"], row["tokens_per_month"])


def team_refusal_sync(team_id):
    """None if the team may spend, else the refusal's words: for the panel's traffic sent from plain (non-async)
    code. Fails open when Redis is unreachable, as the gateway does."""
    limits = team_limits_sync(team_id)
    if limits is None:
        return None
    month = month_of()
    try:
        values = sync_redis().mget(counter_keys(month, "team", team_id))
    except (RedisError, OSError) as error:
        log.warning("budget counters unreadable (%s); letting the panel's traffic through", type(error).__name__)
        return None
    return verdict([("team", team_id, limits)], values, month)


def team_count_sync(team_id, cost, tokens):
    """As `count` for panel traffic (no key), from plain code: the team's counters, and its 80 % and spent notices
    when this spend crosses them."""
    if cost <= 0 and tokens <= 0:
        return
    month = month_of()
    units = money_units(cost)
    money_key, tokens_key = counter_keys(month, "team", team_id)
    try:
        pipe = sync_redis().pipeline(transaction=False)
        pipe.incrby(money_key, units)
        pipe.incrby(tokens_key, tokens)
        pipe.expire(money_key, TTL_SECONDS)
        pipe.expire(tokens_key, TTL_SECONDS)
        money_now, tokens_now = pipe.execute()[:2]
    except (RedisError, OSError) as error:
        log.warning("budget counters not updated (%s); the reconciliation will catch up", type(error).__name__)
        return
    limits = team_limits_sync(team_id)
    if limits is None:
        return
    money_now = money_from_units(money_now)
    levels = crossed(limits, before=(money_now - money_from_units(units), int(tokens_now) - tokens),
                     after=(money_now, int(tokens_now)))
    if levels:
        budget_crossed(team_id=team_id, key_id=None, levels=levels, month=month)
