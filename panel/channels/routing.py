"""Routing: which channels serve a model name for a team, in which order, and how a change reaches every gateway
process. The gateway (and Compare) call `route_for`, `model_names` and `target_for`; every routing change calls
`routing_changed`.

Routes are read from the database once and cached for ROUTE_CACHE_SECONDS. The cache honours the team's routing
version (a Redis counter bumped after every routing change, which also announces it: panel/core/changes.py). A
version read while the process's subscription to announcements is live holds until the team's next announcement, so
a change such as a canary rollback reaches every gateway process as soon as it is heard; without a live subscription
an entry is re-validated at most every ROUTE_VERSION_CHECK_SECONDS. A refresher (panel/core/refresher.py) reads the
versions not held so, one Redis call per round, and reloads the routes in use ahead of expiry, so a request waits on
neither; if Redis is unreachable the TTL alone applies."""
import json
import logging
import random
import time
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from panel.channels.models import ChannelKind, Route, RouteStrategy, ShadowState, listed_routes, order_channels
from panel.channels.pools import pool_facts
from panel.core import changes, outbound
from panel.core.redis_client import async_redis
from panel.core.refresher import Refresher
from panel.usage import samples

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What the gateway needs of a channel for one request (read once, cached)."""

    id: int
    name: str
    base_url: str
    model_id: str
    api_key: str | None
    credential_error: str
    timeout: float  # the total of one attempt
    max_retries: int
    backoff: float
    channel: object  # the Channel row, for its prices (read once, with the route)
    connect_timeout: float = 5.0
    first_byte_timeout: float = 10.0
    idle_timeout: float = 15.0
    loopback_ok: bool = False  # the deployment's own local channel: the engine listens on this machine
    context_tokens: int | None = None  # a local engine's context (max_model_len): no answer can be longer
    tool_calling: bool | None = None  # a local engine started with vLLM's auto tool choice (None: not an engine)
    engine_words: str = ""  # "deployment #3 (profile tiny-cpu)", for what the gateway says about a local engine
    batch_slots: int | None = None  # a local engine's max_num_seqs: requests it runs at once, the rest wait
    gpu_hourly: float | None = None  # a local engine's GPU price per hour (None: its host has none), shared out by
    # the minute among the requests it served (dashboards/local_cost.py)
    sleeping: int | None = None  # the deployment's id while it sleeps or wakes: a request wakes it (gateway/waking.py)
    kv_events: str = ""  # a local engine's KV-cache event stream (ZMQ), "" where it publishes none (decision 0099)
    kv_replay: str = ""  # ... and its replay socket
    tokenizer_dir: str = ""  # the served model's folder, where its tokenizer.json is (gateway/prompt_tokens.py)


@dataclass(frozen=True)
class Entry:
    """A cached RouteChannel: what `order_channels` reads, with the Target the upstream client needs."""

    channel: object
    position: int
    weight: int
    target: Target


@dataclass(frozen=True)
class CachedRule:
    """A RouteRule as the gateway keeps it: its conditions (what `rules.matches` reads) and its channels."""

    id: int
    name: str
    tokens_under: int | None
    tokens_over: int | None
    tools: str
    header_name: str
    header_value: str
    key_id: int | None
    api: str
    entries: tuple


@dataclass(frozen=True)
class ShadowPlan:
    """What the gateway needs of a route's running shadow test (channels/shadow.py; cached with the route)."""

    id: int
    target: Target  # the candidate's
    percent: int
    min_similarity: float


