"""The gateway's answers: a non-streamed one in one piece, a stream relayed event by event. Both go through
`first_success` (panel/gateway/attempts.py) until one channel answers; after the first byte of a stream has reached
the client, a failure becomes an SSE error event."""
import json
import time

from panel.channels.diagnosis import describe_upstream_error
from panel.core import safejson
from panel.gateway import relay, tracing
from panel.gateway.apis import openai_error_body as error_body
from panel.gateway.attempts import first_success
from panel.gateway.sampling import answer_of
from panel.gateway.upstream import TRANSPORT_ERRORS, UpstreamError, open_stream, post_json
from panel.gateway.waking import Waker

STATUS_FOR_KIND = {"stalled": 504, "deadline": 504, "rate_limited": 429, "misconfigured": 502, "no_channel": 503,
                   "waking": 503}


async def send_json(send, status, body, headers=()):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": raw})


def json_requested(body):
    response_format = body.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")


def upstream_failure(exchange, error, passage=None):
    """The client-facing error after every channel failed, in the client's API."""
    status = error.status if error.client_fault and error.status else STATUS_FOR_KIND.get(error.kind, 502)
    exchange.fail(status, error.kind, error=error)
    words = describe_upstream_error(status=error.status, body=error.body) if error.status else str(error)
    message = f"{error} ({words})" if words and words != str(error) else str(error)
    if passage is not None:
        return status, passage.error_body(status, message, kind="upstream_error", code=error.kind)
    return status, error_body(message, kind="upstream_error", code=error.kind)


async def plain_response(exchange, route, passage, send):
    async def attempt(target, limits):
        api, path, payload = passage.request(target, stream=False)
        return passage.answer(target, await post_json(target, path, payload, limits, api,
                                                      upstream_headers(exchange, passage, api, target)))

    try:
        target, (data, usage) = await first_success(passage.targets, attempt,
                                                    fallback_on_error=route.fallback_on_error, log=exchange.log,
                                                    deadline=route.deadline,
                                                    waker=Waker.for_route(exchange.owner_team_id, route))
    except UpstreamError as error:
        status, payload = upstream_failure(exchange, error, passage)
        await send_json(send, status, payload, exchange.headers)
        return
    exchange.target = target
    exchange.adapted = passage.adapted.get(target.id, [])
    exchange.take_usage(usage)
    exchange.fields["ttft_ms"] = (time.perf_counter() - exchange.started) * 1000
    if exchange.fields["json_requested"]:
        exchange.fields["json_valid"] = is_json(content_of(data))
    if exchange.keeps_answer:
        exchange.answer_parts = [answer_of(passage.client_api, data)]
    await exchange.settle()
    await send_json(send, 200, data, exchange.headers)
    exchange.responded = True


def content_of(data):
    try:
        choice = data["choices"][0]
        return choice.get("message", {}).get("content") or choice.get("text") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


def is_json(text):
    try:
        safejson.loads(text)
    except (ValueError, TypeError):
        return False
    return True


def upstream_headers(exchange, passage, api, target):
    """The client's headers that go with its body, and the trace context for the team's own engines."""
    return {**passage.upstream_headers(api), **tracing.engine_headers(exchange, target)}


SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


async def stream_response(exchange, route, passage, send):
    def attempt(target, limits):
        api, path, payload = passage.request(target, stream=True)
        return open_stream(target, path, payload, limits, api, upstream_headers(exchange, passage, api, target))

    try:
        target, opened = await first_success(
            passage.targets, attempt, fallback_on_error=route.fallback_on_error,
            log=exchange.log, deadline=route.deadline, stream=True,
            waker=Waker.for_route(exchange.owner_team_id, route))
    except UpstreamError as error:
        status, payload = upstream_failure(exchange, error, passage)
        await send_json(send, status, payload, exchange.headers)
        return
    exchange.target = target
    exchange.adapted = passage.adapted.get(target.id, [])
    adapter = passage.stream_adapter(target, exchange)
    try:
        if adapter is None:
            client_wants_usage = bool((passage.body.get("stream_options") or {}).get("include_usage"))
            strip_usage = passage.continuous_usage(target) and not passage.client_wants_every_usage()
            await relay_stream(exchange, opened, passage.model, client_wants_usage, send, strip_usage)
        else:
            await relay_events(exchange, opened, adapter, send)
    finally:
        if exchange.fields["outcome"] == "ok" and opened.response.content.at_eof():
            opened.response.release()  # keep-alive: the next request reuses the connection
        else:
            opened.response.close()


def stream_failure(error):
    """Any failure after the first byte, as the UpstreamError the client's error event names."""
    if isinstance(error, TimeoutError):
        return UpstreamError("stalled", "the stream ran past the channel's total time")
    if isinstance(error, TRANSPORT_ERRORS):
        return UpstreamError("cut", f"the channel's stream broke ({type(error).__name__})")
    if not isinstance(error, UpstreamError):
        return UpstreamError("malformed", "the channel's stream has an event that is not JSON")
    return error


