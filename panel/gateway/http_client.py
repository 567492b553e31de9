"""The gateway's HTTP/1.1 client for its upstream calls: one POST, its response read as it arrives, the connection
kept for the next request. Not aiohttp's client: on a Zen 4 EPYC, aiohttp's request and response handling took
0.3 ms of the gateway thread's CPU per request, most of what the gateway added to a client's time to first token
(decision 0077, docs/benchmarks.md). What it does:

- HTTP/1.1 over TCP or TLS (the system's CA store); a response framed by its length, chunked, or read to the
  connection's close (httptools parses it); a gzip or deflate body decoded, though none is asked for, as its reader
  takes it (INFLATE_STEP at a time: a small compressed body that decodes to gigabytes never sits in memory whole),
  and `read(limit)` stops past a size (`BodyTooLarge`);
- connections kept per event loop, outbound policy, scheme, host and port, and reused only after a complete
  response that did not ask to close; a kept connection is closed once idle for KEEP_IDLE_SECONDS (or a second
  before the server's own Keep-Alive timeout, where it states one), and at most KEEP_PER_ORIGIN are kept (the oldest
  closed); a kept connection lost within RESEND_WITHIN_SECONDS of sending, before any
  byte of its response, is tried once more on a new one (the server closed it while it was idle: its close crossed
  the request, which it never read); lost later, the server may have read the request and worked on it, and a
  second copy could be charged twice: that is an error for the caller (the route's fallback decides);
- every address connected to has passed the outbound policy (panel/core/outbound.py): a name is resolved (cached
  for a minute) and every address it resolves to is checked; an address written in the URL is checked as written;
- no redirect is followed, no cookie kept, no proxy used;
- deadlines: the connection (`ConnectTimeout`) and the whole exchange (`total`: a read past it raises TimeoutError);
  the caller bounds the wait for the response's headers."""
import asyncio
import ipaddress
import re
import socket
import ssl
import time
import zlib
from urllib.parse import urlsplit

import httptools

from panel.core import outbound

DNS_CACHE_SECONDS = 60
KEEP_IDLE_SECONDS = 30  # a kept connection idle longer than this is closed
KEEP_PER_ORIGIN = 32  # idle connections kept per origin (after a burst): past it the oldest is closed
RESEND_WITHIN_SECONDS = 0.25  # a kept connection's close this soon after sending crossed the request on the wire
PAUSE_AT_BYTES = 256 * 1024  # a response read ahead of its consumer by this much stops reading from the socket
INFLATE_STEP = 64 * 1024  # the most decoded bytes of a compressed body one readany() makes

_idle = {}  # event loop -> {(loopback_ok, scheme, host, port): [Connection]}
_names = {}  # (host, port) -> (expires, addresses)
_tls = None


class DNSError(ConnectionError):
    """The host name does not resolve."""


class ConnectTimeout(ConnectionError):
    """No connection within the connect deadline."""


class BodyTooLarge(Exception):
    """A body past the size its reader accepts; the connection is closed and nothing of the body is kept."""


class IdleTimeout(Exception):
    """readany() waited longer than the response's idle limit (`watch_idle`) with no byte of the body coming."""


class Disconnected(ConnectionError):
    """The upstream closed the connection, or sent what is not an HTTP response, before the response was whole.
    `received`: whether any byte of the response had come."""

    received = False


def _tls_context():
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()
    return _tls


def _clean(text, what):
    if "\r" in text or "\n" in text:
        raise ValueError(f"a line break in the request's {what}")
    return text