@dataclass(frozen=True)
class RouteTargets:
    route_id: int
    model_name: str
    strategy: str
    fallback_on_error: bool
    entries: tuple
    canary: Target | None = None  # the candidate channel while a canary is active
    canary_percent: int = 0
    deadline: float | None = 45.0  # seconds for every attempt, retry and fallback until the answer starts (None: none)
    rules: tuple = ()  # CachedRule, in the order they are tried
    balance: str = ""  # over the leading local channels (a deployment's replicas): gateway/balancing.py
    affinity_header: str = ""
    while_waking: str = "fallback"  # channels.models.WhileWaking
    sampling: object = None  # usage.samples.SamplePlan when the route keeps samples of its traffic
    shadow: ShadowPlan | None = None  # a running shadow test: a share of answered requests mirrored to a candidate
    spill_wait_ms: int = 0  # spill to the remote channels past this expected local wait (gateway/spill.py); 0: off

    def target(self, channel_id):
        """This route's current Target for a channel (its own entries, its rules', its canary), or None."""
        for entry in (*self.entries, *(entry for rule in self.rules for entry in rule.entries)):
            if entry.target.id == channel_id:
                return entry.target
        return self.canary if self.canary is not None and self.canary.id == channel_id else None

    def with_rule(self, rule):
        """The route as a request that matched `rule` sees it: the rule's channels in the rule's order, with the
        route's fallback, deadline and cooldowns. A canary compares its candidate with the route's own channels,
        so it does not apply here."""
        return replace(self, strategy=RouteStrategy.PRIORITY, entries=rule.entries, canary=None, canary_percent=0)

    def ordered(self, fields=None, rng=random):
        """The targets for one request, in the order the route's strategy gives. With an active canary,
        `canary_percent` % of the requests try the candidate first and fall back to that order; the arm is
        written into `fields` (the request's usage record) as `canary` = True/False."""
        by_channel = {entry.channel.pk: entry.target for entry in self.entries}
        stable = [by_channel[channel.pk] for channel in order_channels(self.strategy, self.entries, rng=rng)]
        if self.canary is None:
            return stable
        chosen = rng.random() * 100 < self.canary_percent
        if fields is not None:
            fields["canary"] = chosen
        return [self.canary, *stable] if chosen else stable


_cache = {}


def target_for(channel):
    """The Target of a channel row: its key read (or the reason it cannot be) once, here, not per request."""
    problem = channel.misconfigured
    api_key = None
    loopback_ok = channel.is_engine_channel
    if not problem:  # the checks that need no DNS; the gateway's resolver checks every resolved address
        refusal = outbound.static_refusal(channel.base_url, loopback_ok=loopback_ok)
        problem = f"the panel does not call its base URL: {refusal}" if refusal else ""
    if not problem:
        try:
            api_key = channel.api_key()
        except Exception as error:  # CredentialError: misconfigured, and never called with ciphertext
            problem = str(error)
    return Target(id=channel.pk, name=channel.name, base_url=channel.base_url, model_id=channel.model_id,
                  api_key=api_key, credential_error=f"channel {channel.name} is misconfigured: {problem}"
                  if problem else "", timeout=float(channel.timeout_seconds), max_retries=int(channel.max_retries),
                  backoff=float(channel.retry_backoff), channel=channel,
                  connect_timeout=float(channel.connect_timeout_seconds),
                  first_byte_timeout=float(channel.first_byte_timeout_seconds),
                  idle_timeout=float(channel.idle_timeout_seconds), loopback_ok=loopback_ok,
                  sleeping=_sleeping(channel), **(_engine_facts(channel.deployment) if loopback_ok else
                                                  pool_facts(channel) if channel.kind == ChannelKind.POOL else {}))


def _sleeping(channel):
    """The deployment's id when a local channel's engine sleeps or wakes (its address may move on waking, so this is
    read whether or not the channel still points at it)."""
    deployment = channel.deployment if channel.deployment_id and channel.kind == ChannelKind.LOCAL else None
    return deployment.pk if deployment is not None and deployment.sleeping else None


def _engine_facts(deployment):
    profile = deployment.profile
    return {"context_tokens": profile.max_model_len, "tool_calling": bool(profile.tool_call_parser),
            "engine_words": f"deployment #{deployment.pk} (profile {profile.name})",
            "batch_slots": profile.max_num_seqs, "gpu_hourly": deployment.hourly_price(),
            **kv_event_endpoints(deployment)}


KV_EVENTS_FLAG = "--kv-events-config"  # as serving/kv_events.py passes it


