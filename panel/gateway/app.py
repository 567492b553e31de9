"""The unified OpenAI-compatible gateway: /v1/chat/completions, /v1/completions, /v1/models.

A plain ASGI application mounted in front of Django (panel/asgi.py): no middleware, no ORM query that a cache
can answer, usage written by a background thread. One team key, one base URL, every model."""
import asyncio
import json
import logging
import time
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from panel.budgets import enforcement as budgets
from panel.channels.diagnosis import describe_upstream_error
from panel.channels.routing import model_names, route_for
from panel.core import outbound, safejson
from panel.gateway import fingerprint, metrics, rate_limits
from panel.gateway.keys import key_lookup
from panel.gateway.upstream import TRANSPORT_ERRORS, UpstreamError, first_success, open_stream, post_json, upstream_body
from panel.usage import writer as usage_writer

log = logging.getLogger(__name__)

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
STATUS_FOR_KIND = {"timeout": 504, "rate_limited": 429, "misconfigured": 502, "no_channel": 503}


class ClientError(Exception):
    def __init__(self, status, message, *, code, kind="invalid_request_error", headers=()):
        super().__init__(message)
        self.status, self.code, self.kind, self.headers = status, code, kind, list(headers)


def error_body(message, *, kind, code):
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


async def send_json(send, status, body, headers=()):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": raw})