class Response:
    """One response: `status` and `headers` (lower-case names) once its head is in; the body through `content`
    (`readany()`, `at_eof()`, aiohttp's words) or `read()`; then `release()` (the connection may serve the next
    request) or `close()`."""

    def __init__(self, connection, total):
        loop = asyncio.get_running_loop()
        self.connection, self.content = connection, self
        self.status, self.headers, self.complete, self.keep_alive = None, {}, False, False
        self.received = False  # any byte of it
        self.parser = httptools.HttpResponseParser(self)
        self.head = loop.create_future()
        self._blocks, self._size, self._waiter, self._ended, self._error = [], 0, None, False, None
        self._decoder, self._paused, self._flushed = None, False, False
        self._sink, self._held = None, False  # push(): where the body's blocks go; hold(): the reader is backed up
        self._timer = None if total is None else loop.call_later(total, self._expire)
        self._loop, self._idle, self._idle_timer, self._last_byte, self._wait_began = loop, None, None, 0.0, 0.0

    # ------------------------------------------------------------------ httptools' callbacks
    def on_header(self, name, value):
        name = name.decode("latin-1").lower()
        value = value.decode("latin-1")
        self.headers[name] = f"{self.headers[name]}, {value}" if name in self.headers else value

    def on_headers_complete(self):
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # read here: the parser forgets it once the body is in
        self._decoder = outbound.body_decoder(self.headers.get("content-encoding"))
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body):
        if self._sink is not None:
            if not self._sink(bytes(body)):
                self._sink = None
                self._wake()
            return
        # Kept as it came (still compressed, if it is): readany() decodes it a step at a time.
        self._blocks.append(bytes(body))
        self._size += len(body)
        if self._size > PAUSE_AT_BYTES and not self._paused:
            self._paused = True
            self.connection.transport.pause_reading()
        self._wake()

    def on_message_complete(self):
        self.complete = True
        self._end()

    # ------------------------------------------------------------------ from the connection
    def fed(self, data):
        self.received = True
        if self._idle is not None:
            self._last_byte = self._loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(Disconnected(f"the upstream's answer is not HTTP ({error})"))
            self.connection.transport.close()

    def lost(self):
        if self.complete:
            return
        framed = "content-length" in self.headers or "chunked" in self.headers.get("transfer-encoding", "")
        if self.status is not None and not framed:
            self.complete = True  # a body that runs to the connection's close
            self._end()
        else:
            self._fail(Disconnected("the upstream closed the connection"))

    # ------------------------------------------------------------------ the body, for the caller
    async def readany(self):
        """The body's next bytes (decoded), b"" at its end."""
        while True:
            while not self._blocks and not self._undecoded():
                if self._error is not None:
                    raise self._error
                if self._ended:
                    return self._last()
                self._waiter = self._loop.create_future()
                if self._idle is not None:
                    self._wait_began = self._loop.time()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            data = self._blocks[0] if len(self._blocks) == 1 else b"".join(self._blocks)
            self._blocks.clear()
            self._size = 0
            if self._decoder is not None:
                data = self._inflate(data)
            if self._paused and len(self._undecoded()) <= PAUSE_AT_BYTES:
                self._paused = False
                self.connection.transport.resume_reading()
            if data:
                return data

    def pushable(self):
        """Whether push() can deliver the body: it is sent as it is, not compressed."""
        return self._decoder is None

    async def push(self, sink):
        """Hand each block of the body to `sink(block)` as it arrives, from the connection's read callback: no task
        wakes for a block, which at a decode's pace was a third of what relaying a chunk cost (docs/benchmarks.md).
        Returns once `sink` returns False (what comes after is kept for readany(), as before), at the body's end, or
        raises its failure (a deadline, IdleTimeout, a lost connection). `sink` must not raise. Only for a body that
        is not compressed (pushable()): readany() decodes a compressed one a step at a time."""
        assert self.pushable() and self._sink is None
        blocks, self._blocks, self._size = self._blocks, [], 0
        if self._paused:
            self._paused = False
            self.connection.transport.resume_reading()
        for index, block in enumerate(blocks):
            if not sink(block):
                self._blocks[:0] = blocks[index + 1:]
                return
        self._sink = sink
        try:
            while self._sink is not None:
                if self._error is not None:
                    raise self._error
                if self._ended:
                    return
                self._waiter = self._loop.create_future()
                self._wait_began = self._loop.time()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            self._sink = None

    def hold(self):
        """The body's reader cannot take more for now (push()'s client is slow): stop reading from the socket; the
        upstream's silence meanwhile is not its idleness."""
        if not self._held:
            self._held = True
            self.connection.transport.pause_reading()

    def unhold(self):
        if self._held:
            self._held = False
            self._wait_began = self._loop.time()
            if not self._paused:
                self.connection.transport.resume_reading()

    def watch_idle(self, seconds):
        """From now on readany() raises IdleTimeout once it has waited `seconds` with no byte of the body coming.
        One timer for the whole body, moved on only when it fires (a stream's chunks come far more often than its
        idle limit), not a deadline entered and left for each read: at a decode's pace that was a good part of what
        relaying a chunk cost."""
        self._idle = seconds
        self._last_byte = self._loop.time()
        self._idle_timer = self._loop.call_at(self._last_byte + seconds, self._idle_check)

    def at_eof(self):
        return self._ended and not self._blocks and not self._undecoded() and (
            self._decoder is None or self._flushed)

    def buffered(self):
        """Whether readany() returns at once (a block is in, or the body's end or failure is known)."""
        return bool(self._blocks) or bool(self._undecoded()) or self._ended or self._error is not None

    async def read(self, limit=None):
        """The whole body; BodyTooLarge (the connection closed) once it passes `limit` bytes, decoded."""
        parts, size = [], 0
        while block := await self.readany():
            size += len(block)
            if limit is not None and size > limit:
                self.close()
                raise BodyTooLarge(f"a body larger than {limit} bytes")
            parts.append(block)
        return b"".join(parts)

    def release(self):
        """Done with it: a whole response on a connection that may stay open keeps the connection for the next
        request; anything else closes it."""
        self._stop_timer()
        idle_limit = kept_idle_limit(self.headers)
        if self.complete and self.keep_alive and not self.connection.closed and idle_limit > 0:
            self.connection.keep(idle_limit)
        else:
            self.connection.close()

    def close(self):
        self._stop_timer()
        self.connection.close()

    # ------------------------------------------------------------------ inside
    def _wake(self):
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _undecoded(self):
        return self._decoder.unconsumed_tail if self._decoder is not None else b""

    def _inflate(self, data):
        """At most INFLATE_STEP decoded bytes of what is left undecoded and `data`; the rest stays undecoded."""
        source = self._decoder.unconsumed_tail + data if self._decoder.unconsumed_tail else data
        try:
            return self._decoder.decompress(source, INFLATE_STEP)
        except zlib.error:
            self.close()
            raise Disconnected("the upstream's compressed answer does not decode") from None

    def _last(self):
        """What the decoder still holds once every byte of the body went through it (a few bytes at most)."""
        if self._decoder is None or self._flushed:
            return b""
        self._flushed = True
        return self._decoder.flush()

    def _end(self):
        self._ended = True
        self._stop_timer()
        self._wake()

    def _fail(self, error):
        if self._error is None and not self.complete:
            self._error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a head nobody waits for any more is no "never retrieved" warning
        self._wake()

    def _expire(self):
        self._timer = None
        self._fail(TimeoutError())
        self.connection.close()

    def _idle_check(self):
        self._idle_timer = None
        if self._ended or self._error is not None:
            return
        now = self._loop.time()
        if self._waiter is None or self._held:  # the reader is busy with what it has, or held us: not its silence
            due = now + self._idle
        else:
            due = max(self._last_byte, self._wait_began) + self._idle
            if due <= now:
                self._fail(IdleTimeout())
                return
        self._idle_timer = self._loop.call_at(due, self._idle_check)

    def _stop_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None


