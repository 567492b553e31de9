"""Chat events relayed as they came (panel/gateway/responses.py EventBlocks, upstream.StreamLines.push's `whole`) and
body pieces written on uvicorn's connection without its send (panel/gateway/relay.py wire_of): what passes whole,
what is stepped event by event as before, and that a client sees the same stream either way."""
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from panel.gateway.relay import ClientWriter, wire_of
from panel.gateway.responses import EventBlocks
from panel.gateway.upstream import StreamLines
from tests.gateway.test_http_client import OK_HEAD, chunk, post, run
from tests.support.fake_upstream import content_text
from tests.support.gateway import CHAT, fallback, gateway, primary, records, setup  # noqa: F401


class Counted:
    """What EventBlocks tells the exchange."""

    def __init__(self):
        self.pieces = 0

    def contents_arrived(self, count):
        self.pieces += count


def event(content, model="up-model", extra=""):
    delta = json.dumps({"content": content}, separators=(",", ":"))
    return ('data: {"id":"c1","object":"chat.completion.chunk","model":%s,"choices":[{"index":0,"delta":%s,'
            '"finish_reason":null}]%s}\n\n' % (json.dumps(model), delta, extra)).encode()


def learned(route="route-name"):
    blocks = EventBlocks(Counted())
    blocks.learn("up-model", route)
    return blocks


def test_a_block_of_whole_events_goes_as_it_came_with_the_routes_name_and_its_pieces_counted():
    blocks = learned()
    block = event("") + event("Hello") + event(" world", extra=',"usage":null')
    out = blocks.take(block)
    assert out == block.replace(b'"model":"up-model"', b'"model":"route-name"')
    assert out.count(b'"model":"route-name"') == 3 and b"up-model" not in out
    assert blocks.exchange.pieces == 2  # the empty role piece is no content, as the step counts it


def test_the_same_name_leaves_the_block_untouched_and_text_that_quotes_the_field_is_not_renamed():
    quoting = event('say "model":"up-model" here')  # in content its quotes are escaped: not the event's field
    assert learned().take(quoting) == quoting.replace(b'"model":"up-model","choices"',
                                                      b'"model":"route-name","choices"')
    assert b'\\"model\\":\\"up-model\\"' in learned().take(quoting)
    same = event("a") + event("b")
    assert learned("up-model").take(same) is same


@pytest.mark.parametrize("block", [
    event("a") + event("b", extra=',"usage":{"prompt_tokens":3,"completion_tokens":2}'),  # usage: counted by a step
    event("a") + b'data: {"error":{"message":"overloaded"}}\n\n',
    event("a") + b"data: [DONE]\n\n",
    b"event: delta\n" + event("a"),  # a line that is not an event's data
    event("a").replace(b'"model":"up-model"', b'"model": "up-model"'),  # spelled otherwise than learned
    event("a").replace(b'"model":"up-model"', b'"model":"other"'),
    event("a").replace(b',"model":"up-model"', b""),  # no model field
    b'data: {"id":"c1","model":"up-model","choices":[\n\n',  # cut short
    b"data: not json\n\n",
    event("a").replace(b"\n\n", b"\r\n\r\n"),
], ids=["usage", "error", "done", "other-line", "spaced", "other-model", "no-model", "cut", "not-json", "crlf"])
def test_a_block_the_step_must_see_is_declined(block):
    blocks = learned()
    assert blocks.take(block) is None
    assert blocks.exchange.pieces == 0


def test_nothing_passes_whole_before_the_first_event_was_parsed():
    blocks = EventBlocks(Counted())
    assert blocks.take(event("a")) is None


