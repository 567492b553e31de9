"""The asyncio Redis client of a gateway process: rate-limit and budget counters, the routing version, cooldowns. One
per process, made on first use inside the running event loop, so every gateway process shares the same counters.
And a plain client, for code that runs without that event loop (the benchmark runner's budget counting)."""
import redis
import redis.asyncio as aioredis
from django.conf import settings

_client = None
_sync_client = None


def async_redis():
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _client


def sync_redis():
    """A plain Redis client for code outside the gateway's event loop (thread-safe: a connection pool)."""
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _sync_client


_scripts = {}  # (client, script text) -> the script registered on that client


def registered_script(text):
    """A Lua script registered on this process's asyncio client (again after the client was replaced)."""
    client = async_redis()
    found = _scripts.get((id(client), text))
    if found is None or found[0] is not client:
        found = _scripts[(id(client), text)] = (client, client.register_script(text))
    return found[1]