def kept_idle_limit(headers):
    """How long a connection may wait idle for the next request: KEEP_IDLE_SECONDS, or a second less than the
    server says it waits (`Keep-Alive: timeout=N`), so the server's close never crosses a request."""
    stated = re.search(r"timeout\s*=\s*(\d+)", headers.get("keep-alive", ""))
    if stated is None:
        return KEEP_IDLE_SECONDS
    seconds = int(stated.group(1))
    return min(KEEP_IDLE_SECONDS, max(seconds - 1, seconds / 2))


class Connection(asyncio.Protocol):
    def __init__(self, pool_key):
        self.pool_key, self.transport, self.response = pool_key, None, None
        self.closed, self.idle_since, self.idle_limit, self.idle_timer = False, 0.0, KEEP_IDLE_SECONDS, None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.response is None:  # bytes nobody asked for on an idle connection: it is not reused
            self.close()
            return
        self.response.fed(data)

    def connection_lost(self, exc):
        self.closed = True
        if self.response is not None:
            self.response.lost()

    def keep(self, idle_limit):
        """Keep it for the next request to its origin, closed if none comes within `idle_limit` seconds."""
        self.response = None
        self.idle_since, self.idle_limit = time.monotonic(), idle_limit
        loop = asyncio.get_running_loop()
        for other in [other for other in _idle if other.is_closed()]:  # a finished asyncio.run's connections
            del _idle[other]
        kept = _idle.setdefault(loop, {}).setdefault(self.pool_key, [])
        if len(kept) >= KEEP_PER_ORIGIN:  # after a burst: drop those the server has closed since, then the oldest
            kept[:] = [connection for connection in kept if not connection.closed]
            while len(kept) >= KEEP_PER_ORIGIN:
                kept.pop(0).close()
        kept.append(self)
        self.idle_timer = loop.call_later(idle_limit, self.idle_too_long, kept)

    def taken(self):
        """Out of the kept ones, for a request."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def idle_too_long(self, kept):
        self.idle_timer = None
        if self in kept:
            kept.remove(self)
        self.close()

    def close(self):
        self.closed = True
        self.taken()
        if self.transport is not None:
            self.transport.close()


async def post(url, body, headers, *, loopback_ok=False, connect_timeout=None, total=None):
    """POST `body` (bytes) to `url` with `headers` (a dict) and return its Response once the head is in. Raises
    outbound.OutboundRefused, DNSError, ConnectTimeout, another ConnectionError or OSError, or ValueError for a
    header or URL that cannot be sent."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url[:100]}")
    tls = parts.scheme == "https"
    host, port = parts.hostname, parts.port or (443 if tls else 80)
    target = _clean((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), "path")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    lines = [f"POST {target} HTTP/1.1", f"host: {_clean(netloc, 'host')}", f"content-length: {len(body)}"]
    lines += [f"{_clean(str(name), 'headers')}: {_clean(str(value), 'headers')}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    pool_key = (loopback_ok, parts.scheme, host, port)
    connection = _kept(pool_key)
    if connection is not None:
        sent = time.monotonic()
        try:
            return await _exchange(connection, request, total)
        except Disconnected as error:
            if error.received or time.monotonic() - sent > RESEND_WITHIN_SECONDS:
                raise
            # closed by the server while it was idle, as the request left: it read nothing of it
    return await _exchange(await _connect(pool_key, tls, loopback_ok, connect_timeout), request, total)


async def _exchange(connection, request, total):
    """Send the request on `connection` and wait for the response's head. Any failure or cancellation (the
    caller's deadline, a client that left) closes the connection: its response may still come."""
    connection.response = response = Response(connection, total)
    connection.transport.write(request)
    try:
        await response.head
    except Disconnected as error:
        error.received = response.received
        response.close()
        raise
    except BaseException:
        response.close()
        raise
    return response


def _kept(pool_key):
    kept = _idle.get(asyncio.get_running_loop(), {}).get(pool_key)
    now = time.monotonic()
    while kept:
        connection = kept.pop()
        connection.taken()
        if not connection.closed and now - connection.idle_since < connection.idle_limit:
            return connection
        connection.close()
    return None


async def _connect(pool_key, tls, loopback_ok, connect_timeout):
    _, _, host, port = pool_key
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(connect_timeout):
            last = None
            for address in await _addresses(host, port, loopback_ok):
                try:
                    _, connection = await loop.create_connection(
                        lambda: Connection(pool_key), address, port, ssl=_tls_context() if tls else None,
                        server_hostname=host if tls else None)
                    return connection
                except OSError as error:
                    last = error
            raise last or DNSError(f"{host} has no address")
    except TimeoutError:
        raise ConnectTimeout(f"no connection to {host}:{port} within {connect_timeout:g} s") from None


async def _addresses(host, port, loopback_ok):
    """The addresses to connect to, each allowed by the outbound policy; OutboundRefused when any is not."""
    literal = host.strip("[]")
    try:
        ipaddress.ip_address(literal.split("%", 1)[0])
    except ValueError:
        pass
    else:
        refusal = outbound.address_refusal(literal, loopback_ok=loopback_ok)
        if refusal:
            raise outbound.OutboundRefused(refusal)
        return [literal]
    cached = _names.get((host, port))
    if cached is not None and cached[0] > time.monotonic():
        addresses = cached[1]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise DNSError(f"{host} does not resolve") from None
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        _names[(host, port)] = (time.monotonic() + DNS_CACHE_SECONDS, addresses)
    refusal = outbound.resolved_refusal(host, addresses, loopback_ok=loopback_ok)
    if refusal:
        raise outbound.OutboundRefused(refusal)
    return addresses


async def close_kept():
    """Close this event loop's kept connections: for a caller that runs requests in a loop of its own and is done
    with it."""
    for kept in _idle.pop(asyncio.get_running_loop(), {}).values():
        for connection in kept:
            connection.close()