def test_push_offers_blocks_that_end_an_event_whole_and_splits_the_rest():
    """A block that begins where the last ended and ends with an event's blank line is offered whole; one that
    ends mid-line, the one that finishes it, and one the relay declines are split into lines."""
    async def scenario(server):
        server.answers = [[OK_HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: {1}\n\n"), 0.1,
                           chunk(b"data: {2"), 0.1, chunk(b"}\n\ndata: {3}\n\n"), 0.1, chunk(b"data: {4}\n\n"), 0.1,
                           chunk(b"data: {no}\n\n"), 0.1, chunk(b"data: {5}\n\n") + b"0\r\n\r\n"]]
        response = await post(server)
        lines, whole = [], []

        def offered(block):
            if b"no" in block:
                return None
            whole.append(block)
            return True

        await StreamLines(response, 5).push(lambda line: lines.append(line) or True, offered)
        response.release()
        return whole, lines

    whole, lines = run(scenario)
    assert whole == [b"data: {1}\n\n", b"data: {4}\n\n", b"data: {5}\n\n"]
    assert lines == ["data: {2}", "", "data: {3}", "", "data: {no}", ""]


def serve(app):
    """uvicorn with the gateway's server flags on a free port, in a thread; returns (server, base URL)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                                           lifespan="off", log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}"


class Unheld:
    def hold(self):
        pass

    def unhold(self):
        pass


def test_pieces_written_on_uvicorns_connection_reach_the_client_framed_as_its_send_frames_them():
    seen = {}

    async def app(scope, receive, send):
        async def wrapped(message):
            await send(message)

        seen["before_start"] = wire_of(send)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        seen["wire"], seen["wrapped"] = wire_of(send), wire_of(wrapped)
        writer = ClientWriter(send, Unheld())
        for piece in (b"one ", b"two ", b"three"):
            writer.write(piece)
        await writer.drained()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    server, url = serve(app)
    try:
        with httpx.Client() as client:
            with client.stream("GET", url) as answer:
                pieces = list(answer.iter_raw())
                framing = answer.headers.get("transfer-encoding")
    finally:
        server.should_exit = True
    assert b"".join(pieces) == b"one two three" and framing == "chunked"
    assert seen["before_start"] is None and seen["wrapped"] is None  # not started, or not uvicorn's own send
    assert type(seen["wire"]).__name__ == "RequestResponseCycle"


def test_a_backed_up_connection_is_written_through_send_which_waits_and_holds_the_upstream():
    """Once uvicorn's connection is backed up (its flow paused), a piece goes through its send, which waits for the
    client: the writer holds the upstream meanwhile and the pieces still arrive whole and in order."""
    events = []

    class Held:
        def hold(self):
            events.append("hold")

        def unhold(self):
            events.append("unhold")

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        writer = ClientWriter(send, Held())
        for index in range(32):
            writer.write(b"%02d" % index + b"x" * 262142)  # 8 MiB in all: past the sockets' buffers
        await writer.drained()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    server, url = serve(app)
    try:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            client.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            client.sendall(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            time.sleep(1)  # read nothing meanwhile
            received = bytearray()
            client.settimeout(20)
            while not received.endswith(b"\r\n0\r\n\r\n"):
                data = client.recv(1 << 20)
                assert data, "the connection closed early"
                received += data
    finally:
        server.should_exit = True
    body = bytes(received).split(b"\r\n\r\n", 1)[1]
    payload = b"".join(part for index, part in enumerate(body.split(b"\r\n")) if index % 2)
    assert payload == b"".join(b"%02d" % index + b"x" * 262142 for index in range(32))
    assert "hold" in events and events[-1] == "unhold"


def test_a_paced_stream_through_the_gateway_names_the_route_in_every_event_and_is_counted(gateway, setup, primary):
    """A chunk every 20 ms, so that each arrives as a block of its own and passes whole: the client sees the route's
    name (not the engine's) in every event, every piece in order, and the usage row its first token and tokens."""
    primary.chunks, primary.chunk_delay = 12, 0.02
    body = dict(CHAT, stream=True, max_tokens=12)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                           headers={"authorization": f"Bearer {setup['raw']}"}) as answer:
            lines = [line for line in answer.iter_lines() if line.startswith("data: {")]
    events = [json.loads(line[6:]) for line in lines]
    assert events and {event["model"] for event in events} == {"chat"}
    assert "".join(event["choices"][0]["delta"].get("content") or "" for event in events) == content_text(12)
    [row] = records()
    assert (row.outcome, row.completion_tokens) == ("ok", 12) and row.ttft_ms > 0
