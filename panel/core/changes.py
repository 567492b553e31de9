"""Changes announced to every gateway process through one Redis channel, so that its caches need not ask Redis
whether something changed: a routing change (`route:<team id>`, after the change's commit) and a channel's failure
(`cool:<channel id>`, from the cooldown script that counts it). Each event loop that uses the caches holds one
subscription, opened by the first `token()` call on it; a blocked read costs nothing while nothing changes.

A value a cache read while this loop's subscription was live may be kept for as long as the same subscription stays
live (`token()` returns the same number) and no announcement about it came: a change made after the subscription
began is announced to it. When the subscription is lost, `token()` says None until a new one is live, so the caches
go back to asking Redis at their own pace; a new subscription has a new number, so nothing read before it counts as
heard (decision 0105)."""
import asyncio
import itertools
import logging
import os
import weakref

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from panel.core.redis_client import sync_redis

log = logging.getLogger(__name__)

CHANNEL = "tw:changes"
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)  # between attempts to subscribe again, then every last one
SUBSCRIBE_SECONDS = 5.0  # a subscription not confirmed by then is tried again

_handlers = {}  # kind -> [handler(ident)], called on this loop for each announcement of that kind
_listeners = weakref.WeakKeyDictionary()  # loop -> Listener
_numbers = itertools.count(1)  # numbers the subscriptions of this process, so that no two share one
_last = (None, None)  # the loop token() was last called on, and its listener


def on(kind, handler):
    """Call `handler(ident)` (plain, on the loop) for every `kind:ident` announced from now on."""
    _handlers.setdefault(kind, []).append(handler)


def announce(kind, ident):
    """Tell every gateway process that `ident` of `kind` changed (outside the event loop: a plain client). A lost
    announcement is logged: the caches' own expiry still applies."""
    try:
        sync_redis().publish(CHANNEL, f"{kind}:{ident}")
    except Exception as error:  # noqa: BLE001 - never undo the change that is being announced
        log.warning("could not announce a change of %s %s (%s)", kind, ident, type(error).__name__)


def token():
    """The number of this loop's live subscription, or None while it has none (opening one if nobody has)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    global _last
    last_loop, listener = _last  # one read: another thread's loop may replace it
    if last_loop is not loop:  # a gateway process has one loop: no weak-dictionary lookup on a request's path
        listener = _listeners.get(loop)
    if listener is None or listener.task.done():
        listener = _listeners[loop] = Listener(loop)
    _last = (loop, listener)
    return listener.epoch


def holds(read_under, live):
    """Whether a value read under the subscription numbered `read_under` (token() when it was read) still holds:
    that subscription is the one live now (`live`, token() now), so every change since was announced to it."""
    return live is not None and read_under == live


class Listener:
    """One subscription to CHANNEL on one event loop, opened again whenever it is lost."""

    def __init__(self, loop):
        self.epoch = None
        self.task = loop.create_task(self.run(), name="changes: listener")

    async def run(self):
        attempt = 0
        while True:
            # No reconnection inside the client: a connection lost is a subscription lost (announcements made
            # meanwhile were missed), and only a new subscription, with a new number, makes the caches trust again.
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_keepalive=True,
                                             retry=Retry(NoBackoff(), 0), client_name=f"tw-changes-{os.getpid()}")
            try:
                async with client.pubsub() as subscription, asyncio.timeout(SUBSCRIBE_SECONDS) as deadline:
                    await subscription.subscribe(CHANNEL)
                    async for message in subscription.listen():
                        if message["type"] == "subscribe":
                            deadline.reschedule(None)  # live: from now on the read waits for as long as it takes
                            self.epoch, attempt = next(_numbers), 0
                        elif message["type"] == "message":
                            dispatch(message["data"])
            except Exception as error:  # noqa: BLE001 - the caches ask Redis themselves until it is back
                if self.epoch is not None:
                    log.warning("lost the subscription to changes (%s); the caches ask Redis meanwhile",
                                type(error).__name__)
            finally:
                self.epoch = None
                await client.aclose()
            await asyncio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
            attempt += 1


def dispatch(data):
    kind, _, ident = (data.decode() if isinstance(data, bytes) else data).partition(":")
    for handler in _handlers.get(kind, ()):
        try:
            handler(ident)
        except Exception:  # noqa: BLE001 - one cache's failure leaves the others informed
            log.exception("a handler of %s changes failed", kind)
