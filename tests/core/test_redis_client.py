"""The asyncio Redis client is one per event loop: a worker that runs the panel's own requests in a fresh
`asyncio.run` per task (evaluation runs, shadow copies) must not reuse the connections of a loop that has closed
(the second evaluation run in a worker failed with "Event loop is closed" before)."""
import asyncio

from panel.core.redis_client import async_redis


def test_each_event_loop_gets_its_own_client_and_both_work(settings):
    async def ping():
        client = async_redis()
        assert await client.ping() is True
        assert async_redis() is client  # one client within a loop
        return client

    first = asyncio.run(ping())
    second = asyncio.run(ping())  # on the first loop's client this raised: its connections belong to a closed loop
    assert first is not second
