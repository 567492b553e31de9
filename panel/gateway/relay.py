"""A stream relayed to the client from the upstream connection's read callback: each line of the upstream's stream
goes through the relay's `step` (panel/gateway/responses.py: checked, counted, written in the client's API) and what
it returns is written to the client there and then. No task wakes for a chunk: with a task reading the upstream and
writing through `await send(...)`, the switch to it and back cost a third of the process's CPU per chunk at a
decode's pace (docs/benchmarks.md). The request's task waits meanwhile, and takes over at the end (the settling, the
last event) and on any failure.

The client's body goes through the server's ASGI `send` as any other, run by `ClientWriter` rather than a task:
uvicorn's finishes at once unless the client's socket is full. Under uvicorn's httptools server (as `make run` starts
it) a piece is written on its connection as that send would frame it, without the coroutine (`wire_of`), while the
connection is not backed up. When a write has to wait, the upstream's reading is held until the client has drained
(a slow client does not fill the process's memory), and what came meanwhile follows in order; a client that does not
drain within TOKENWISE_GATEWAY_CLIENT_WRITE_SECONDS is dropped (`ClientSend`)."""
import asyncio
import collections


async def pump(opened, step, finished, send, whole=None):
    """Run `step(line)` over the lines of the `opened` stream (upstream.OpenStream: the lines read with its first
    event, then the rest) until `finished()` or the stream's end, writing what each returns (bytes; b"" for nothing)
    to the client. `whole(block)`, where given, is offered each block of whole events first and returns what to
    write for all of them, or None to have them stepped line by line (it must not raise, nor finish the stream).
    Raises what a step raised, the stream's failure, or a failed write; returns once every write is done."""
    writer = ClientWriter(send, opened.response)
    failure = None

    def take(line):
        nonlocal failure
        try:
            out = step(line)
        except Exception as error:  # noqa: BLE001 - handed to the request's task, which words it for the client
            failure = error
            return False
        if out:
            writer.write(out)
        return writer.error is None and not finished()

    def take_whole(block):
        out = whole(block)
        if out is None:
            return None
        writer.write(out)
        return writer.error is None

    try:
        for line in opened.first:
            if not take(line):
                break
        else:
            await opened.lines.push(take, take_whole if whole is not None else None)
        if failure is not None:
            raise failure
        await writer.drained()
    finally:
        writer.close()


class ClientWriter:
    """Writes body pieces to the client through the ASGI `send` from outside any task, running the coroutine `send`
    returns: to its end at once when it does not wait (uvicorn's, unless the client's socket is full); when it
    waits, on from the future it waits for, with the upstream `response` held meanwhile (http_client.Response.hold)
    and later pieces queued in order. `error`: a failed write, after which nothing more is written."""

    def __init__(self, send, response):
        self.send, self.response = send, response
        self.wire = wire_of(send)
        self.error = None
        self.running = None  # the send coroutine waiting for the client
        self.queued = collections.deque()
        self.idle = None  # a future drained() waits on

    def write(self, body):
        if self.error is not None or not body:
            return
        if self.running is not None:
            self.queued.append(body)
            return
        wire = self.wire
        if (wire is not None and wire.chunked_encoding and not wire.flow.write_paused and not wire.disconnected
                and not wire.response_complete):
            wire.transport.write(b"%x\r\n%b\r\n" % (len(body), body))  # as uvicorn's send frames a piece
            return
        self._run(self.send({"type": "http.response.body", "body": body, "more_body": True}))

    async def drained(self):
        """Once every piece is written; raises a write's failure."""
        while self.running is not None:
            self.idle = asyncio.get_running_loop().create_future()
            await self.idle
        if self.error is not None:
            raise self.error

    def close(self):
        """The relay is over, however it ended: a write still waiting is abandoned."""
        if self.running is not None:
            self.running.close()
            self.running = None
            self.response.unhold()
        self.queued.clear()

    def _run(self, coroutine):
        """Step `coroutine` as a task would, until it ends or waits for a future (whose outcome it reads when it
        is stepped again)."""
        try:
            waited = coroutine.send(None)
        except StopIteration:
            self.running = None
            self._next()
            return
        except BaseException as failure:  # noqa: BLE001 - the write failed: the relay stops with it
            self.running = None
            self.error = failure if isinstance(failure, Exception) else ConnectionError("the write was stopped")
            self.queued.clear()
            self._next()
            return
        self.running = coroutine
        self.response.hold()
        if waited is None:  # a bare yield (asyncio.sleep(0)): go on at the loop's next turn
            asyncio.get_running_loop().call_soon(self._resume, None)
        else:
            waited._asyncio_future_blocking = False
            waited.add_done_callback(self._resume)

    def _resume(self, _future):
        if self.running is not None:
            self._run(self.running)

    def _next(self):
        """After a write ended: the queued pieces as one write, or, with none, the upstream read again."""
        if self.queued and self.error is None:
            body = b"".join(self.queued)
            self.queued.clear()
            self._run(self.send({"type": "http.response.body", "body": body, "more_body": True}))
            return
        self.response.unhold()
        if self.running is None and self.idle is not None and not self.idle.done():
            self.idle.set_result(None)


class ClientSend:
    """The client's `send` with a deadline on a write that waits: uvicorn's send waits for as long as the client's
    connection stays backed up, so a client that stops reading without closing would hold the request (its upstream
    call, its engine's slot) for ever. Once one write has waited `seconds`, the connection is aborted (what is
    buffered for it is dropped): the write returns, uvicorn tells the request that the client left, and the request
    ends as one whose client left (`on_stall()` is called first, so that its row can say why). A write to a
    connection that is not backed up costs one check more."""

    def __init__(self, send, cycle, seconds, on_stall):
        self.inner, self.cycle, self.seconds, self.on_stall = send, cycle, seconds, on_stall

    @classmethod
    def wrap(cls, send, seconds, on_stall):
        """`send` with the deadline under uvicorn's httptools server; as it is under another server."""
        cycle = _cycle(send)
        return send if cycle is None else cls(send, cycle, seconds, on_stall).send

    async def send(self, message):
        cycle = self.cycle
        if not cycle.flow.write_paused or cycle.disconnected:
            await self.inner(message)
            return
        timer = asyncio.get_running_loop().call_later(self.seconds, self._abort)
        try:
            await self.inner(message)
        finally:
            timer.cancel()

    def _abort(self):
        if not self.cycle.disconnected:
            self.on_stall()
            self.cycle.transport.abort()


def _cycle(send):
    """The `RequestResponseCycle` of uvicorn's httptools server behind `send` (uvicorn's own, or a ClientSend's), or
    None."""
    owner = getattr(send, "__self__", None)
    if isinstance(owner, ClientSend):
        return owner.cycle
    kind = type(owner)
    if kind.__name__ != "RequestResponseCycle" or kind.__module__ != "uvicorn.protocols.http.httptools_impl":
        return None
    return owner


def wire_of(send):
    """The client's side of uvicorn's httptools server behind `send` (the server `make run` starts), on whose
    connection a body piece can be written as uvicorn's send would write it, minus the coroutine: at a decode's
    pace that send was the largest single cost of a chunk (docs/benchmarks.md). ClientWriter writes there only while
    the response is chunked, started and not complete, and the connection neither gone nor backed up; otherwise,
    and under any other server or a `send` wrapped other than by ClientSend (the panel's own requests), through
    `send`. None where it is not that server's, or for a HEAD request."""
    cycle = _cycle(send)
    if cycle is None or cycle.scope.get("method") == "HEAD" or not cycle.response_started:
        return None
    return cycle