async def read_body(receive, limit):
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientError(499, "client closed the connection", code="client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ClientError(413, f"request body larger than {limit} bytes", code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def bearer(scope):
    for name, value in scope["headers"]:
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text.lower().startswith("bearer "):
                return text[7:].strip()
            if text.lower().startswith("bearer"):
                raise ClientError(401, "malformed Authorization header: put a space after 'Bearer'",
                                  code="invalid_api_key", kind="authentication_error")
            raise ClientError(401, "Authorization must be 'Bearer <team key>'", code="invalid_api_key",
                              kind="authentication_error")
    raise ClientError(401, "missing API key: send 'Authorization: Bearer <team key>'", code="missing_api_key",
                      kind="authentication_error")


async def authenticate(scope):
    raw = bearer(scope)
    key = await key_lookup(raw) if raw else None
    if key is None:
        raise ClientError(401, "invalid API key", code="invalid_api_key", kind="authentication_error")
    if key.revoked:
        raise ClientError(401, "this key was revoked", code="invalid_api_key", kind="authentication_error")
    if key.expires_at is not None and key.expires_at <= timezone.now():
        raise ClientError(401, "this key has expired", code="invalid_api_key", kind="authentication_error")
    return key


def parse_request(raw, endpoint):
    try:
        body = safejson.loads(raw)
    except safejson.NestedTooDeep:
        raise ClientError(400, "the body is nested too deeply", code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError included
        raise ClientError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ClientError(400, "the body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ClientError(400, "'model' is required (a string)", code="missing_model")
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ClientError(400, "'messages' must be a non-empty list of message objects", code="invalid_messages")
    elif not isinstance(body.get("prompt"), (str, list)):
        raise ClientError(400, "'prompt' is required (a string or a list)", code="invalid_prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ClientError(400, "'stream' must be true or false", code="invalid_stream")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 1 <= max_tokens <= settings.GATEWAY_MAX_TOKENS):
        raise ClientError(400, f"'max_tokens' must be a whole number from 1 to {settings.GATEWAY_MAX_TOKENS}",
                          code="invalid_max_tokens")
    return body


def json_requested(body):
    response_format = body.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")


def cost_of(target, prompt, completion, cached):
    return Decimal(0) if target is None else target.channel.cost(prompt, completion, cached)


class Exchange:
    """One request's facts, turned into its one usage record."""

    def __init__(self, endpoint, started):
        self.started = started
        self.fields = {"endpoint": endpoint, "model": "", "stream": False, "status_code": 200, "outcome": "ok",
                       "error_kind": "", "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                       "ttft_ms": None, "json_requested": False, "json_valid": None}
        self.log = {"attempts": 0, "fell_back": False, "rate_limited": 0}
        self.key = None
        self.team_id = None  # for a request made inside the panel (Compare), which has no key
        self.route_id = None
        self.target = None
        self.responded = False  # the whole response has been sent
        self.settled = False

    def usage_from(self, data):
        usage_data = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage_data, dict):
            return
        self.fields["prompt_tokens"] = int(usage_data.get("prompt_tokens") or 0)
        self.fields["completion_tokens"] = int(usage_data.get("completion_tokens") or 0)
        details = usage_data.get("prompt_tokens_details") or {}
        self.fields["cached_tokens"] = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0

    def fail(self, status, kind, outcome="error"):
        self.fields.update(status_code=status, outcome=outcome, error_kind=kind[:40])

    async def settle(self):
        """Price the request and count it against its key's token rate and budgets, once. Called before the last
        byte goes out, so the client's next request is judged with this one counted."""
        if self.settled:
            return
        self.settled = True
        fields = self.fields
        fields["cost"] = cost_of(self.target, fields["prompt_tokens"], fields["completion_tokens"],
                                 fields["cached_tokens"])
        if self.key is not None:
            # Shielded: a client that leaves mid-count does not undo it (the relay is cancelled, the count is not).
            await asyncio.shield(count_against_limits(self.key, fields["cost"],
                                                      fields["prompt_tokens"] + fields["completion_tokens"]))

    async def finish(self):
        try:
            await self.settle()  # a request that ended without an answer (an error, a client that left)
        finally:
            self.record()

    def record(self):
        fields = dict(self.fields)
        fields["latency_ms"] = (time.perf_counter() - self.started) * 1000
        usage_writer.record(team_id=self.key.team_id if self.key else self.team_id,
                            key_id=self.key.id if self.key else None, route_id=self.route_id,
                            channel_id=self.target.id if self.target else None, attempts=self.log["attempts"],
                            rate_limited_attempts=self.log["rate_limited"], fell_back=self.log["fell_back"], **fields)
        metrics.gateway_request_observe(fields=fields, fell_back=self.log["fell_back"])


async def count_against_limits(key, cost, tokens):
    """Add a request's tokens to its key's per-minute window and its cost and tokens to the budget counters."""
    try:
        await rate_limits.count_tokens(key, tokens)
        await budgets.count(key, cost, tokens)
    except Exception as error:  # a Redis outage must not turn a good answer into an error
        log.warning("request not counted against key %s's limits (%s); the budget reconciliation catches up",
                    key.id, type(error).__name__)


HOP = outbound.HOP_HEADER.lower().encode()


async def application(scope, receive, send):
    """The ASGI entry for every path under /v1/."""
    started = time.perf_counter()
    path = scope["path"].rstrip("/")
    endpoint = ENDPOINTS.get(path)
    if endpoint is None and path != "/v1/models":
        # Not served: no usage record and no metric label, so a stranger cannot grow either at will.
        await send_json(send, 404, error_body(f"no such endpoint: {path[:100]}", kind="invalid_request_error",
                                              code="not_found"))
        return
    exchange = Exchange(endpoint or path, started)
    try:
        if any(name == HOP for name, _ in scope["headers"]):
            raise ClientError(508, "this request comes from a Tokenwise channel pointed at this panel; refused so "
                                   "that it cannot loop", code="loop_detected")
        if path == "/v1/models":
            if scope["method"] != "GET":
                raise ClientError(405, "use GET", code="method_not_allowed")
            exchange.key = await authenticate(scope)
            names = [name for name in await model_names(exchange.key.team_id)
                     if not exchange.key.allowed_models or name in exchange.key.allowed_models]
            await send_json(send, 200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "tokenwise"} for name in names]})
            return
        if endpoint is None:
            raise ClientError(404, f"no such endpoint: {scope['path']}", code="not_found")
        if scope["method"] != "POST":
            raise ClientError(405, "use POST", code="method_not_allowed")
        exchange.key = await authenticate(scope)
        body = parse_request(await read_body(receive, settings.GATEWAY_MAX_BODY_BYTES), endpoint)
        exchange.fields.update(fingerprint.system_prompt_hashes(body))  # hashes only, never the prompt
        exchange.fields.update(model=body["model"][:200], stream=bool(body.get("stream")),
                               json_requested=json_requested(body))
        if exchange.key.allowed_models and body["model"] not in exchange.key.allowed_models:
            raise ClientError(403, f"this key may not use model {body['model']!r}", code="model_not_allowed",
                              kind="permission_error")
        route = await route_for(exchange.key.team_id, body["model"])
        if route is None:
            raise ClientError(404, f"model {body['model']!r} is not served here: GET /v1/models lists the models "
                                   "of your team", code="model_not_found")
        exchange.route_id = route.route_id
        refused = await rate_limits.admit(exchange.key)
        if refused is not None:
            which, retry_after = refused
            raise ClientError(429, f"this key's {which} limit is reached; retry in {retry_after} s",
                              code="rate_limit_exceeded", kind="rate_limit_error",
                              headers=[(b"retry-after", str(retry_after).encode())])
        if (spent := await budgets.refusal(exchange.key)) is not None:  # 402: SDKs do not retry it, unlike 429
            raise ClientError(402, spent, code="budget_exceeded", kind="insufficient_quota")
        upstream_path = "/chat/completions" if endpoint == "chat" else "/completions"
        if body.get("stream"):
            await stream_response(exchange, route, body, upstream_path, receive, send)
        else:
            await plain_response(exchange, route, body, upstream_path, send)
    except ClientError as error:
        exchange.fail(error.status, error.code)
        if error.status != 499:
            await send_json(send, error.status, error_body(str(error), kind=error.kind, code=error.code),
                            headers=error.headers)
    finally:
        await exchange.finish()


def upstream_failure(exchange, error):
    """The client-facing error after every channel failed."""
    status = error.status if error.client_fault and error.status else STATUS_FOR_KIND.get(error.kind, 502)
    exchange.fail(status, error.kind)
    words = describe_upstream_error(status=error.status, body=error.body) if error.status else str(error)
    return status, error_body(f"{error} ({words})" if words and words != str(error) else str(error),
                              kind="upstream_error", code=error.kind)


async def plain_response(exchange, route, body, path, send):
    async def attempt(target):
        data = await post_json(target, path, upstream_body(body, target, stream=False))
        if not isinstance(data, dict) or "choices" not in data:
            raise UpstreamError("malformed", "the channel's answer has no choices")
        return data

    try:
        target, data = await first_success(route.ordered(exchange.fields), attempt,
                                           fallback_on_error=route.fallback_on_error, log=exchange.log)
    except UpstreamError as error:
        status, payload = upstream_failure(exchange, error)
        await send_json(send, status, payload)
        return
    exchange.target = target
    exchange.usage_from(data)
    exchange.fields["ttft_ms"] = (time.perf_counter() - exchange.started) * 1000
    if exchange.fields["json_requested"]:
        exchange.fields["json_valid"] = is_json(content_of(data))
    data["model"] = body["model"]
    await exchange.settle()
    await send_json(send, 200, data)


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


SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


async def stream_response(exchange, route, body, path, receive, send):
    client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    try:
        target, opened = await first_success(
            route.ordered(exchange.fields),
            lambda target: open_stream(target, path, upstream_body(body, target, stream=True)),
            fallback_on_error=route.fallback_on_error, log=exchange.log)
    except UpstreamError as error:
        status, payload = upstream_failure(exchange, error)
        await send_json(send, status, payload)
        return
    exchange.target = target
    relay = asyncio.ensure_future(relay_stream(exchange, opened, body["model"], client_wants_usage, send))
    disconnect = asyncio.ensure_future(wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({relay, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if disconnect in done and not relay.done():
            relay.cancel()
            if not exchange.responded:  # a client that leaves after the last byte did not cancel anything
                exchange.fail(499, "client_closed", outcome="client_closed")
            try:
                await relay
            except asyncio.CancelledError:
                pass
        else:
            relay.result()
    finally:
        disconnect.cancel()
        if exchange.fields["outcome"] == "ok" and opened.response.content.at_eof():
            opened.response.release()  # keep-alive: the next request reuses the connection
        else:
            opened.response.close()


async def wait_disconnect(receive):
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def relay_stream(exchange, opened, model_name, client_wants_usage, send):
    """Forward the upstream's SSE lines; after the first byte a failure becomes an SSE error event."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    content = []
    finished = False

    async def settle():
        if not exchange.fields["completion_tokens"]:
            exchange.fields["completion_tokens"] = len(content)
        if exchange.fields["json_requested"]:
            exchange.fields["json_valid"] = is_json("".join(content))
        await exchange.settle()

    async def forward(line):
        nonlocal finished
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            await settle()  # a client may stop reading at [DONE]
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            return
        event = json.loads(data) if data else {}
        if not isinstance(event, dict):
            raise UpstreamError("malformed", "an event that is not a JSON object")
        if "error" in event:
            raise UpstreamError("error_event", "the channel sent an error event mid-stream")
        exchange.usage_from(event)
        choices = event.get("choices") or []
        if not choices and "usage" in event and not client_wants_usage:
            return  # the usage chunk we asked for on our own account
        for choice in choices:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                content.append(piece)
                if exchange.fields["ttft_ms"] is None:
                    exchange.fields["ttft_ms"] = (time.perf_counter() - exchange.started) * 1000
        event["model"] = model_name
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                    "more_body": True})

    try:
        for line in opened.first:
            await forward(line)
        if not finished:
            async for line in opened.lines:
                await forward(line)
                if finished:
                    break
        if not finished:
            raise UpstreamError("cut", "the channel's stream ended without [DONE]")
    except Exception as error:  # any failure after the first byte ends the stream with an error event
        if isinstance(error, (asyncio.TimeoutError, *TRANSPORT_ERRORS)):
            error = UpstreamError("cut", f"the channel's stream broke ({type(error).__name__})")
        elif not isinstance(error, UpstreamError):
            error = UpstreamError("malformed", "the channel's stream has an event that is not JSON")
        exchange.fail(502, error.kind)
        event = {"error": {"message": str(error), "type": "upstream_error", "code": error.kind}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                    "more_body": True})
    await settle()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    exchange.responded = True
    if finished:
        async for _ in opened.lines:  # read to the end, so the connection goes back to the pool
            pass
