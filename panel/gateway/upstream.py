"""Calling one upstream channel once, within the attempt's time budgets: connect, first byte (the first stream event;
a non-streamed request is asked for as a stream too), idle (between two chunks) and total. The retry loop, fallback and
cooldowns are in panel/gateway/attempts.py."""
import asyncio
import collections
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings

from panel.core import outbound, safejson
from panel.gateway import http_client
from panel.gateway.assemble import Assembly

RETRY_AFTER_CAP_SECONDS = 5.0

# The gateway's own HTTP client (panel/gateway/http_client.py), not aiohttp's: what the gateway adds to a client's
# time to first token is mostly the upstream call's CPU (decision 0077, docs/benchmarks.md).
TRANSPORT_ERRORS = (OSError,)  # ConnectionError and TimeoutError included


async def connections_close():
    """Close this event loop's kept upstream connections: for a caller that runs requests in a loop of its own and
    is done with it."""
    await http_client.close_kept()


@dataclass(frozen=True)
class Limits:
    """One attempt's time budgets in seconds, the route's deadline already applied."""

    first_byte: float
    total: float | None


class UpstreamError(Exception):
    """One failed attempt. `retryable`: try again / elsewhere; `client_fault`: the request itself is bad."""

    def __init__(self, kind, message, *, status=None, retry_after=None, retryable=True, client_fault=False,
                 body=None):
        super().__init__(message)
        self.kind, self.status, self.retry_after = kind, status, retry_after
        self.retryable, self.client_fault, self.body = retryable, client_fault, body


def upstream_body(body, target, *, stream):
    payload = dict(body)
    payload["model"] = target.model_id
    if stream:
        options = dict(payload.get("stream_options") or {})
        options["include_usage"] = True  # usage for the record, even if the client did not ask
        payload["stream_options"] = options
    return payload


ANTHROPIC_VERSION = "2023-06-01"


def headers_for(target, api="chat", extra=()):
    """The request headers. A Messages call carries the key as Anthropic clients send it (x-api-key, with the API
    version); a remote channel that speaks only Messages (Anthropic's own API) gets no Bearer beside it, which it
    would read as a different kind of credential. A local vLLM keeps its Bearer: its --api-key check reads only
    that header, on /v1/messages too."""
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "authorization": f"Bearer {target.api_key}", outbound.HOP_HEADER: "1"}
    if api == "messages":
        headers.update({"x-api-key": target.api_key or "", "anthropic-version": ANTHROPIC_VERSION})
        if not target.channel.speaks("chat") and not target.channel.is_local:
            del headers["authorization"]
    headers.update(extra)
    return headers


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
    if 300 <= status < 400:
        return UpstreamError("upstream_redirect", f"the channel answered a redirect ({status}), which is never "
                             "followed", status=status, retryable=False)
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


def stalled(seconds, what):
    return UpstreamError("stalled", f"{what} within {seconds:g} s")


def too_large(what, limit):
    """An answer past the gateway's size caps: the attempt fails and nothing of it is kept. Asking the same channel
    again would bring the same answer: the next channel is asked."""
    return UpstreamError("upstream_too_large", f"the channel sent {what} larger than {limit:,} bytes, more than the "
                         "gateway accepts (TOKENWISE_GATEWAY_MAX_ANSWER_BYTES, TOKENWISE_GATEWAY_MAX_EVENT_BYTES)",
                         retryable=False)


