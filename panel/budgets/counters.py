"""Monthly spend counters in Redis, shared by every gateway process: money and tokens, per team, per key and per tag.

Money is kept as an integer number of hundred-millionths (RequestLog.cost has 8 decimal places), so INCRBY stays
exact. Counters live a little longer than a month. The database (RequestLog) stays the truth: the reconciliation
task raises each counter to at least the month's sum there, so a Redis flush or a lost increment does not reset a
budget for longer than one reconciliation period."""
from datetime import datetime, timezone
from decimal import Decimal

UNIT = 10**8
TTL_SECONDS = 40 * 24 * 3600

RAISE_TO_AT_LEAST = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 0
"""

# KEYS: money and tokens counters, per scope, then the held money and tokens of each scope the request reserved in
# (reservations.py). ARGV: money units, tokens, TTL seconds, the number of counter keys, then the units and tokens
# held for the request, released here. Returns the counters after, as strings (exact: a Lua number is exact only to
# 2^53 and prints 14 digits). One call, not a pipeline of eight.
ADD = """
for i = tonumber(ARGV[4]) + 1, #KEYS, 2 do
  redis.call('DECRBY', KEYS[i], ARGV[5])
  redis.call('DECRBY', KEYS[i + 1], ARGV[6])
end
local after = {}
for i = 1, tonumber(ARGV[4]), 2 do
  redis.call('INCRBY', KEYS[i], ARGV[1])
  redis.call('INCRBY', KEYS[i + 1], ARGV[2])
  redis.call('EXPIRE', KEYS[i], ARGV[3])
  redis.call('EXPIRE', KEYS[i + 1], ARGV[3])
  table.insert(after, redis.call('GET', KEYS[i]))
  table.insert(after, redis.call('GET', KEYS[i + 1]))
end
return after
"""

# KEYS: a team's channel excess hash (`excess_key`). ARGV: field, tokens, field, tokens...: each field raised to at
# least its tokens, so processes that learn at once keep the largest.
RAISE_EXCESS = """
for i = 1, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > current then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 0
"""


def month_of(moment=None):
    """The calendar month (UTC) of `moment`, as "2026-11"."""
    moment = moment or datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m")


def month_bounds(month):
    """The first instant of `month` and of the next one (UTC)."""
    year, number = (int(part) for part in month.split("-"))
    start = datetime(year, number, 1, tzinfo=timezone.utc)
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=timezone.utc)
    return start, end


def counter_keys(month, scope, ident):
    """(money key, tokens key) of a team (`scope`="team"), a key ("key") or a team's tag ("tag", `tag_ident`)."""
    base = f"tw:budget:{month}:{scope}:{ident}"
    return f"{base}:money", f"{base}:tokens"


def held_keys(month, scope, ident):
    """(money key, tokens key) of what requests in flight of a team or key hold against its budget."""
    base = f"tw:budget:{month}:{scope}:{ident}"
    return f"{base}:held-money", f"{base}:held-tokens"


def excess_key(team_id):
    """The hash of what a team's channels billed beyond a prompt's bound (budgets/reservations.py): per channel id,
    tokens per request ("<id>") and per media part ("<id>:media"). Kept without expiry: a channel's template does
    not change with the month."""
    return f"tw:budget:excess:{team_id}"


def money_units(amount):
    return int((Decimal(amount or 0) * UNIT).to_integral_value())


def money_from_units(units):
    return Decimal(int(units or 0)) / UNIT


def tag_ident(team_id, tag):
    """A tag budget's counters are the team's own: two teams may use one tag."""
    return f"{team_id}:{tag}"


def budget_owner(scope, ident):
    """Whose budget, in a refusal's words: "this team's", "this key's" or 'the "x" tag's'."""
    if scope == "tag":
        return f'the "{str(ident).split(":", 1)[1]}" tag\'s'
    return "this team's" if scope == "team" else "this key's"
