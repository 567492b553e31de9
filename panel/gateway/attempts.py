"""One request's attempts: the retry loop over a route's channels (the HTTP client's own retries are off), fallback
to the next channel until the first byte has reached the client, the route's deadline over all of it, the attempt
trail for the usage record, and cooldowns for channels that keep failing."""
import asyncio
import time

from django.conf import settings

from panel.gateway.cooldowns import COOLDOWN
from panel.gateway.upstream import RETRY_AFTER_CAP_SECONDS, Limits, UpstreamError
from panel.notifications.cooldown import channel_cooled_down

# A channel that hangs is not asked again: the next channel is (a stuck server stays stuck for a while).
NOT_RETRIED_ON_THE_SAME_CHANNEL = ("stalled",)


def backoff_delay(target, attempt, error):
    if error.retry_after is not None:
        delay = error.retry_after
    else:
        delay = settings.GATEWAY_BACKOFF_BASE_SECONDS * (target.backoff ** attempt)
    return min(delay, RETRY_AFTER_CAP_SECONDS)


def limits_for(target, remaining, *, stream):
    """The attempt's budgets: the channel's, cut to what is left of the route's deadline. A stream's total is the
    channel's alone: once its first token has arrived the deadline no longer applies (the answer has started)."""
    first_byte = min(target.first_byte_timeout, target.timeout)
    if remaining is None:
        return Limits(first_byte=first_byte, total=target.timeout)
    return Limits(first_byte=min(first_byte, remaining),
                  total=target.timeout if stream else min(target.timeout, remaining))


def step(target, outcome, began, status=None):
    return {"channel": target.name, "channel_id": target.id, "outcome": outcome,
            "ms": round((time.perf_counter() - began) * 1000), "status": status}


def add_step(log, target, outcome, began, status=None):
    """One step on the trail, and its times (perf_counter, kept out of the usage row) for the request's trace: one
    span per step (panel/gateway/tracing.py)."""
    entry = step(target, outcome, began, status)
    log["trail"].append(entry)
    log.setdefault("times", []).append((entry, target, began, time.perf_counter()))


async def first_success(targets, attempt_call, *, fallback_on_error, log, deadline=None, stream=False, waker=None):
    """Try each target (retries with backoff on retryable errors) until `attempt_call(target, limits)` succeeds,
    within `deadline` seconds for all of it. Returns (target, value); raises the last UpstreamError (kind
    "deadline" when the route's deadline ran out). `log` collects the attempts, the trail of each (channel, outcome,
    ms, status), `current` (the channel being called) and `fell_back` (the answer is not from the first choice).
    A sleeping local engine is woken by `waker` (gateway/waking.py), which says whether to wait for it."""
    targets = list(targets)
    first_choice = targets[0].id if targets else None
    log.setdefault("trail", [])
    ends = time.monotonic() + deadline if deadline else None
    last = UpstreamError("no_channel", "the route has no enabled channel", retryable=False)
    ordered = await COOLDOWN.order(targets)
    for index, target in enumerate(ordered):
        if index and not fallback_on_error:
            break
        if target.sleeping is not None:
            began = time.perf_counter()
            awake = None if waker is None else await waker(
                target, until=ends, has_next=fallback_on_error and index + 1 < len(ordered))
            log["current"] = target
            if awake is None:
                add_step(log, target, "waking", began)
                last = UpstreamError("waking", f"the local engine of {target.name} is waking from sleep and was "
                                               "not ready in time", retryable=False)
                continue
            add_step(log, target, "woke", began)
            target = awake
        if target.credential_error:
            last = UpstreamError("misconfigured", target.credential_error, retryable=False)
            add_step(log, target, "misconfigured", time.perf_counter())
            log["current"] = target
            continue
        for attempt in range(target.max_retries + 1):
            remaining = None if ends is None else ends - time.monotonic()
            if remaining is not None and remaining <= 0.05:
                raise UpstreamError("deadline", f"no channel answered within the route's deadline of {deadline:g} s "
                                                f"(last: {last})", retryable=False)
            log["attempts"] += 1
            log["current"] = target
            began = time.perf_counter()
            try:
                value = await attempt_call(target, limits_for(target, remaining, stream=stream))
            except UpstreamError as error:
                last = error
                add_step(log, target, error.kind, began, error.status)
                if error.kind == "rate_limited":
                    log["rate_limited"] = log.get("rate_limited", 0) + 1
                if error.client_fault:
                    raise
                if (not error.retryable or error.kind in NOT_RETRIED_ON_THE_SAME_CHANNEL
                        or attempt == target.max_retries):
                    break
                delay = backoff_delay(target, attempt, error)
                if ends is not None and time.monotonic() + delay >= ends:
                    break  # no time left for a retry here: the next channel, if any, gets what is left
                await asyncio.sleep(delay)
                continue
            add_step(log, target, "ok", began, 200)
            await COOLDOWN.succeeded(target.id)
            log["fell_back"] = target.id != first_choice
            return target, value
        failures, began_cooldown = await COOLDOWN.failed(target.id)
        if began_cooldown:
            channel_cooled_down(team_id=getattr(target.channel, "team_id", None), channel_id=target.id,
                                channel_name=target.name, failures=failures, seconds=COOLDOWN.seconds)
    raise last