async def send_request(target, path, payload, limits, api="chat", extra_headers=()):
    """POST and wait for the response headers, at most `limits.first_byte` seconds. A redirect is an answer like any
    other non-200, never followed: it would carry x-api-key (the operator's key, maybe) to another origin."""
    try:
        async with asyncio.timeout(limits.first_byte):
            return await http_client.post(target.base_url.rstrip("/") + path, safejson.dumps(payload),
                                          headers_for(target, api, extra_headers), loopback_ok=target.loopback_ok,
                                          connect_timeout=target.connect_timeout, total=limits.total)
    except http_client.ConnectTimeout:
        raise UpstreamError("connection", f"no connection within {target.connect_timeout:g} s") from None
    except TimeoutError:
        raise stalled(limits.first_byte, "no answer") from None
    except http_client.DNSError:  # asking again does not make a name resolve: not retried here
        raise UpstreamError("dns", f"the channel's host name {error_host(target)} does not resolve",
                            retryable=False) from None
    except outbound.OutboundRefused as refusal:  # the address is not one the panel may call: asking again won't help
        raise UpstreamError("refused", f"the channel's address is refused: {refusal}", retryable=False) from None
    except ValueError as error:  # a line break in the channel's key or URL: nothing was sent
        raise UpstreamError("misconfigured", f"the request cannot be sent: {error}", retryable=False) from None
    except TRANSPORT_ERRORS as error:
        raise UpstreamError("connection", f"cannot reach the channel ({type(error).__name__})") from None


def error_host(target):
    return urlsplit(target.base_url).hostname or target.base_url


async def refusal(target, response):
    try:
        async with asyncio.timeout(target.idle_timeout):
            body = await response.read(settings.GATEWAY_MAX_EVENT_BYTES)
    except http_client.BodyTooLarge:
        response.close()
        raise too_large(f"an error answer ({response.status})", settings.GATEWAY_MAX_EVENT_BYTES) from None
    except (TimeoutError, *TRANSPORT_ERRORS):
        body = b""
    response.close()
    return error_from_response(response.status, body, response.headers, secret=target.api_key)


async def post_json(target, path, payload, limits, api="chat", extra_headers=()):
    """A non-streamed answer. A chat or completions request is asked for as a stream and assembled
    (panel/gateway/assemble.py), so that the first-byte budget runs to the first token and the idle budget between
    tokens, as for a stream: an engine sends a non-streamed answer's headers only when the whole answer is ready, so
    a long answer would read as a hang. A channel that answers the stream request with one JSON body anyway is read
    as before; other calls (Messages, embeddings, responses, token counts) are plain. Returns the parsed body."""
    began = asyncio.get_running_loop().time()
    assembled = api == "chat" and path.endswith(("/chat/completions", "/completions"))
    response = await send_request(target, path, as_stream(payload) if assembled else payload, limits, api,
                                  extra_headers)
    if response.status != 200:
        raise await refusal(target, response)
    if not assembled or "text/event-stream" not in response.headers.get("content-type", ""):
        return await whole_body(target, response)
    opened = await first_event(target, response, limits, began)
    assembly = Assembly()
    finished = False
    size, limit = 0, settings.GATEWAY_MAX_ANSWER_BYTES
    try:
        async for line in chain_lines(opened):
            size += len(line)
            if size > limit:
                raise too_large("an answer", limit)
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            event = parse_event(data)
            if event is None:
                raise UpstreamError("malformed", "the channel's stream has an event that is not JSON")
            if "error" in event:
                raise UpstreamError("error_event", "the channel sent an error event mid-answer")
            assembly.add(event)
        if not finished:
            raise UpstreamError("cut", "the channel's stream ended without [DONE]")
        async for _ in opened.lines:  # to the end, so the connection goes back to the pool
            pass
    except TimeoutError:
        response.close()
        raise UpstreamError("stalled", "the answer ran past the channel's total time") from None
    except TRANSPORT_ERRORS as error:
        response.close()
        raise UpstreamError("cut", f"the channel's stream broke ({type(error).__name__})") from None
    except UpstreamError:
        response.close()
        raise
    response.release()
    return assembly.answer(chat=path.endswith("/chat/completions"))


def as_stream(payload):
    payload = dict(payload, stream=True)
    payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    return payload


async def chain_lines(opened):
    for line in opened.first:
        yield line
    async for line in opened.lines:
        yield line


async def whole_body(target, response):
    try:
        async with asyncio.timeout(target.idle_timeout):
            body = await response.read(settings.GATEWAY_MAX_ANSWER_BYTES)
    except http_client.BodyTooLarge:
        raise too_large("an answer", settings.GATEWAY_MAX_ANSWER_BYTES) from None
    except TimeoutError:
        response.close()
        raise stalled(target.idle_timeout, "no more of the answer's body") from None
    except TRANSPORT_ERRORS as error:
        response.close()
        raise UpstreamError("cut", f"the channel's answer broke off ({type(error).__name__})") from None
    response.release()
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