def kv_event_endpoints(deployment):
    """Where the deployment's engine publishes its KV-cache events, read from the command it was started with
    (serving/kv_events.py adds the flag): {kv_events, kv_replay, tokenizer_dir}, or {} where it publishes none. A
    TCP endpoint bound on every interface is reached at the engine's own address."""
    argv = list(deployment.command or ())
    value = None
    for index, word in enumerate(argv):
        if word == KV_EVENTS_FLAG and index + 1 < len(argv):
            value = argv[index + 1]
        elif isinstance(word, str) and word.startswith(KV_EVENTS_FLAG + "="):
            value = word.split("=", 1)[1]
    try:
        config = json.loads(value) if value else None
    except ValueError:
        return {}
    if not isinstance(config, dict) or not config.get("enable_kv_cache_events") or not config.get("replay_endpoint"):
        return {}
    host = urlsplit(deployment.base_url).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host

    def reachable(endpoint):
        return str(endpoint).replace("tcp://*:", f"tcp://{host}:")

    return {"kv_events": reachable(config.get("endpoint", "")), "kv_replay": reachable(config["replay_endpoint"]),
            "tokenizer_dir": deployment.profile.model.path}


def _load(team_id, model_name):
    route = (Route.objects.select_related("canary_channel")
             .filter(team_id=team_id, model_name=model_name, enabled=True).first())
    if route is None:
        return None
    entries = [Entry(channel=link.channel, position=link.position, weight=link.weight, target=target_for(link.channel))
               for link in route.entries() if link.channel_id != route.canary_channel_id]
    rules = tuple(
        CachedRule(id=rule.pk, name=rule.name, tokens_under=rule.tokens_under, tokens_over=rule.tokens_over,
                   tools=rule.tools, header_name=rule.header_name, header_value=rule.header_value,
                   key_id=rule.key_id, api=rule.api,
                   entries=tuple(Entry(channel=link.channel, position=link.position, weight=1,
                                       target=target_for(link.channel))
                                 for link in rule.routerulechannel_set.all()))
        for rule in route.rules.prefetch_related("routerulechannel_set__channel").order_by("position", "pk"))
    canary = None
    if route.canary_active and route.canary_channel.enabled:
        canary = target_for(route.canary_channel)
    return RouteTargets(route_id=route.pk, model_name=route.model_name, strategy=route.strategy,
                        fallback_on_error=route.fallback_on_error, entries=tuple(entries), canary=canary,
                        canary_percent=route.canary_percent if canary else 0, deadline=float(route.deadline_seconds),
                        rules=rules, balance=route.balance, affinity_header=route.affinity_header,
                        while_waking=route.while_waking, sampling=samples.plan_for(route), shadow=_shadow(route),
                        spill_wait_ms=route.spill_wait_ms)


def route_read(team_id, model_name):
    """The team's enabled route for `model_name` as the gateway caches it, read now (None when there is none): for
    the panel's own requests to a route (Compare, an evaluation run), which go through the gateway's pipeline."""
    return _load(team_id, model_name)


def channel_route(channel, *, retries=None):
    """A route of one channel, for the panel's own requests to a channel by name (a Compare column, an evaluation's
    candidate or helper, a shadow test's candidate): no fallback, no rules, no canary; the channel's own timeout is
    its deadline. `retries`: the attempts after the first (None: the channel's own setting)."""
    target = channel if isinstance(channel, Target) else target_for(channel)
    if retries is not None:
        target = replace(target, max_retries=retries)
    return RouteTargets(route_id=None, model_name=target.model_id, strategy=RouteStrategy.PRIORITY,
                        fallback_on_error=False, entries=(Entry(channel=target.channel, position=0, weight=1,
                                                                target=target),),
                        deadline=None)


def _shadow(route):
    """The route's running shadow test, or None (a disabled candidate mirrors nothing)."""
    shadow = route.shadow_tests.filter(state=ShadowState.RUNNING).select_related("candidate").first()
    if shadow is None or shadow.candidate is None or not shadow.candidate.enabled:
        return None
    return ShadowPlan(id=shadow.pk, target=target_for(shadow.candidate), percent=shadow.percent,
                      min_similarity=shadow.min_similarity)


def _load_names(team_id):
    """The model names /v1/models lists: the team's enabled routes, not those of ladder and sweep steps."""
    return sorted(listed_routes(team_id).filter(enabled=True).values_list("model_name", flat=True))


async def route_for(team_id, model_name):
    return await _cached(("route", team_id, model_name), team_id, lambda: _load(team_id, model_name))


async def model_names(team_id):
    return await _cached(("names", team_id), team_id, lambda: _load_names(team_id))


_versions = {}  # team id -> (checked at, version, the live subscription it was read under or None)
_heard_count = 0  # routing changes announced to this process: a version read across one is not held


