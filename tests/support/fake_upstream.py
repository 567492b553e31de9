"""A fake OpenAI-compatible cloud provider for the gateway's tests and benchmarks: fast, and misbehaving on demand.

No cloud is reachable from the test machines, so this stands in for one. It speaks just enough HTTP/1.1 on raw asyncio
streams (keep-alive, Content-Length or chunked request bodies, chunked SSE responses) to be cheap next to the gateway
it is measured against, and to misbehave at the byte level: stall before or after the headers, cut a stream, reset
the connection, drip bytes. It binds 127.0.0.1 only.

In a test::

    with FakeUpstream(api_key="sk-test") as fake:
        fake.behave("status_503", times=2)     # the next two inference requests fail, then back to normal
        ...                                    # send requests through the gateway to fake.base_url
        assert len(fake.requests) == 3

As a process (benchmarks)::

    python -m tests.support.fake_upstream --port 8901 --chunks 20     # prints "fake upstream listening on <base_url>"

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (streaming or not). The content is
`chunks` deterministic words (`content_text`), one per stream chunk; prompt_tokens counts the words of the prompt
(`prompt_tokens`). Behaviours are listed in `FakeUpstream.behave`.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import logging
import re
import signal
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

try:
    import uvloop
except ImportError:  # the fake works on the stock loop too, only slower
    uvloop = None

HOST = "127.0.0.1"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
INFERENCE_PATHS = (CHAT_PATH, COMPLETIONS_PATH)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")

logger = logging.getLogger(__name__)

_ROUTES = {MODELS_PATH: "GET", CHAT_PATH: "POST", COMPLETIONS_PATH: "POST"}
_MAX_HEAD = 64 * 1024
_MAX_BODY = 32 * 1024 * 1024
_READ_SIZE = 64 * 1024
_DONE = b"data: [DONE]\n\n"
_MALFORMED_EVENT = b"data: {not json\n\n"
_MALFORMED_BODY = b'{"id": "fake-broken", "object": "chat.completion", "choices": [{"index": 0, "message": '
_quote = json.encoder.encode_basestring_ascii  # json.dumps(str) without its per-call overhead
_STATUS_NAME = re.compile(r"status_([45]\d\d)")
_STATUS_ERRORS = {  # what OpenAI answers with these codes: (message, type, code)
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}
_OPTIONS = {
    "ok": {},
    "refuse": {},
    "hang_before_headers": {"delay": None},
    "hang_after_headers": {"delay": None},
    "cut_stream": {"after": 3},
    "error_event": {"after": 0, "message": "The server had an error while processing your request.",
                    "type": "server_error"},
    "malformed_json": {"after": 0},
    "slow_drip": {"delay": 0.05},
    "json_content": {"value": None},
    "broken_json_content": {"text": '{"answer": "alpha bravo", "done": tru'},
    "redirect": {"location": None, "status": 307},
    "gzip_bomb": {"size": 200 * 1024 * 1024, "sse": None, "status": 200},
    "endless_event": {"after": 1, "size": 64 * 1024 * 1024},
}
_STATUS_OPTIONS = {"retry_after": None, "message": None}
_COMMON_OPTIONS = {"path": INFERENCE_PATHS, "chunks": None, "cached_tokens": None}


def closed_port():
    """A port on 127.0.0.1 that nothing listens on, so connecting to it is refused (ECONNREFUSED)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def content_text(chunks):
    """The content a normal completion of `chunks` chunks carries: that many words of `WORDS`, space-separated."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(chunks))


def prompt_tokens(body):
    """The prompt_tokens the fake reports for a request body: the whitespace-separated words of the messages'
    text (chat) or of the prompt (completions); a token-id prompt counts its ids."""
    texts, ids = [], 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    prompt = body.get("prompt")
    for item in prompt if isinstance(prompt, list) else [prompt]:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int):
            ids += 1
        elif isinstance(item, list):
            ids += len(item)
    return ids + sum(len(text.split()) for text in texts)


@dataclass(frozen=True)
class Behaviour:
    """One way of answering a request: a behaviour name and its options, defaults filled in (see `behave`)."""

    name: str
    options: dict

    @classmethod
    def make(cls, name, **options):
        """Validate `name` and `options` now, in the caller's thread, rather than fail later inside the server."""
        status = _STATUS_NAME.fullmatch(name)
        if status:
            defaults = dict(_STATUS_OPTIONS, retry_after=1 if status.group(1) == "429" else None)
        elif name in _OPTIONS:
            defaults = dict(_OPTIONS[name])
        else:
            raise ValueError(f"unknown behaviour {name!r}; known: {sorted(_OPTIONS)} and status_4xx/status_5xx")
        defaults.update(_COMMON_OPTIONS)
        unknown = set(options) - set(defaults)
        if unknown:
            raise TypeError(f"behaviour {name!r} takes no option(s) {sorted(unknown)}; it takes {sorted(defaults)}")
        merged = {**defaults, **options}
        merged["path"] = (merged["path"],) if isinstance(merged["path"], str) else tuple(merged["path"])
        if name == "gzip_bomb":
            # Packed now, in the caller's thread: packing 200 MiB takes seconds on a busy host, and inside the server
            # they would count against the gateway's deadline for the first byte.
            for sse in (True, False) if merged["sse"] is None else (merged["sse"],):
                _bomb(merged["size"], sse)
        return cls(name, merged)

    @property
    def status(self):
        """The HTTP status of a `status_NNN` behaviour, else None."""
        match = _STATUS_NAME.fullmatch(self.name)
        return int(match.group(1)) if match else None

    def applies_to(self, path):
        return path in self.options["path"]


