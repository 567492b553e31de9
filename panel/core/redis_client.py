"""The asyncio Redis client of a gateway process: rate-limit and budget counters, the routing version, cooldowns. One
per event loop, made on first use inside it: a gateway process has one loop, so one client; a worker that runs the
panel's own requests (evaluation runs, shadow copies) in a fresh `asyncio.run` per task gets a fresh client each
time, since a client's connections belong to the loop that opened them (reused on the next loop they fail with
"attached to a different loop"). And a plain client, for code that runs without an event loop (the benchmark
runner's budget counting)."""
import asyncio

import redis
import redis.asyncio as aioredis
from django.conf import settings

_client = None
_client_loop = None
_sync_client = None


def async_redis():
    global _client, _client_loop
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # outside a loop (a script registered ahead): the loop that runs it makes its own
        loop = None
    if _client is None or (loop is not None and loop is not _client_loop):
        _client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        _client_loop = loop
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


async def together(calls):
    """Several calls in one round trip (a pipeline, not a transaction): each (script text, keys, args) or (None,
    command, *arguments). Returns their results in order; a failed call's result is its exception. A script Redis
    does not hold (after a restart or a flush) is sent again alone, which loads it, so no call runs twice."""
    client = async_redis()
    pipe = client.pipeline(transaction=False)
    for call in calls:
        if call[0] is None:
            pipe.execute_command(*call[1:])
        else:
            text, keys, args = call
            pipe.evalsha(registered_script(text).sha, len(keys), *keys, *args)
    results = await pipe.execute(raise_on_error=False)
    for index, (call, result) in enumerate(zip(calls, results)):
        if call[0] is not None and isinstance(result, redis.exceptions.NoScriptError):
            text, keys, args = call
            try:
                results[index] = await registered_script(text)(keys=keys, args=args)
            except redis.exceptions.RedisError as error:
                results[index] = error
    return results