async def _version(team_id, now):
    """The team's routing version (None: unknown), as last read and still held, or read here (the first request of
    a while, or the first after an announced change)."""
    token, heard = changes.token(), _heard_count
    seen = _versions.get(team_id)
    if seen and (changes.holds(seen[2], token) or now - seen[0] < settings.ROUTE_VERSION_CHECK_SECONDS):
        return seen[1]
    version = (await _read_versions([team_id]))[0]
    if len(_versions) > 10_000:
        _versions.clear()
    _versions[team_id] = (now, version, token if heard == _heard_count else None)
    return version


def _heard(ident):
    """An announced routing change: the team's version is read again, by the next request or the refresher's next
    round, whichever comes first."""
    global _heard_count
    _heard_count += 1
    _versions.pop(int(ident), None)


changes.on("route", _heard)


async def _read_versions(team_ids):
    """The teams' routing versions from Redis in one call; None for each when Redis cannot answer (the TTL alone
    applies then)."""
    try:
        raw = await async_redis().mget([cache.make_and_validate_key(_version_key(team_id)) for team_id in team_ids])
        return [int(value or 0) for value in raw]
    except Exception:  # Redis down or an odd value
        log.debug("routing versions of teams %s unreadable", team_ids, exc_info=True)
        return [None] * len(team_ids)


async def _cached(key, team_id, load):
    now = time.monotonic()
    version = await _version(team_id, now)
    hit = _cache.get(key)
    if hit and hit[0] > now and (version is None or hit[2] == version):
        value = hit[1]
    else:
        value = await sync_to_async(load, thread_sensitive=False)()
        _store(key, now, value, version, load)
    # Kept fresh while in use; a name no route serves is not (anyone can make names up).
    REFRESHER.touch(key if value is not None else None)
    return value


def _store(key, loaded_at, value, version, load):
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[key] = (loaded_at + settings.ROUTE_CACHE_SECONDS, value, version, load)


async def _refresh():
    """The refresher's round: the routing versions of the teams whose routes were read lately, in one Redis call,
    then a reload (in a thread) of each such route whose version changed or that would expire before the round
    after next. A request then finds its route and version fresh in memory."""
    now, token, heard = time.monotonic(), changes.token(), _heard_count
    in_use = REFRESHER.in_use()
    teams = sorted({key[1] for key in in_use if not changes.holds(_versions.get(key[1], (0, None, None))[2], token)})
    if teams:
        read = await _read_versions(teams)
        token = token if heard == _heard_count else None
        for team_id, version in zip(teams, read):
            if version is not None:
                _versions[team_id] = (now, version, token)
    ahead = _refresh_interval() + settings.ROUTE_VERSION_CHECK_SECONDS
    for key in in_use:
        hit = _cache.get(key)
        if hit is None or hit[1] is None or not settings.ROUTE_CACHE_SECONDS:
            continue
        expires, _, version, load = hit
        current = _versions.get(key[1], (0, None))[1]
        if (current is not None and current != version) or expires - time.monotonic() < ahead:
            loaded_at = time.monotonic()
            _store(key, loaded_at, await sync_to_async(load, thread_sensitive=False)(), current, load)


def _refresh_interval():
    """Half the version check's time, so a version is read again before it is due; with a live subscription, which
    holds the versions, a fifth of the cache's time, for the reloads ahead of expiry alone."""
    check = settings.ROUTE_VERSION_CHECK_SECONDS
    if not check or changes.token() is None:
        return check / 2
    return max(check / 2, settings.ROUTE_CACHE_SECONDS / 5)


REFRESHER = Refresher("routes", _refresh, _refresh_interval)


def _version_key(team_id):
    return f"channels:routing-version:{team_id}"


def routing_changed(team_id):
    """Tell the gateway (after commit) that this team's channels or routes changed: it drops its cached copy."""
    def bump():
        try:
            cache.add(_version_key(team_id), 0, timeout=None)
            cache.incr(_version_key(team_id))
        except Exception:  # a cache outage must not undo a saved change; the gateway's TTL still applies
            log.warning("could not bump the routing version of team %s", team_id, exc_info=True)
        changes.announce("route", team_id)

    transaction.on_commit(bump)


def routing_version(team_id):
    """A number that changes whenever the team's channels or routes change (0 when unknown)."""
    try:
        return int(cache.get(_version_key(team_id)) or 0)
    except Exception:
        return 0
