"""Waking a sleeping local engine (serving/sleep.py) for a request: the request that finds its local channel asleep
flips the deployment to waking (once across every gateway process: a Redis SET NX in front of the database write),
then either goes on to the route's next channel or waits for the engine to be ready, up to the route's deadline, as
the route says (`Route.while_waking`). A route with no next channel waits. The attempt trail says which: "waking"
(it went on), "woke" (it waited and the engine answered)."""
import asyncio
import logging
import time

from asgiref.sync import sync_to_async

from panel.channels.models import Channel, WhileWaking
from panel.channels.routing import route_for, target_for
from panel.core.redis_client import async_redis
from panel.serving.models import Deployment
from panel.serving.sleep import deployment_wake

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
WAKE_AGAIN_SECONDS = 5  # a wake whose write was lost (the worker busy, a restart) is sent again after this long
LONGEST_WAIT_SECONDS = 300.0  # a request without a deadline (the panel's own, such as Compare's) waits this long


async def wake(deployment_id, *, by):
    """Ask for the deployment to wake, at most once per WAKE_AGAIN_SECONDS across gateway processes."""
    try:
        first = await async_redis().set(f"tw:wake:{deployment_id}", "1", nx=True, ex=WAKE_AGAIN_SECONDS)
    except Exception:  # Redis down: every request asks (the transition is conditional: one of them moves it)
        first = True
    if first:
        await sync_to_async(_wake)(deployment_id, by)


def _wake(deployment_id, by):
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is not None and deployment_wake(deployment, by=by):
        log.info("woke deployment #%s: %s", deployment_id, by)


class Waker:
    """Wakes the sleeping local engines one request meets; `wait` says whether the request waits for them when it has
    somewhere else to go; `refresh(channel_id)` gives the channel's current Target (None once it is gone)."""

    def __init__(self, *, by, wait, refresh):
        self.by, self.wait, self.refresh = by, wait, refresh

    @classmethod
    def for_route(cls, team_id, route):
        if route.route_id is None:  # the panel's own request to one channel (routing.channel_route)
            return cls.for_channels(f"a request to channel {route.entries[0].target.name}")

        async def refresh(channel_id):
            current = await route_for(team_id, route.model_name)
            return current.target(channel_id) if current is not None else None

        return cls(by=f"a request for {route.model_name}", wait=route.while_waking == WhileWaking.WAIT,
                   refresh=refresh)

    @classmethod
    def for_channels(cls, by):
        """For requests that name their channel (Compare): they wait, having nowhere else to go."""
        return cls(by=by, wait=True, refresh=sync_to_async(_channel_target))

    async def __call__(self, target, *, until, has_next):
        """Wake `target`'s engine; the ready Target to call once it is up, or None to go on to the next channel
        (or when it did not wake in time, or stopped)."""
        await wake(target.sleeping, by=self.by)
        if has_next and not self.wait:
            return None
        until = until if until is not None else time.monotonic() + LONGEST_WAIT_SECONDS
        while time.monotonic() < until:
            await asyncio.sleep(min(POLL_SECONDS, max(until - time.monotonic(), 0)))
            current = await self.refresh(target.id)
            if current is None:
                return None
            if current.sleeping is None:
                return current
            await wake(current.sleeping, by=self.by)  # still asleep after WAKE_AGAIN_SECONDS: ask again
        return None


def _channel_target(channel_id):
    channel = Channel.objects.select_related("deployment__profile").filter(pk=channel_id, enabled=True).first()
    return target_for(channel) if channel is not None else None
