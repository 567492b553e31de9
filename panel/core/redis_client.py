"""The asyncio Redis client of a gateway process: rate-limit and budget counters, the routing version. One per
process, made on first use inside the running event loop, so every gateway process shares the same counters."""
import redis.asyncio as aioredis
from django.conf import settings

_client = None


def async_redis():
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _client
