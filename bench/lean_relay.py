"""Experiment: a streaming relay whose stream bytes never pass through a coroutine. The upstream connection is an
asyncio Protocol; each block it receives is written as it came (already chunk-framed) straight onto the client's
transport from the callback, so a chunk costs one wake, one read and one write, with no task switch.

    UPSTREAM=http://127.0.0.1:PORT/v1 python -m uvicorn lean_relay:application --app-dir bench --loop uvloop \
        --http httptools --port N
"""
import asyncio
import json
import os
from urllib.parse import urlsplit

import httptools
from bare_proxy import lifespan, upstream_payload

UPSTREAM = urlsplit(os.environ.get("UPSTREAM", "http://127.0.0.1:1/v1"))
END = b"0\r\n\r\n"


class Upstream(asyncio.Protocol):
    def __init__(self):
        self.head = asyncio.get_running_loop().create_future()
        self.done = asyncio.get_running_loop().create_future()
        self.pending = b""
        self.out = None
        self.tail = b""

    def data_received(self, data):
        if self.out is None:
            self.pending += data
            if not self.head.done() and b"\r\n\r\n" in self.pending:
                head, self.pending = self.pending.split(b"\r\n\r\n", 1)
                self.head.set_result(head)
            return
        self.relay(data)

    def start(self, transport):
        self.out = transport
        if self.pending:
            data, self.pending = self.pending, b""
            self.relay(data)

    def relay(self, data):
        if data.endswith(END):
            data = data[:-len(END)]
            if data:
                self.out.write(data)
            if not self.done.done():
                self.done.set_result(None)
            return
        self.out.write(data)

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)
        if not self.head.done():
            self.head.set_exception(ConnectionError("upstream closed"))


class ParsedUpstream(Upstream):
    """The same relay with the upstream's answer parsed by httptools as the gateway's client parses it, each body
    piece framed again and written from the parser's callback (LEAN_PARSE=1): what the HTTP parse adds to a chunk."""

    def __init__(self):
        super().__init__()
        self.parser = httptools.HttpResponseParser(self)
        self.held = []

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_headers_complete(self):
        self.head.set_result(b"HTTP/1.1 %d" % self.parser.get_status_code())

    def on_body(self, body):
        if self.out is None:
            self.held.append(bytes(body))
            return
        self.out.write(b"%x\r\n%b\r\n" % (len(body), body))

    def on_message_complete(self):  # the server's own send ends the client's body
        if not self.done.done():
            self.done.set_result(None)

    def start(self, transport):
        self.out = transport
        for body in self.held:
            self.on_body(body)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    payload = await upstream_payload(receive)
    data = json.dumps(payload).encode()
    loop = asyncio.get_running_loop()
    protocol = ParsedUpstream if os.environ.get("LEAN_PARSE") else Upstream
    transport, upstream = await loop.create_connection(protocol, UPSTREAM.hostname, UPSTREAM.port)
    transport.write(b"POST %s/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % (UPSTREAM.path.encode(), UPSTREAM.netloc.encode(), len(data))
                    + data)
    head = await upstream.head
    status = int(head.split(b" ", 2)[1])
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/event-stream")]})
    upstream.start(send.__self__.transport)
    await upstream.done
    transport.close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
