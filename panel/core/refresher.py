"""Caches on the gateway's hot path kept fresh by a task of their own, so that a request reads them from memory and
never waits on Redis or the database itself: the keys, the budgets, the routes (and their routing version) and the
channels' cooldowns. Each cache says when a request used it (`touch`); while it was used within the last
ACTIVE_SECONDS, its `refresh` runs every `interval` seconds on that event loop and reloads, ahead of time, what is
about to go stale. A cache nobody uses costs nothing: the task ends, and the next request starts it again (that
request, and only that one, reads what it needs itself, as every request did before; decision 0078).

A refresh that fails is logged and tried again at the next interval; meanwhile the cache's own expiry applies, so
a request never gets an answer older than it would without the refresher."""
import asyncio
import logging
import time
import weakref

log = logging.getLogger(__name__)

ACTIVE_SECONDS = 60.0  # kept fresh this long after a request used the cache
REFRESH_DEADLINE_SECONDS = 5.0  # one refresh (a Redis call, a query in a thread) ends by then


class Refresher:
    """Runs `refresh()` (a coroutine function) every `interval()` seconds on each event loop where `touch()` was
    called within ACTIVE_SECONDS. `interval` is a function, so a settings change applies at the next round; 0 or
    less: no refreshing (each request reads for itself)."""

    def __init__(self, name, refresh, interval):
        self.name, self.refresh, self.interval = name, refresh, interval
        self._loops = weakref.WeakKeyDictionary()  # loop -> [its task, when a request last touched it]
        self.used = {}  # what requests used (a cache's keys) -> when last

    def touch(self, item=None):
        """Called on the hot path, with what the request used when there is one to keep fresh: this loop's
        refresher runs on, or starts (outside a loop it only notes the item)."""
        if item is not None:
            self.used[item] = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        state = self._loops.get(loop)
        if state is not None and not state[0].done():
            state[1] = time.monotonic()
            return
        if self.interval() > 0:
            self._loops[loop] = [loop.create_task(self._run(loop), name=f"refresher: {self.name}"), time.monotonic()]

    def in_use(self):
        """What requests used within ACTIVE_SECONDS, for `refresh` to keep fresh (the rest is forgotten)."""
        now = time.monotonic()
        for item in [item for item, used in self.used.items() if now - used > ACTIVE_SECONDS]:
            del self.used[item]
        return list(self.used)

    async def _run(self, loop):
        while True:
            seconds = self.interval()
            if seconds <= 0:
                return
            await asyncio.sleep(seconds)
            if time.monotonic() - self._loops[loop][1] > ACTIVE_SECONDS:
                return
            try:
                async with asyncio.timeout(REFRESH_DEADLINE_SECONDS):
                    await self.refresh()
            except Exception as error:  # the cache's own expiry still applies; the next round tries again
                log.warning("%s: refresh failed (%s); trying again in %g s", self.name, type(error).__name__,
                            seconds)