class StreamLines:
    """A stream's lines (without their line ends), read by network block, not by line, under the response's one idle
    watchdog (http_client.Response.watch_idle): an event and its blank line usually arrive together, and a block
    costs a wake-up, a split and the lines' decoding. UpstreamError("stalled") when nothing comes within `idle`
    seconds, "upstream_too_large" for a line (one event's data) past TOKENWISE_GATEWAY_MAX_EVENT_BYTES.

    Read with `async for`, or with push(): the relay's way, each line handed over from the connection's read
    callback."""

    def __init__(self, response, idle):
        self.response, self.idle = response, idle
        self.ready = collections.deque()  # lines split off a block and not yet taken
        self.pending = b""  # the start of a line whose end has not come
        self.ended = False
        self.limit = settings.GATEWAY_MAX_EVENT_BYTES
        response.content.watch_idle(idle)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self.ready:
            if self.ended:
                raise StopAsyncIteration
            try:
                block = await self.response.content.readany()
            except http_client.IdleTimeout:
                raise stalled(self.idle, "no next chunk") from None
            self.split(block)
        return self.ready.popleft()

    def split(self, block):
        """Add `block` (b"" at the body's end) to the lines ready."""
        if not block:
            self.ended = True
            if self.pending:
                self.ready.append(self.pending.decode("utf-8", "replace").rstrip("\r"))
                self.pending = b""
            return
        pending = self.pending + block
        if b"\n" in block:
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                if len(raw) > self.limit:
                    raise too_large("a stream event", self.limit)
                self.ready.append(raw.decode("utf-8", "replace").rstrip("\r"))
        if len(pending) > self.limit:  # a line without its end past the cap: nothing of it is kept
            raise too_large("a stream event", self.limit)
        self.pending = pending

    async def push(self, take, whole=None):
        """take(line) for every line from here on, while it returns True; returns once it returned False, or at
        the stream's end (its last line, if unended, included), or raises the stream's failure. The lines are handed
        over from the connection's read callback as their block arrives (http_client.Response.push), so a chunk
        costs no task switch; a compressed body is read by `async for` instead. `whole(block)`, where given, is
        offered a block of whole lines first (one that begins where the last ended and ends with an event's blank
        line): it returns None to have it split into lines after all, else True or False as take does. Neither
        may raise."""
        ready = self.ready
        while ready:
            if not take(ready.popleft()):
                return
        if not self.response.pushable():
            async for line in self:
                if not take(line):
                    return
            return
        failure = None

        def block_in(block):
            nonlocal failure
            if whole is not None and not self.pending and block.endswith(b"\n\n") and len(block) <= self.limit:
                taken = whole(block)
                if taken is not None:
                    return taken
            try:
                self.split(block)
            except UpstreamError as error:
                failure = error
                return False
            while ready:
                if not take(ready.popleft()):
                    return False
            return True

        try:
            await self.response.push(block_in)
        except http_client.IdleTimeout:
            raise stalled(self.idle, "no next chunk") from None
        if failure is not None:
            raise failure
        if self.response.at_eof() and not self.ended:
            self.split(b"")
            while ready:
                if not take(ready.popleft()):
                    return


async def open_stream(target, path, payload, limits, api="chat", extra_headers=()):
    """POST a streaming request and read up to its first event, all within `limits.first_byte` seconds."""
    began = asyncio.get_running_loop().time()
    response = await send_request(target, path, payload, limits, api, extra_headers)
    if response.status != 200:
        raise await refusal(target, response)
    return await first_event(target, response, limits, began)


async def first_event(target, response, limits, began):
    """Read a 200 stream up to its first event, within what is left of `limits.first_byte` since `began`."""
    loop = asyncio.get_running_loop()
    lines = StreamLines(response, target.idle_timeout)
    first = []
    try:
        async with asyncio.timeout(max(limits.first_byte - (loop.time() - began), 0.001)):
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
    except TimeoutError:
        response.close()
        raise stalled(limits.first_byte, "no first token") from None
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
