"""Calling upstream channels: one retry loop (the HTTP client's own retries are off), fallback to the next
channel until the first byte has reached the client, cooldown for channels that keep failing."""
import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
from django.conf import settings

from panel.core import outbound, safejson
from panel.notifications.cooldown import channel_cooled_down

RETRY_AFTER_CAP_SECONDS = 5.0
COOLDOWN_AFTER_FAILURES = 3
COOLDOWN_SECONDS = 30.0

_session = None
_engine_session = None

# aiohttp rather than httpx on the gateway's hot path: measured here, httpx's async client alone added about
# 2 ms per streamed request, most of the gateway's overhead (docs/benchmarks.md).
TRANSPORT_ERRORS = (aiohttp.ClientError, ConnectionError, OSError)


def session(loopback_ok=False):
    """One connection pool per process and policy (created inside the running event loop). Every address a name
    resolves to is checked by the outbound policy before the connection (no DNS rebinding); only the
    deployments' own local channels may reach this machine."""
    global _session, _engine_session
    current = _engine_session if loopback_ok else _session
    if current is None or current.closed:
        connector = aiohttp.TCPConnector(limit=1000, keepalive_timeout=30, ttl_dns_cache=60,
                                         resolver=outbound.PolicyResolver(loopback_ok=loopback_ok))
        current = aiohttp.ClientSession(connector=connector, auto_decompress=True, raise_for_status=False,
                                        json_serialize=json.dumps)
        if loopback_ok:
            _engine_session = current
        else:
            _session = current
    return current


def timeouts(target):
    # sock_read bounds the wait for the headers and for every later chunk: a hang before headers and a stall
    # mid-stream both end after the channel's timeout.
    return aiohttp.ClientTimeout(total=None, sock_connect=target.timeout, sock_read=target.timeout)


class UpstreamError(Exception):
    """One failed attempt. `retryable`: try again / elsewhere; `client_fault`: the request itself is bad."""

    def __init__(self, kind, message, *, status=None, retry_after=None, retryable=True, client_fault=False,
                 body=None):
        super().__init__(message)
        self.kind, self.status, self.retry_after = kind, status, retry_after
        self.retryable, self.client_fault, self.body = retryable, client_fault, body


class Cooldown:
    """Consecutive failures per channel in this process; after a few, the channel rests and is probed later."""

    def __init__(self):
        self.failures = {}
        self.until = {}

    def cooled(self, channel_id):
        return self.until.get(channel_id, 0) > time.monotonic()

    def failed(self, channel_id):
        """Count a failure; True when it starts a cooldown (the channel was not resting yet)."""
        count = self.failures.get(channel_id, 0) + 1
        self.failures[channel_id] = count
        if count >= COOLDOWN_AFTER_FAILURES:
            began = not self.cooled(channel_id)
            self.until[channel_id] = time.monotonic() + COOLDOWN_SECONDS
            return began
        return False

    def succeeded(self, channel_id):
        self.failures.pop(channel_id, None)
        self.until.pop(channel_id, None)


COOLDOWN = Cooldown()


def order_for_request(targets):
    """Cooled-down channels go last: they are tried only when everything else failed (that is their probe)."""
    return sorted(targets, key=lambda target: COOLDOWN.cooled(target.id))


def upstream_body(body, target, *, stream):
    payload = dict(body)
    payload["model"] = target.model_id
    if stream:
        options = dict(payload.get("stream_options") or {})
        options["include_usage"] = True  # usage for the record, even if the client did not ask
        payload["stream_options"] = options
    return payload


def headers_for(target):
    return {"content-type": "application/json", "accept": "application/json, text/event-stream",
            "authorization": f"Bearer {target.api_key}", outbound.HOP_HEADER: "1"}


def error_from_response(status, body_bytes, headers, *, secret=""):
    if secret and len(secret) >= 4:  # some providers echo the key they refused; never pass it on to the client
        body_bytes = body_bytes.replace(secret.encode(), b"****")
    retry_after = None
    if status == 429:
        try:
            retry_after = min(float(headers.get("retry-after", "1")), RETRY_AFTER_CAP_SECONDS)
        except ValueError:
            retry_after = 1.0
    try:
        message = safejson.loads(body_bytes).get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        message = body_bytes[:200].decode("utf-8", "replace")
    if status in (400, 413, 422):
        return UpstreamError("bad_request", message or f"upstream refused the request ({status})", status=status,
                             retryable=False, client_fault=True, body=body_bytes)
    if status in (401, 403):
        return UpstreamError("upstream_auth", message or "the channel's key was refused", status=status,
                             retryable=False)
    if status == 404:
        return UpstreamError("upstream_not_found", message or "the channel does not serve this model or path",
                             status=status, retryable=False)
    if status == 429:
        return UpstreamError("rate_limited", message or "the channel's quota is exhausted", status=status,
                             retry_after=retry_after)
    return UpstreamError("upstream_error", message or f"the channel answered {status}", status=status)