_OK = Behaviour.make("ok")


@dataclass
class RecordedRequest:
    """A request as it reached the fake. `headers` has lower-case names; `json` is the parsed body (None if absent
    or not JSON); `time` is time.time() on arrival; `behaviour` is the name it was answered with (None when it was
    rejected first: auth, route, body, model); `disconnected` is set if the client went away before the answer ended."""

    method: str
    path: str
    query: str
    headers: dict
    body: bytes
    json: Any
    time: float
    behaviour: str | None = None
    disconnected: bool = False


@dataclass
class _Reply:
    status: int = 200
    body: bytes = b""
    events: list | None = None  # SSE data payloads (bytes); the reply is a stream when not None
    headers: tuple = ()
    chunk_count: int = 1
    paced_frames: int | None = None  # frames after the first that wait the chunk delay (None: every one)
    named: bool = False  # events carry their `type` on an `event:` line and no [DONE] ends them (Anthropic, Responses)


class _PeerClosed(Exception):
    """The client closed its end of the connection."""


class _BadRequest(Exception):
    """The bytes received are not an HTTP request the fake can parse."""


class _Connection:
    """One client connection: a read buffer of our own (so a watcher can read while a response is being written
    without losing bytes of a pipelined next request) and writes that report a vanished client as _PeerClosed."""

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self._watcher = None

    async def _fill(self):
        try:
            data = await self.reader.read(_READ_SIZE)
        except ConnectionError:
            data = b""
        if not data:
            raise _PeerClosed
        self.buffer += data

    async def read_head(self):
        """The request head without its blank line, or None when the client closed the idle connection."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise _BadRequest("request head too large")
            try:
                await self._fill()
            except _PeerClosed:
                if self.buffer:
                    raise
                return None
        head = bytes(self.buffer[:end])
        del self.buffer[:end + 4]
        return head

    async def read_exact(self, size):
        while len(self.buffer) < size:
            await self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def read_line(self):
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise _BadRequest("chunk header too large")
            await self._fill()
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 2]
        return line

    async def read_chunked(self):
        body = bytearray()
        while True:
            try:
                size = int((await self.read_line()).split(b";")[0], 16)
            except ValueError:
                raise _BadRequest("bad chunk size") from None
            if size == 0:
                while await self.read_line():  # trailers, up to the blank line
                    pass
                return bytes(body)
            if len(body) + size > _MAX_BODY:
                raise _BadRequest("body too large")
            body += await self.read_exact(size)
            await self.read_exact(2)

    async def _watch(self):
        while True:
            try:
                await self._fill()
            except _PeerClosed:
                return

    async def wait(self, seconds):
        """Sleep `seconds` (None: until the server stops), raising _PeerClosed as soon as the client goes away."""
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())
        try:
            await asyncio.wait_for(asyncio.shield(self._watcher), seconds)
        except asyncio.TimeoutError:
            return
        raise _PeerClosed

    async def stop_watching(self):
        if self._watcher is not None:
            self._watcher.cancel()
            # The StreamReader only forgets the watcher's pending read once that task has run; reading before
            # then raises "read() called while another coroutine is already waiting".
            await asyncio.wait([self._watcher])
            self._watcher = None

    async def send(self, data):
        if self.writer.transport.is_closing() or (self._watcher is not None and self._watcher.done()):
            raise _PeerClosed
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError:
            raise _PeerClosed from None

    def close(self):
        """Close after flushing what was written: a FIN, no terminating chunk."""
        self.writer.close()

    def reset(self):
        """Drop the connection with a TCP RST."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


