"""Draining an engine before it stops: out of rotation first, then stopped once it runs nothing, so that no request
is cut. A replica falling asleep (serving/sleep.py) and a replica the scaler removes (serving/scaling.py) both drain:
every gateway process has re-read the route that no longer sends it requests (within ROUTE_VERSION_CHECK_SECONDS),
and what it still runs finishes, up to DRAIN_DEADLINE_SECONDS."""
import re
import time

import httpx
from django.conf import settings

from panel.serving.supervisor import engine_root

DRAIN_DEADLINE_SECONDS = 120.0
METRIC_LINE = re.compile(r"^(vllm:(?:prompt_tokens_total|num_requests_running|num_requests_waiting))"
                         r"(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)


def drain_seconds():
    """How long every gateway takes to see a route change: the least a drain waits."""
    return max(2 * settings.ROUTE_VERSION_CHECK_SECONDS, 2.0)


def engine_activity(port, api_key, *, timeout=2.0):
    """(prompt tokens the engine has taken in since it started, requests running or waiting now), from its own
    /metrics; None when it does not answer."""
    try:
        response = httpx.get(f"{engine_root(port)}/metrics", timeout=timeout,
                             headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    totals = {}
    for name, value in METRIC_LINE.findall(response.text):
        totals[name] = totals.get(name, 0.0) + float(value)
    return (totals.get("vllm:prompt_tokens_total", 0.0),
            totals.get("vllm:num_requests_running", 0.0) + totals.get("vllm:num_requests_waiting", 0.0))


def drained(deployment, *, since):
    """Whether a deployment draining since `since` (time.monotonic()) may stop its engine now: the gateways have
    seen the change and the engine runs nothing (or does not answer), or the drain's deadline has passed."""
    waited = time.monotonic() - since
    if waited < drain_seconds():
        return False
    if waited >= DRAIN_DEADLINE_SECONDS:
        return True
    activity = engine_activity(deployment.port, deployment.engine_key())
    return activity is None or not activity[1]