async def post_json(target, path, payload):
    """A non-streaming call. Returns the parsed body."""
    try:
        async with session(target.loopback_ok).post(target.base_url.rstrip("/") + path, data=json.dumps(payload).encode(),
                                  headers=headers_for(target), timeout=timeouts(target)) as response:
            body = await response.read()
            status, headers = response.status, response.headers
    except asyncio.TimeoutError:
        raise UpstreamError("timeout", f"no answer within {target.timeout:g} s") from None
    except TRANSPORT_ERRORS as error:
        raise UpstreamError("connection", f"cannot reach the channel ({type(error).__name__})") from None
    if status != 200:
        raise error_from_response(status, body, headers, secret=target.api_key)
    try:
        return safejson.loads(body)
    except ValueError:
        raise UpstreamError("malformed", "the channel answered 200 with a body that is not JSON") from None


@dataclass
class OpenStream:
    """A 200 stream whose first event has been read and checked; nothing has reached the client yet."""

    response: object
    lines: object
    first: list = field(default_factory=list)


async def stream_lines(response):
    async for raw in response.content:
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


async def open_stream(target, path, payload):
    try:
        response = await session(target.loopback_ok).post(target.base_url.rstrip("/") + path, data=json.dumps(payload).encode(),
                                        headers=headers_for(target), timeout=timeouts(target))
    except asyncio.TimeoutError:
        raise UpstreamError("timeout", f"no answer within {target.timeout:g} s") from None
    except TRANSPORT_ERRORS as error:
        raise UpstreamError("connection", f"cannot reach the channel ({type(error).__name__})") from None
    if response.status != 200:
        try:
            body = await response.read()
        except (asyncio.TimeoutError, *TRANSPORT_ERRORS):
            body = b""
        response.close()
        raise error_from_response(response.status, body, response.headers, secret=target.api_key)
    lines = stream_lines(response)
    first = []
    try:
        async for line in lines:
            first.append(line)
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = parse_event(data)
            if event is None:
                raise UpstreamError("malformed", "the channel's stream has an event that is not JSON")
            if "error" in event:
                raise UpstreamError("error_event", str(event["error"].get("message", "error event in the stream")
                                                       if isinstance(event["error"], dict) else event["error"]))
            break
        else:
            raise UpstreamError("cut", "the channel's stream ended before its first event")
    except asyncio.TimeoutError:
        response.close()
        raise UpstreamError("timeout", f"no first token within {target.timeout:g} s") from None
    except TRANSPORT_ERRORS as error:
        response.close()
        raise UpstreamError("cut", f"the channel's stream broke ({type(error).__name__})") from None
    except UpstreamError:
        response.close()
        raise
    return OpenStream(response=response, lines=lines, first=first)


def parse_event(data):
    try:
        event = safejson.loads(data)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


async def backoff(target, attempt, error):
    if error.retry_after is not None:
        delay = error.retry_after
    else:
        delay = settings.GATEWAY_BACKOFF_BASE_SECONDS * (target.backoff ** attempt)
    await asyncio.sleep(min(delay, RETRY_AFTER_CAP_SECONDS))


async def first_success(targets, attempt_call, *, fallback_on_error, log):
    """Try each target (retries with backoff on retryable errors) until `attempt_call(target)` succeeds.
    Returns (target, value). Raises the last UpstreamError. `log` collects attempts for the usage record."""
    last = UpstreamError("no_channel", "the route has no enabled channel", retryable=False)
    for index, target in enumerate(order_for_request(targets)):
        if index and not fallback_on_error:
            break
        if target.credential_error:
            last = UpstreamError("misconfigured", target.credential_error, retryable=False)
            continue
        for attempt in range(target.max_retries + 1):
            log["attempts"] += 1
            try:
                value = await attempt_call(target)
            except UpstreamError as error:
                last = error
                if error.kind == "rate_limited":
                    log["rate_limited"] = log.get("rate_limited", 0) + 1
                if error.client_fault:
                    raise
                if not error.retryable or attempt == target.max_retries:
                    break
                await backoff(target, attempt, error)
                continue
            COOLDOWN.succeeded(target.id)
            log["fell_back"] = index > 0
            return target, value
        if COOLDOWN.failed(target.id):
            channel_cooled_down(team_id=getattr(target.channel, "team_id", None), channel_id=target.id, channel_name=target.name,
                                failures=COOLDOWN.failures[target.id], seconds=COOLDOWN_SECONDS)
    raise last
