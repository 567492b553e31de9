"""The relay from the read callback (panel/gateway/relay.py, http_client.Response.push/hold): blocks handed over as
they arrive, a stop that keeps what follows, a held reader that is not taken for an idle upstream, and the client's
writes run outside a task, in order, holding the upstream while the client is slow."""
import asyncio
import concurrent.futures
import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from panel.channels.models import Channel
from panel.gateway import http_client
from panel.gateway.relay import ClientWriter
from tests.gateway.test_http_client import OK_HEAD, chunk, post, run
from tests.support.fake_upstream import content_text
from tests.support.gateway import CHAT, fallback, gateway, primary, records, setup  # noqa: F401

CHUNKED = OK_HEAD + b"transfer-encoding: chunked\r\n\r\n"


def test_push_hands_over_each_block_as_it_arrives_and_a_stop_keeps_what_follows():
    async def scenario(server):
        server.answers = [[CHUNKED + chunk(b"one"), 0.2, chunk(b"two"), 0.2, chunk(b"three") + b"0\r\n\r\n"]]
        response = await post(server)
        loop = asyncio.get_running_loop()
        began, seen = loop.time(), []

        def sink(block):
            seen.append((block, loop.time() - began))
            return block != b"two"

        await response.push(sink)
        rest = await response.read()
        response.release()
        return seen, rest, response.complete

    seen, rest, complete = run(scenario)
    assert [block for block, _ in seen] == [b"one", b"two"]
    assert seen[0][1] < 0.15 and 0.15 < seen[1][1] < 0.35  # each as it came, not when the body was whole
    assert rest == b"three" and complete


def test_push_raises_the_bodys_failure():
    async def scenario(server):
        server.answers = [[CHUNKED + chunk(b"one"), "close"]]
        response = await post(server)
        seen = []
        with pytest.raises(http_client.Disconnected):
            await response.push(lambda block: seen.append(block) or True)
        return seen

    assert run(scenario) == [b"one"]


@pytest.mark.parametrize("held", [True, False])
def test_a_held_reader_is_not_an_idle_upstream(held):
    """While the relay holds the upstream (its client is slow), the bytes it does not read are no silence of the
    upstream's: the idle limit (0.2 s here) only counts while the reader waits for them."""
    async def scenario(server):
        server.answers = [[CHUNKED + chunk(b"one"), 0.05, chunk(b"two") + b"0\r\n\r\n"]]
        response = await post(server)
        response.watch_idle(0.2)
        loop, seen = asyncio.get_running_loop(), []

        def sink(block):
            seen.append(block)
            if held and block == b"one":
                response.hold()
                loop.call_later(0.5, response.unhold)
            return True

        if held:
            await response.push(sink)
            return seen
        response.hold()  # held without a reader that takes its blocks back: the same as not reading
        loop.call_later(0.5, response.unhold)
        await response.push(sink)
        return seen

    assert run(scenario) == [b"one", b"two"]


def run_alone(scenario):
    """`scenario()` in an event loop of its own thread (the worker's may already run one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, scenario()).result(timeout=30)


class Upstream:
    """What ClientWriter holds and lets go of."""

    def __init__(self):
        self.held = []

    def hold(self):
        self.held.append("hold")

    def unhold(self):
        self.held.append("unhold")


def test_the_writer_runs_send_outside_a_task_and_queues_in_order_while_the_client_is_slow():
    async def scenario():
        loop = asyncio.get_running_loop()
        gate, written = loop.create_future(), []

        async def send(message):
            if len(written) == 1:
                await gate  # the client's socket is full: uvicorn's send waits for it to drain
            written.append(message["body"])

        upstream = Upstream()
        writer = ClientWriter(send, upstream)
        writer.write(b"a")
        after_a = list(written)
        writer.write(b"b")  # waits
        writer.write(b"c")
        writer.write(b"d")
        waiting = list(written), list(upstream.held)
        loop.call_later(0.05, gate.set_result, None)
        await writer.drained()
        return after_a, waiting, written, upstream.held

    after_a, waiting, written, held = run_alone(scenario)
    assert after_a == [b"a"]  # written at once, no task switch
    assert waiting == ([b"a"], ["unhold", "hold"])  # the upstream held while "b" waits
    assert written == [b"a", b"b", b"cd"]  # what came meanwhile, in order, in one write
    assert held[-1] == "unhold"


def test_a_failed_write_stops_the_writer_and_drained_raises_it():
    async def scenario():
        calls = []

        async def send(message):
            calls.append(message["body"])
            raise RuntimeError("the server refused the write")

        writer = ClientWriter(send, Upstream())
        writer.write(b"a")
        writer.write(b"b")  # not tried: the writer stopped
        with pytest.raises(RuntimeError, match="refused"):
            await writer.drained()
        return calls

    assert run_alone(scenario) == [b"a"]


def test_closing_the_writer_abandons_a_waiting_write_and_lets_the_upstream_go():
    async def scenario():
        loop = asyncio.get_running_loop()
        ended = []

        async def send(message):
            try:
                await loop.create_future()  # never drains
            finally:
                ended.append(message["body"])

        upstream = Upstream()
        writer = ClientWriter(send, upstream)
        writer.write(b"a")
        writer.close()
        return ended, upstream.held

    ended, held = run_alone(scenario)
    assert ended == [b"a"] and held == ["hold", "unhold"]


def test_a_client_that_stops_reading_holds_the_upstream_and_gets_the_whole_stream_in_order(gateway, setup, primary):
    """A client that reads nothing for 2.5 s while a 40,000-chunk answer (about 9 MB) comes: the gateway's writes
    wait once the sockets' buffers are full (4 MiB at most here), the upstream is held meanwhile, and that silence
    is not the channel's idleness (its idle limit is 1 s). Then the client gets every piece, in order."""
    Channel.objects.filter(pk=setup["local"].pk).update(timeout_seconds=60, idle_timeout_seconds=1)
    primary.chunks = 40000
    body = json.dumps(dict(CHAT, stream=True, max_tokens=40000)).encode()
    address = urlsplit(gateway.url)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    client.connect((address.hostname, address.port))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer %s\r\n"
                   b"content-type: application/json\r\ncontent-length: %d\r\n\r\n"
                   % (setup["raw"].encode(), len(body)) + body)
    time.sleep(2.5)
    received = bytearray()
    client.settimeout(30)
    while not received.endswith(b"\r\n0\r\n\r\n"):
        data = client.recv(1 << 20)
        if not data:
            break
        received += data
    client.close()
    assert len(received) > 6_000_000  # more than the sockets between them hold: the gateway had to wait
    assert b'"error"' not in received and b"data: [DONE]" in received
    pieces = [piece.decode() for piece in re.findall(rb'"content":"([^"]*)"', bytes(received))]
    assert "".join(pieces) == content_text(40000)
    [row] = records()
    assert (row.outcome, row.completion_tokens) == ("ok", 40000)