async def relay_events(exchange, opened, adapter, send):
    """Relay a stream through an adapter of panel/gateway/apis.py (translated, or in an API other than chat); after
    the first byte a failure becomes the client's API's error event. The adapter's last events wait for the request
    to be settled: a client may stop reading at them."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + exchange.headers})
    last = []

    def step(line):
        out = adapter.feed(line)
        if adapter.finished:
            last.extend(out)
            return b""
        return b"".join(out)

    try:
        await relay.pump(opened, step, lambda: adapter.finished, send)
        if not adapter.finished:
            raise UpstreamError("cut", "the channel's stream ended before its last event")
        await exchange.settle()
        if last:
            await send({"type": "http.response.body", "body": b"".join(last), "more_body": True})
    except Exception as error:  # any failure after the first byte ends the stream with an error event
        error = stream_failure(error)
        exchange.fail(502, error.kind, error=error)
        await send({"type": "http.response.body", "body": adapter.failure(error), "more_body": True})
    await exchange.settle()  # a failed stream too is counted before its end
    await end_stream(exchange, opened, send, adapter.finished)


async def relay_stream(exchange, opened, model_name, client_wants_usage, send, strip_usage=False):
    """Forward the upstream's SSE events, each checked, counted and named with the route's model; after the first
    byte a failure becomes an SSE error event. `strip_usage`: the usage on every chunk was the gateway's request, not
    the client's, and is taken out of its chunks. [DONE] waits for the request to be settled."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + exchange.headers})
    content = []
    finished = False
    blocks = EventBlocks(exchange)

    def step(line):
        nonlocal finished
        if not line.startswith("data:"):
            return b""
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            return b""
        event = safejson.loads(data) if data else {}
        if not isinstance(event, dict):
            raise UpstreamError("malformed", "an event that is not a JSON object")
        if "error" in event:
            raise UpstreamError("error_event", "the channel sent an error event mid-stream")
        if blocks.names is None and isinstance(event.get("model"), str):
            blocks.learn(event["model"], model_name)
        exchange.usage_from(event)
        choices = event.get("choices") or []
        if not choices and "usage" in event and not client_wants_usage:
            return b""  # the usage chunk we asked for on our own account
        if choices and strip_usage:
            event.pop("usage", None)
        for choice in choices:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                content.append(piece)
                exchange.content_arrived(piece)
        event["model"] = model_name
        return b"data: " + safejson.dumps(event) + b"\n\n"

    async def settle():
        if exchange.fields["json_requested"]:
            exchange.fields["json_valid"] = is_json("".join(content))
        await exchange.settle()

    passed_as_is = not (strip_usage or exchange.keeps_answer or exchange.fields["json_requested"])
    try:
        await relay.pump(opened, step, lambda: finished, send, blocks.take if passed_as_is else None)
        if not finished:
            raise UpstreamError("cut", "the channel's stream ended without [DONE]")
        await settle()  # a client may stop reading at [DONE]
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
    except Exception as error:  # any failure after the first byte ends the stream with an error event
        error = stream_failure(error)
        exchange.fail(502, error.kind, error=error)
        event = {"error": {"message": str(error), "type": "upstream_error", "code": error.kind}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                    "more_body": True})
    await settle()
    await end_stream(exchange, opened, send, finished)


async def end_stream(exchange, opened, send, finished):
    """The client's stream ends; a finished upstream stream is read to its end, so its connection goes back to the
    pool (a failure there only closes it)."""
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    exchange.responded = True
    if finished:
        try:
            async for _ in opened.lines:
                pass
        except (UpstreamError, *TRANSPORT_ERRORS):
            pass


class EventBlocks:
    """A block of the upstream's chat events relayed as it came, with the route's model name put in, where its bytes
    show that stepping each event (relay_stream's step) would change nothing else: every event a `data: {...}` line
    and its blank line, none with an error, [DONE] or usage (`"usage":null`, as OpenAI sends it, aside), each with
    the model field as the first event parsed spelled it (compact JSON, as vLLM, OpenAI and the fake upstream write
    it). Any other block is stepped line by line. A raw quote cannot stand inside a JSON string, so these fields are
    the events' own, not text of their content. Content pieces are counted as the step counts them (each non-empty
    "content" or "text"), for the first token's time and the estimate where no usage comes. The events' JSON is not
    parsed here: an event cut short, or one without the model field, is stepped and refused as before, but a broken
    object that still has its braces and that field goes to the client as it came
    (docs/decisions/0103-chat-events-relayed-as-they-came.md)."""

    def __init__(self, exchange):
        self.exchange = exchange
        self.names = None  # (the upstream's model field, the route's), once the first event was parsed

    def learn(self, upstream_model, route_model):
        self.names = (b'"model":' + safejson.dumps(upstream_model), b'"model":' + safejson.dumps(route_model))

    def take(self, block):
        names = self.names
        if names is None or b'"error"' in block or block.count(b'"usage"') != block.count(b'"usage":null'):
            return None
        events = block.count(b"\n\n")
        if (block.count(b"\n") != 2 * events or block.count(b"data: {") != events
                or block.count(b"}\n\n") != events or block.count(names[0]) != events):
            return None
        pieces = (block.count(b'"content":"') - block.count(b'"content":""')
                  + block.count(b'"text":"') - block.count(b'"text":""'))
        if pieces:
            self.exchange.contents_arrived(pieces)
        return block if names[0] == names[1] else block.replace(names[0], names[1])
