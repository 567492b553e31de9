"""Waiting with a deadline: on a condition, or on a coroutine run in a thread of its own."""
import asyncio
import threading
import time


def wait_until(predicate, *, seconds=30, interval=0.2, message="condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {seconds} s waiting for {message}")


def run_coroutine(coroutine):
    """asyncio.run in a thread of its own: the session's Playwright (tests/support/browser.py) keeps an event loop
    running in the main thread once a browser test has run, and asyncio.run refuses to start beside it."""
    outcome = {}

    def run():
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # re-raised in the test's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, name="test-coroutine")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def without_a_wait(coroutine):
    """The coroutine's result when it finishes without waiting on anything (no Redis call, no query); else fails."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("it waited (a round trip on the request's path)")