async def _read_request(conn):
    """The next request on `conn` and whether to keep the connection alive after it; (None, False) at a clean close."""
    head = await conn.read_head()
    if head is None:
        return None, False
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(f"bad request line {lines[0]!r}")
    method, target, version = parts
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise _BadRequest(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await _read_body(conn, headers)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    path, _, query = target.partition("?")
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return RecordedRequest(method, path, query, headers, body, parsed, time.time()), keep_alive


async def _read_body(conn, headers):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await conn.read_chunked()
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise _BadRequest("bad content-length") from None
    if not 0 <= length <= _MAX_BODY:
        raise _BadRequest("bad content-length")
    return await conn.read_exact(length) if length else b""


def _head(status, headers, keep_alive):
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{name}: {value}" for name, value in headers),
             "connection: keep-alive" if keep_alive else "connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _json_head(reply, body, keep_alive):
    return _head(reply.status, (("content-type", "application/json"), ("content-length", len(body)), *reply.headers),
                 keep_alive)


async def _send_whole(conn, reply, keep_alive):
    await conn.send(_json_head(reply, reply.body, keep_alive) + reply.body)


def _chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def _split(text, count):
    """`text` in at most `count` consecutive, nearly equal, non-empty pieces."""
    size = max(1, -(-len(text) // max(1, count)))
    return [text[start:start + size] for start in range(0, len(text), size)]


def _error_body(message, type_, code=None, param=None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error_reply(status, message, type_="invalid_request_error", code=None, param=None, headers=()):
    return _Reply(status, json.dumps(_error_body(message, type_, code, param)).encode(), headers=headers)


def _status_reply(behaviour):
    status, options = behaviour.status, behaviour.options
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    message, type_, code = _STATUS_ERRORS.get(status, (HTTPStatus(status).phrase, default_type, None))
    headers = () if options["retry_after"] is None else (("retry-after", options["retry_after"]),)
    return _error_reply(status, options["message"] or message, type_, code, headers=headers)


def _content_pieces(behaviour, chunks, max_tokens):
    """The content, one piece per chunk, and the finish_reason."""
    if behaviour.name == "json_content":
        value = behaviour.options["value"]
        return _split(json.dumps({"answer": content_text(chunks)} if value is None else value), chunks), "stop"
    if behaviour.name == "broken_json_content":
        return _split(behaviour.options["text"], chunks), "stop"
    count = chunks if not max_tokens else min(chunks, max_tokens)
    return [(" " if i else "") + WORDS[i % len(WORDS)] for i in range(count)], "length" if count < chunks else "stop"


def _max_tokens(body):
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _usage(prompt, completion, cached, reasoning=None):
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    if reasoning is not None:  # as OpenAI's reasoning models report it
        usage["completion_tokens_details"] = {"reasoning_tokens": min(reasoning, completion)}
    return usage


def _events(ident, object_, model, choices, usage):
    """Stream events, one per choice (JSON text), then the usage event when `usage` was asked for."""
    # Templates rather than json.dumps per event: this is the hot path of the benchmark baseline.
    head = f'{{"id":"{ident}","object":"{object_}","created":{int(time.time())},"model":{_quote(model)},'
    tail = ',"usage":null}' if usage else "}"
    events = [f'{head}"choices":[{choice}]{tail}' for choice in choices]
    if usage:
        events.append(f'{head}"choices":[],"usage":{json.dumps(usage)}}}')
    return [event.encode() for event in events]


def _chat_events(ident, model, pieces, finish, usage):
    choice = '{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}'
    choices = [choice % ('{"role":"assistant","content":""}', "null")]
    choices += [choice % ('{"content":%s}' % _quote(piece), "null") for piece in pieces]
    choices.append(choice % ("{}", _quote(finish)))
    return _events(ident, "chat.completion.chunk", model, choices, usage)


def _completion_events(ident, model, pieces, finish, usage):
    choice = '{"index":0,"text":%s,"logprobs":null,"finish_reason":%s}'
    choices = [choice % (_quote(piece), "null") for piece in pieces]
    choices.append(choice % ('""', _quote(finish)))
    return _events(ident, "text_completion", model, choices, usage)


def _chat_completion(ident, model, text, finish, usage):
    message = {"role": "assistant", "content": text, "refusal": None}
    return {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage, "system_fingerprint": None}


def _text_completion(ident, model, text, finish, usage):
    return {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": usage}


def _stream_frames(events, behaviour, named=False):
    """The SSE frames to send and whether the stream then ends properly (else the socket is just closed). `named`:
    each event also names its type on an `event:` line and no `data: [DONE]` ends the stream, as Anthropic's
    Messages and OpenAI's Responses streams are written (clients such as Claude Code read only named events)."""
    if named:
        frames = [b"event: " + json.loads(event)["type"].encode() + b"\ndata: " + event + b"\n\n" for event in events]
        done = []
    else:
        frames, done = [b"data: " + event + b"\n\n" for event in events], [_DONE]
    name, options = behaviour.name, behaviour.options
    after = options.get("after", 0)
    if name == "cut_stream":
        return frames[:after], False
    if name == "error_event":
        error = json.dumps(_error_body(options["message"], options["type"])).encode()
        return frames[:after] + [(b"event: error\n" if named else b"") + b"data: " + error + b"\n\n", *done], True
    if name == "malformed_json":
        return frames[:after] + [_MALFORMED_EVENT] + frames[after:] + done, True
    return frames + done, True


def _faulty_body(body, behaviour):
    if behaviour.name == "malformed_json":
        return _MALFORMED_BODY
    if behaviour.name == "error_event":  # some providers answer 200 with an error object
        return json.dumps(_error_body(behaviour.options["message"], behaviour.options["type"])).encode()
    return body


async def _deliver_body(conn, reply, behaviour, delay, keep_alive):
    body = _faulty_body(reply.body, behaviour)
    pending = _json_head(reply, body, keep_alive)
    if behaviour.name == "hang_after_headers":
        await conn.send(pending)
        await conn.wait(behaviour.options["delay"])
        pending = b""
    elif delay:  # a non-streaming answer takes as long to generate as the stream would
        await conn.wait(delay * reply.chunk_count)
    if behaviour.name == "cut_stream":
        await conn.send(pending + body[:len(body) // 2])
        conn.close()
        return False
    if behaviour.name == "slow_drip":
        for index, piece in enumerate(_split(body, reply.chunk_count)):
            if index:
                await conn.wait(behaviour.options["delay"])
            await conn.send(pending + piece)
            pending = b""
        return keep_alive
    await conn.send(pending + body)
    return keep_alive


async def _deliver_stream(conn, reply, behaviour, delay, keep_alive):
    pending = _head(reply.status, (("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"),
                                   ("transfer-encoding", "chunked"), *reply.headers), keep_alive)
    if behaviour.name == "hang_after_headers":
        await conn.send(pending)
        await conn.wait(behaviour.options["delay"])
        pending = b""
    frames, complete = _stream_frames(reply.events, behaviour, reply.named)
    if behaviour.name == "slow_drip":
        delay = behaviour.options["delay"]
    ending = b"0\r\n\r\n" if complete else b""
    if delay:
        paced = len(frames) if reply.paced_frames is None else reply.paced_frames
        for index, frame in enumerate(frames):
            if 0 < index <= paced:
                await conn.wait(delay)
            await conn.send(pending + _chunk(frame))
            pending = b""
        await conn.send(pending + ending)
    else:
        await conn.send(pending + b"".join(map(_chunk, frames)) + ending)
    if not complete:
        conn.close()
        return False
    return keep_alive


@functools.lru_cache(maxsize=4)
def _bomb(size, sse):
    """A gzip body that decodes to `size` bytes: a `data:` line or a JSON string, neither ever ended."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(b'data: {"x": "' if sse else b'{"x": "')]
    piece = b"a" * (1 << 20)
    for _ in range(size // len(piece)):
        parts.append(packer.compress(piece))
    parts.append(packer.flush())
    return b"".join(parts)


async def _send_bomb(conn, size, sse, keep_alive, status=200):
    body = _bomb(size, sse)
    kind = "text/event-stream" if sse else "application/json"
    await conn.send(_head(status, (("content-type", kind), ("content-encoding", "gzip"), ("content-length", len(body))),
                          keep_alive) + body)


async def _send_endless_event(conn, events, options):
    frames, _ = _stream_frames(events, _OK)
    await conn.send(_head(200, (("content-type", "text/event-stream"), ("transfer-encoding", "chunked")), False)
                    + b"".join(map(_chunk, frames[:options["after"]])) + _chunk(b'data: {"x": "'))
    piece = b"a" * (64 * 1024)
    for _ in range(options["size"] // len(piece)):
        await conn.send(_chunk(piece))
    conn.close()


class FakeUpstream:
    """A fake OpenAI-compatible provider on 127.0.0.1, served by its own asyncio loop in a background thread.

    Use it as a context manager or with start()/stop(). `models` are the ids it serves; with `api_key` it requires
    `Authorization: Bearer <api_key>`; completions carry `chunks` words, streams wait `chunk_delay` seconds between
    events (and a non-streaming answer waits as long as the whole stream would); usage reports `cached_tokens`
    (at most prompt_tokens). `port` 0 picks a free port; a restarted fake binds the port it had. With `record`
    False requests are counted but not kept (long benchmarks). Behaviours: see `behave`.

    The attributes `models`, `api_key`, `chunks`, `chunk_delay` and `cached_tokens` may be changed while it runs.
    """

    def __init__(self, models=("fake-model",), api_key=None, chunks=20, chunk_delay=0.0, *, cached_tokens=0, port=0,
                 record=True, host=HOST, decode_pace=False):
        self.host = host  # another loopback address (127.0.0.2) stands in for a public one in the policy's tests
        self.models = tuple(models)
        self.api_key = api_key
        self.chunks = chunks
        self.chunk_delay = chunk_delay
        # True: only the content pieces of a stream wait chunk_delay; the finish, usage and [DONE] events follow the
        # last piece at once, as an engine sends them (the benches' pace). False: every event waits (the tests').
        self.decode_pace = decode_pace
        self.cached_tokens = cached_tokens
        self.reasoning_tokens = None  # set: usage reports that many completion tokens as reasoning
        self.port = port
        self.record = record
        self._state = threading.Condition()  # guards everything below that the test thread reads
        self._requests = []
        self._request_count = 0
        self._disconnects = 0
        self._open_connections = 0
        self._total_connections = 0
        self._queue = []
        self._default = _OK
        self._ids = itertools.count(1)
        self._thread = self._loop = self._server = None
        self._handlers = {}  # connection task -> writer; touched by the loop thread only

    def __repr__(self):
        return f"<FakeUpstream {self.base_url if self._thread else 'stopped'} models={self.models}>"

    # --- life cycle -------------------------------------------------------------------------------------------------

    def start(self):
        """Bind and serve in a background thread; returns self once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the fake upstream is already running")
        ready, failure = threading.Event(), []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="fake-upstream", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self):
        """Close the listening socket and every connection (hanging answers included); wait for the thread."""
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = self._loop = self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def _run(self, ready, failure):
        loop = uvloop.new_event_loop() if uvloop else asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve_connection, self.host, self.port, backlog=1024))
        except BaseException as error:
            failure.append(error)
            loop.close()
            ready.set()
            return
        self._loop = loop
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self):
        self._server.close()
        for task, writer in list(self._handlers.items()):
            writer.transport.abort()
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    # --- what tests read and set ------------------------------------------------------------------------------------

    @property
    def base_url(self):
        """The OpenAI base URL, http://127.0.0.1:PORT/v1."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self):
        """A snapshot of the RecordedRequests received so far, oldest first."""
        with self._state:
            return list(self._requests)

    @property
    def request_count(self):
        """How many requests arrived (also counted when `record` is off)."""
        with self._state:
            return self._request_count

    @property
    def disconnects(self):
        """How many times a client went away before its answer was complete. The fake notices while it waits (a
        hang, a delay between chunks) or when a write fails; an answer written in one go is over before it could."""
        with self._state:
            return self._disconnects

    @property
    def open_connections(self):
        with self._state:
            return self._open_connections

    @property
    def total_connections(self):
        """Connections accepted so far: fewer than requests when clients keep connections alive."""
        with self._state:
            return self._total_connections

    @property
    def queued(self):
        """The names of the one-shot behaviours not consumed yet."""
        with self._state:
            return [behaviour.name for behaviour in self._queue]

    def behave(self, name, times=None, **options):
        """Answer the next `times` matching requests with behaviour `name`, then go back to the default; with
        `times` None, make `name` the default. One-shot behaviours queue up and are consumed one per request, in
        order. Behaviours apply only after auth, route, body and model checks pass (a 401 consumes nothing).

        Options every behaviour takes: `path` (a path or paths it applies to; default the two inference paths, so
        a gateway polling /v1/models does not consume it), `chunks`, `cached_tokens` (override the server's).

        - ok: a normal answer.
        - refuse: reset the connection (TCP RST) once the request is read; nothing is answered. For a real
          connection refused, point the client at `closed_port()`.
        - status_NNN (any 4xx/5xx, e.g. status_500, status_503, status_429): that status with an OpenAI-style
          error body; options `retry_after` (seconds for a Retry-After header; default 1 for 429, else none),
          `message`.
        - hang_before_headers: read the request, answer nothing for `delay` seconds (None: until the client
          leaves or the server stops), then answer normally.
        - hang_after_headers: send the 200 headers (SSE for a stream), then nothing for `delay` seconds (None:
          forever), then the rest.
        - cut_stream: send `after` events of the stream (default 3; for chat the first event is the role chunk),
          then close the socket with no [DONE] and no terminating chunk; a non-streaming answer is cut half-way.
        - error_event: a 200 stream whose event number `after` (default 0, the first) is
          `{"error": {"message", "type"}}` (options `message`, `type`), then [DONE]; non-streaming: 200 with that
          error object as the body.
        - malformed_json: a `data: {not json` event at position `after` (default 0) amid a normal stream;
          non-streaming: 200, Content-Type application/json, a body that is not JSON.
        - slow_drip: `delay` seconds (default 0.05) between stream events; non-streaming: the body dripped in
          `chunks` pieces with that delay between them.
        - json_content: content that is valid JSON text, json.dumps(`value`) (default {"answer": <the words>}).
        - broken_json_content: a well-formed completion whose content is `text`, JSON that does not parse.
        - redirect: `status` (default 307) with `Location: <location>` and an empty body.
        - gzip_bomb: `status` (default 200) with `Content-Encoding: gzip` and a small body (about 1/1000 of `size`)
          that decodes to `size` bytes (default 200 MiB) of one letter: a stream (an SSE line without its end) when
          the request asked for one or `sse` is True, else a JSON body that never ends.
        - endless_event: a 200 stream of `after` events (default 1), then one `data:` line that runs for `size`
          bytes (default 64 MiB) without its end, then the connection closes.
        """
        behaviour = Behaviour.make(name, **options)
        if times is not None and times < 0:
            raise ValueError("times must be None (make it the default) or a count")
        with self._state:
            if times is None:
                self._default = behaviour
            else:
                self._queue.extend([behaviour] * times)
        return self

    def reset(self):
        """Back to answering `ok`: clear the queue, the default, the recorded requests and the counters."""
        with self._state:
            self._queue.clear()
            self._default = _OK
            self._requests.clear()
            self._request_count = self._disconnects = self._total_connections = 0

    def wait_for_requests(self, count, timeout=5.0):
        """Wait until at least `count` requests arrived; returns the recorded requests."""
        self._wait_until(lambda: self._request_count >= count, timeout, f"{count} request(s)")
        return self.requests

    def wait_for_disconnects(self, count=1, timeout=5.0):
        """Wait until the fake has seen at least `count` client disconnects."""
        self._wait_until(lambda: self._disconnects >= count, timeout, f"{count} disconnect(s)")

    def _wait_until(self, predicate, timeout, what):
        with self._state:
            if not self._state.wait_for(predicate, timeout):
                raise TimeoutError(f"waited {timeout} s for {what}; got {self._request_count} request(s), "
                                   f"{self._disconnects} disconnect(s)")

    def _take_behaviour(self, path):
        with self._state:
            for index, behaviour in enumerate(self._queue):
                if behaviour.applies_to(path):
                    return self._queue.pop(index)
            return self._default if self._default.applies_to(path) else _OK

    def _note(self, **changes):
        with self._state:
            for name, change in changes.items():
                setattr(self, name, getattr(self, name) + change)
            self._state.notify_all()

    def _note_request(self, request):
        with self._state:
            self._request_count += 1
            if self.record:
                self._requests.append(request)
            self._state.notify_all()

    # --- serving (loop thread) --------------------------------------------------------------------------------------

    async def _serve_connection(self, reader, writer):
        self._handlers[asyncio.current_task()] = writer
        self._note(_open_connections=1, _total_connections=1)
        conn = _Connection(reader, writer)
        try:
            while await self._serve_one(conn):
                pass
        except _PeerClosed:
            pass
        except asyncio.CancelledError:
            pass  # stop(); re-raising makes 3.11's start_server callback log the cancellation as an error
        except Exception:
            logger.exception("fake upstream: unexpected error; closing the connection")
        finally:
            self._handlers.pop(asyncio.current_task(), None)
            writer.close()
            self._note(_open_connections=-1)

    async def _serve_one(self, conn):
        """Read and answer one request; False when the connection is finished."""
        try:
            request, keep_alive = await _read_request(conn)
        except _BadRequest as error:
            await _send_whole(conn, _error_reply(400, str(error)), keep_alive=False)
            return False
        if request is None:
            return False
        self._note_request(request)
        try:
            return await self._answer(conn, request, keep_alive)
        except _PeerClosed:
            request.disconnected = True
            self._note(_disconnects=1)
            return False
        finally:
            await conn.stop_watching()

    async def _answer(self, conn, request, keep_alive):
        rejection = self._rejection(request)
        if rejection is not None:
            await _send_whole(conn, rejection, keep_alive)
            return keep_alive
        behaviour = self._take_behaviour(request.path)
        request.behaviour = behaviour.name
        if behaviour.name == "refuse":
            conn.reset()
            return False
        if behaviour.name == "hang_before_headers":
            await conn.wait(behaviour.options["delay"])
        if behaviour.status:
            await _send_whole(conn, _status_reply(behaviour), keep_alive)
            return keep_alive
        if behaviour.name == "gzip_bomb":
            sse = behaviour.options["sse"]
            await _send_bomb(conn, behaviour.options["size"], bool(request.json.get("stream")) if sse is None else sse,
                             keep_alive, behaviour.options["status"])
            return keep_alive
        if behaviour.name == "endless_event":
            await _send_endless_event(conn, self._reply(request, behaviour).events, behaviour.options)
            return False
        if behaviour.name == "redirect":
            options = behaviour.options
            await _send_whole(conn, _Reply(options["status"], headers=(("location", options["location"]),)),
                              keep_alive)
            return keep_alive
        reply = self._reply(request, behaviour)
        if self.decode_pace and reply.events is not None:  # as an engine decodes: the pieces paced, the end at once
            reply.paced_frames = reply.chunk_count
        deliver = _deliver_body if reply.events is None else _deliver_stream
        delay = self.chunk_delay if request.path in INFERENCE_PATHS else 0
        return await deliver(conn, reply, behaviour, delay, keep_alive)

    def _rejection(self, request):
        """The error reply for a request a real provider would reject (auth, route, body, model), else None."""
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error_reply(401, "Incorrect API key provided.", code="invalid_api_key")
        method = _ROUTES.get(request.path)
        if method is None:
            return _error_reply(404, f"Invalid URL ({request.method} {request.path})")
        if request.method != method:
            return _error_reply(405, f"Method {request.method} not allowed for {request.path}")
        if method == "GET":
            return None
        body = request.json
        if not isinstance(body, dict):
            return _error_reply(400, "We could not parse the JSON body of your request.")
        if not body.get("model"):
            return _error_reply(400, "You must provide a model parameter.", param="model")
        if body["model"] not in self.models:
            return _error_reply(404, f"The model `{body['model']}` does not exist or you do not have access to it.",
                                code="model_not_found", param="model")
        if request.path == CHAT_PATH and not isinstance(body.get("messages"), list):
            return _error_reply(400, "'messages' is a required property", param="messages")
        if request.path == COMPLETIONS_PATH and "prompt" not in body:
            return _error_reply(400, "'prompt' is a required property", param="prompt")
        if body.get("stream_options") is not None and not body.get("stream"):
            return _error_reply(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                param="stream_options")
        return None

    def _reply(self, request, behaviour):
        if request.path == MODELS_PATH:
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "fake"} for model in self.models]
            return _Reply(body=json.dumps({"object": "list", "data": data}).encode())
        body, options = request.json, behaviour.options
        chunks = self.chunks if options["chunks"] is None else options["chunks"]
        cached = self.cached_tokens if options["cached_tokens"] is None else options["cached_tokens"]
        pieces, finish = _content_pieces(behaviour, chunks, _max_tokens(body))
        prompt = prompt_tokens(body)
        usage = _usage(prompt, len(pieces), min(cached, prompt), self.reasoning_tokens)
        chat = request.path == CHAT_PATH
        ident = f"{'chatcmpl' if chat else 'cmpl'}-fake{next(self._ids)}"
        headers = (("x-request-id", f"req_{ident}"),)
        if body.get("stream"):
            stream_options = body.get("stream_options")
            wants_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
            events = (_chat_events if chat else _completion_events)(ident, body["model"], pieces, finish,
                                                                    usage if wants_usage else None)
            return _Reply(events=events, headers=headers, chunk_count=max(1, len(pieces)))
        document = (_chat_completion if chat else _text_completion)(ident, body["model"], "".join(pieces), finish,
                                                                    usage)
        return _Reply(body=json.dumps(document).encode(), headers=headers, chunk_count=max(1, len(pieces)))


def main(argv=None):
    """Serve a FakeUpstream until SIGTERM or Ctrl-C; prints one line with the base URL once it listens."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one, printed)")
    parser.add_argument("--chunks", type=int, default=20, help="words per completion")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    parser.add_argument("--model", action="append", help="a model id to serve (repeatable; default fake-model)")
    parser.add_argument("--api-key", help="require Authorization: Bearer <key>")
    parser.add_argument("--cached-tokens", type=int, default=0, help="cached_tokens to report in usage")
    parser.add_argument("--decode-pace", action="store_true",
                        help="pace only the content pieces; the finish, usage and [DONE] events follow at once")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    fake = FakeUpstream(models=args.model or ("fake-model",), api_key=args.api_key, chunks=args.chunks,
                        chunk_delay=args.chunk_delay, cached_tokens=args.cached_tokens, port=args.port, record=False,
                        decode_pace=args.decode_pace)
    with fake:
        print(f"fake upstream listening on {fake.base_url}", flush=True)
        try:
            stopping.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
