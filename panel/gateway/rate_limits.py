"""Per-key requests and tokens per minute, enforced atomically in Redis across every gateway process.

A fixed one-minute window: one Lua script checks both counters and counts the request; the tokens a request
used are added when it ends. A key over either limit gets 429 with Retry-After = the seconds left in the window."""
import logging
import time

from redis.exceptions import RedisError

from panel.core.redis_client import async_redis

log = logging.getLogger(__name__)

CHECK = """
local requests = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
if rpm > 0 and requests >= rpm then return 1 end
if tpm > 0 and tokens >= tpm then return 2 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
return 0
"""

_scripts = {}  # client -> the CHECK script registered on it


def check_script():
    client = async_redis()
    if client not in _scripts:
        _scripts.clear()
        _scripts[client] = client.register_script(CHECK)
    return _scripts[client]


def window(now=None):
    now = time.time() if now is None else now
    minute = int(now // 60)
    return minute, 60 - int(now % 60)


def _keys(key_id, minute):
    return f"tw:rl:{key_id}:{minute}:req", f"tw:rl:{key_id}:{minute}:tok"


async def admit(key):
    """None if the request may go, else (which limit, retry_after_seconds)."""
    if not key.rpm_limit and not key.tpm_limit:
        return None
    minute, retry_after = window()
    try:
        verdict = await check_script()(keys=_keys(key.id, minute), args=[key.rpm_limit or 0, key.tpm_limit or 0])
    except (RedisError, OSError) as error:  # fail open: a Redis outage must not refuse every keyed request
        log.warning("rate limits of key %s unreadable (%s); letting the request through", key.id,
                    type(error).__name__)
        return None
    if verdict == 0:
        return None
    return ("requests per minute" if verdict == 1 else "tokens per minute"), retry_after


async def count_tokens(key, tokens):
    if not key.tpm_limit or tokens <= 0:
        return
    minute, _ = window()
    token_key = _keys(key.id, minute)[1]
    pipe = async_redis().pipeline()
    pipe.incrby(token_key, tokens)
    pipe.expire(token_key, 120)
    await pipe.execute()
