"""The asyncio Redis client is one per event loop: a worker that runs the panel's own requests in a fresh
`asyncio.run` per task (evaluation runs, shadow copies) must not reuse the connections of a loop that has closed
(the second evaluation run in a worker failed with "Event loop is closed" before)."""
import asyncio
import threading

from panel.core.redis_client import async_redis


def in_a_thread_of_its_own(coroutine_function):
    """asyncio.run in a thread without a loop, as a Celery task runs it (this test's thread may hold one: a browser
    test before it leaves Playwright's)."""
    found = {}

    def run():
        try:
            found["value"] = asyncio.run(coroutine_function())
        except BaseException as error:  # handed to the test's thread
            found["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    if "error" in found:
        raise found["error"]
    return found["value"]


def test_each_event_loop_gets_its_own_client_and_both_work(settings):
    async def ping():
        client = async_redis()
        assert await client.ping() is True
        assert async_redis() is client  # one client within a loop
        return client

    first = in_a_thread_of_its_own(ping)
    second = in_a_thread_of_its_own(ping)  # on the first loop's client this raised: its connections were closed
    assert first is not second
