"""Which channels serve a model name for a team, read from the database once and cached for a few seconds."""
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings

from panel.gateway.upstream import Target


@dataclass(frozen=True)
class Entry:
    """A cached RouteChannel: what `order_channels` reads, with the Target the upstream client needs."""

    channel: object
    position: int
    weight: int
    target: Target


@dataclass(frozen=True)
class RouteTargets:
    route_id: int
    model_name: str
    strategy: str
    fallback_on_error: bool
    entries: tuple

    def ordered(self):
        """The targets for one request, in the order the route's strategy gives."""
        from panel.channels.models import order_channels

        by_channel = {entry.channel.pk: entry.target for entry in self.entries}
        return [by_channel[channel.pk] for channel in order_channels(self.strategy, self.entries)]


_cache = {}


def _target(channel):
    problem = channel.misconfigured
    api_key = None
    if not problem:
        try:
            api_key = channel.api_key()
        except Exception as error:  # CredentialError: misconfigured, and never called with ciphertext
            problem = str(error)
    return Target(id=channel.pk, name=channel.name, base_url=channel.base_url, model_id=channel.model_id,
                  api_key=api_key, credential_error=f"channel {channel.name} is misconfigured: {problem}"
                  if problem else "", timeout=float(channel.timeout_seconds), max_retries=int(channel.max_retries),
                  backoff=float(channel.retry_backoff), channel=channel)


def _load(team_id, model_name):
    from panel.channels.models import Route

    route = Route.objects.filter(team_id=team_id, model_name=model_name, enabled=True).first()
    if route is None:
        return None
    entries = [Entry(channel=link.channel, position=link.position, weight=link.weight, target=_target(link.channel))
               for link in route.entries()]
    return RouteTargets(route_id=route.pk, model_name=route.model_name, strategy=route.strategy,
                        fallback_on_error=route.fallback_on_error, entries=tuple(entries))


def _load_names(team_id):
    from panel.channels.models import Route

    return sorted(Route.objects.filter(team_id=team_id, enabled=True).values_list("model_name", flat=True))


async def route_for(team_id, model_name):
    return await _cached(("route", team_id, model_name), lambda: _load(team_id, model_name))


async def model_names(team_id):
    return await _cached(("names", team_id), lambda: _load_names(team_id))


async def _cached(key, load):
    hit = _cache.get(key)
    now = time.monotonic()
    if hit and hit[0] > now:
        return hit[1]
    value = await sync_to_async(load, thread_sensitive=False)()
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[key] = (now + settings.ROUTE_CACHE_SECONDS, value)
    return value
