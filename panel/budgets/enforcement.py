"""What the gateway asks of budgets: may this key spend (`refusal`), and what a finished request spent (`count`).

Budgets are cached per team for TOKENWISE_BUDGET_CACHE_SECONDS like keys are (panel/gateway/keys.py), so a request
costs no database query; the spend is one Redis MGET before and one pipeline after, and neither happens for a team
that has no budget. A request that starts under the budget is let finish, so the last one may overshoot it."""
import logging
import time
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from redis.exceptions import RedisError

from panel.budgets.counters import TTL_SECONDS, counter_keys, money_from_units, money_units, month_bounds, month_of
from panel.budgets.models import Budget
from panel.core.redis_client import async_redis

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    money: Decimal | None
    tokens: int | None


@dataclass(frozen=True)
class TeamBudgets:
    team: Limits | None
    keys: dict


_cache = {}


async def budgets_for(team_id):
    """The team's budgets (None when it has none), from the cache or one query."""
    hit = _cache.get(team_id)
    if hit and hit[0] > time.monotonic():
        return hit[1]
    team, keys = None, {}
    async for row in Budget.objects.filter(team_id=team_id).values("key_id", "money_per_month", "tokens_per_month"):
        limits = Limits(row["money_per_month"], row["tokens_per_month"])
        if row["key_id"] is None:
            team = limits
        else:
            keys[row["key_id"]] = limits
    found = TeamBudgets(team, keys) if team or keys else None
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[team_id] = (time.monotonic() + settings.BUDGET_CACHE_SECONDS, found)
    return found


def _scopes(budgets, key):
    if budgets.team is not None:
        yield "team", key.team_id, budgets.team
    if key.id in budgets.keys:
        yield "key", key.id, budgets.keys[key.id]


def _renews(month):
    return month_bounds(month)[1].strftime("%Y-%m-%d")


async def refusal(key):
    """None if `key` may send a request, else the words of the refusal (which budget, how much, when it renews)."""
    budgets = await budgets_for(key.team_id)
    if budgets is None:
        return None
    month = month_of()
    scopes = list(_scopes(budgets, key))
    if not scopes:
        return None
    try:
        values = await async_redis().mget([name for scope, ident, _ in scopes
                                      for name in counter_keys(month, scope, ident)])
    except (RedisError, OSError) as error:  # fail open: the reconciliation still records the spend
        log.warning("budget counters unreadable (%s); letting the request through", type(error).__name__)
        return None
    currency = getattr(settings, "TOKENWISE_CURRENCY", "USD")
    for index, (scope, _, limits) in enumerate(scopes):
        whose = "this team's" if scope == "team" else "this key's"
        money, tokens = money_from_units(values[2 * index]), int(values[2 * index + 1] or 0)
        if limits.money is not None and money >= limits.money:
            return (f"{whose} monthly budget of {limits.money} {currency} is spent ({money:.2f} {currency} this "
                    f"month); it renews on {_renews(month)} (UTC) or when a team admin raises it")
        if limits.tokens is not None and tokens >= limits.tokens:
            return (f"{whose} monthly budget of {limits.tokens} tokens is spent ({tokens} tokens this month); it "
                    f"renews on {_renews(month)} (UTC) or when a team admin raises it")
    return None


async def count(key, cost, tokens):
    """Add a finished request's cost and tokens to the month's counters (teams without budgets skip this)."""
    if key is None or (cost <= 0 and tokens <= 0) or await budgets_for(key.team_id) is None:
        return
    month = month_of()
    units = money_units(cost)
    try:
        pipe = async_redis().pipeline(transaction=False)
        for scope, ident in (("team", key.team_id), ("key", key.id)):
            money_key, tokens_key = counter_keys(month, scope, ident)
            pipe.incrby(money_key, units)
            pipe.incrby(tokens_key, tokens)
            pipe.expire(money_key, TTL_SECONDS)
            pipe.expire(tokens_key, TTL_SECONDS)
        await pipe.execute()
    except (RedisError, OSError) as error:
        log.warning("budget counters not updated (%s); the reconciliation will catch up", type(error).__name__)
