"""The unified gateway: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models, and
Anthropic's /v1/messages and /v1/messages/count_tokens.

A plain ASGI application mounted in front of Django (panel/asgi.py): no middleware, no ORM query that a cache
can answer, usage written by a background thread. One team key, one base URL, every model. Which API each channel
is called in, and the translation between chat completions and Messages, is panel/gateway/apis.py's."""
import asyncio
import time

from django.conf import settings
from django.utils import timezone

from panel.channels.routing import model_names, route_for
from panel.core import outbound, safejson
from panel.gateway import fingerprint, messages_api, pipeline, provider_tools, relay
from panel.gateway.exchange import Exchange
from panel.gateway.keys import key_lookup
from panel.gateway.pipeline import ANTHROPIC_ENDPOINTS, Refusal
from panel.gateway.responses import error_body, json_requested, send_json
from panel.gateway.shadow import mirror_maybe
from panel.usage import tags as request_tags

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages",
             "/v1/messages/count_tokens": "count_tokens", "/v1/responses": "responses", "/v1/embeddings": "embeddings"}


async def read_body(receive, limit):
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refusal(499, "client closed the connection", code="client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refusal(413, f"request body larger than {limit} bytes", code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def header(scope, name):
    """A request header's value as text ("" when absent)."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1").strip()
    return ""


def bearer(scope, anthropic=False):
    if anthropic and (raw := messages_api.api_key(scope)):
        return raw
    for name, value in scope["headers"]:
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text.lower().startswith("bearer "):
                return text[7:].strip()
            if text.lower().startswith("bearer"):
                raise Refusal(401, "malformed Authorization header: put a space after 'Bearer'",
                              code="invalid_api_key", kind="authentication_error")
            raise Refusal(401, "Authorization must be 'Bearer <team key>'", code="invalid_api_key",
                          kind="authentication_error")
    raise Refusal(401, "missing API key: send 'x-api-key: <team key>' or 'Authorization: Bearer <team key>'"
                  if anthropic else "missing API key: send 'Authorization: Bearer <team key>'",
                  code="missing_api_key", kind="authentication_error")


async def authenticate(scope, anthropic=False):
    raw = bearer(scope, anthropic)
    key = await key_lookup(raw) if raw else None
    if key is None:
        raise Refusal(401, "invalid API key", code="invalid_api_key", kind="authentication_error")
    if key.revoked:
        raise Refusal(401, "this key was revoked", code="invalid_api_key", kind="authentication_error")
    if key.expires_at is not None and key.expires_at <= timezone.now():
        raise Refusal(401, "this key has expired", code="invalid_api_key", kind="authentication_error")
    return key


def parse_request(raw, endpoint):
    try:
        body = safejson.loads(raw)
    except safejson.NestedTooDeep:
        raise Refusal(400, "the body is nested too deeply", code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError included
        raise Refusal(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise Refusal(400, "the body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise Refusal(400, "'model' is required (a string)", code="missing_model")
    if endpoint in ANTHROPIC_ENDPOINTS:
        try:
            return messages_api.parse_messages_request(body, count_only=endpoint == "count_tokens")
        except messages_api.MessagesRequestError as error:
            raise Refusal(400, str(error), code="invalid_request") from None
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise Refusal(400, "'messages' must be a non-empty list of message objects", code="invalid_messages")
    elif endpoint in ("responses", "embeddings"):
        if not isinstance(body.get("input"), (str, list)) or not body["input"]:
            raise Refusal(400, "'input' is required (a string or a list)", code="invalid_input")
        if body.get("background"):
            raise Refusal(400, "'background' responses are not served through the gateway: the work would "
                               "outlive the request, where it can be neither stopped nor charged; send the "
                               "request without it (streamed, if it is long)", code="background_not_supported")
    elif not isinstance(body.get("prompt"), (str, list)):
        raise Refusal(400, "'prompt' is required (a string or a list)", code="invalid_prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise Refusal(400, "'stream' must be true or false", code="invalid_stream")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 1 <= max_tokens <= settings.GATEWAY_MAX_TOKENS):
        raise Refusal(400, f"'max_tokens' must be a whole number from 1 to {settings.GATEWAY_MAX_TOKENS}",
                      code="invalid_max_tokens")
    return body


def take_tags(scope, body):
    """The request's tags (panel/usage/tags.py): the x-tokenwise-tags header's and the body's `metadata.tags`, which
    is taken out of the body (and `metadata` with it when nothing else is left in it), so no upstream sees it."""
    given = request_tags.split_list(header(scope, request_tags.HEADER.encode()))
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "tags" in metadata:
        listed = metadata.pop("tags")
        if not metadata:
            del body["metadata"]
        if isinstance(listed, str):
            listed = request_tags.split_list(listed)
        if not isinstance(listed, list):
            raise Refusal(400, "metadata.tags must be a list of strings or one comma-separated string",
                          code="invalid_tags")
        given += listed
    try:
        return request_tags.tags_clean(given)
    except request_tags.TagError as error:
        raise Refusal(400, f"{error} (in the {request_tags.HEADER} header or metadata.tags)",
                      code="invalid_tags") from None


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
    send = relay.ClientSend.wrap(send, settings.GATEWAY_CLIENT_WRITE_SECONDS, exchange.client_stalled)
    try:
        if any(name == HOP for name, _ in scope["headers"]):
            raise Refusal(508, "this request comes from a Tokenwise channel pointed at this panel; refused so "
                               "that it cannot loop", code="loop_detected")
        if path == "/v1/models":
            exchange.recorded = False  # a listing, not a request for an answer: no usage record
            if scope["method"] != "GET":
                raise Refusal(405, "use GET", code="method_not_allowed")
            exchange.key = await authenticate(scope)
            names = [name for name in await model_names(exchange.key.team_id)
                     if not exchange.key.allowed_models or name in exchange.key.allowed_models]
            await send_json(send, 200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "tokenwise"} for name in names]},
                exchange.headers)
            return
        if scope["method"] != "POST":
            raise Refusal(405, "use POST", code="method_not_allowed")
        exchange.key = await authenticate(scope, endpoint in ANTHROPIC_ENDPOINTS)
        body = parse_request(await read_body(receive, settings.GATEWAY_MAX_BODY_BYTES), endpoint)
        refusal = provider_tools.body_refusal(body)
        if refusal:
            raise Refusal(400, refusal, code="provider_tool_refused")
        tags = take_tags(scope, body)
        try:
            await request_tags.tags_admit(exchange.key.team_id, tags)
        except request_tags.TagError as error:
            raise Refusal(400, str(error), code="too_many_tags") from None
        exchange.fields["tags"] = exchange.tags = request_tags.tags_stored(tags)
        exchange.fields.update(fingerprint.system_prompt_hashes(body),  # hashes only, never the prompt
                               prompt_head_hash=fingerprint.prompt_head_hash(body))
        exchange.fields.update(model=body["model"][:200], stream=bool(body.get("stream")),
                               json_requested=json_requested(body))
        exchange.model_served = False  # the client's words until a route serves that name
        if exchange.key.allowed_models and body["model"] not in exchange.key.allowed_models:
            raise Refusal(403, f"this key may not use model {body['model']!r}", code="model_not_allowed",
                          kind="permission_error")
        route = await route_for(exchange.key.team_id, body["model"])
        if route is None:
            raise Refusal(404, f"model {body['model']!r} is not served here: GET /v1/models lists the models "
                               "of your team", code="model_not_found")
        exchange.model_served = True
        call = pipeline.Call(endpoint, body, route, exchange.key, headers=scope["headers"], tags=tags,
                             betas=header(scope, b"anthropic-beta")[:1000])
        await until_disconnect(exchange, pipeline.serve(call, exchange, send), receive)
    except Refusal as error:
        await pipeline.refuse(send, exchange, error, endpoint)
    finally:
        await pipeline.finish(exchange)
        mirror_maybe(exchange)  # a route's shadow test: in the background, the client has its whole answer


async def until_disconnect(exchange, work, receive):
    """Run the upstream work for a request while watching its ASGI receive channel: a client that leaves, streamed
    or not, cancels the work at once (the upstream call, a retry's backoff, the fallback), and nothing more is done
    for it. The work runs in this task; one watcher task cancels it (one task per request, not two and a wait)."""
    task = asyncio.current_task()
    state = {"left": False, "done": False}

    async def watch():
        await wait_disconnect(receive)
        if not state["done"]:
            state["left"] = True
            task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await work
    except asyncio.CancelledError:
        if not state["left"]:
            raise  # cancelled from outside (the server shutting down), not by the client leaving
        task.uncancel()
        exchange.client_left()
    finally:
        state["done"] = True
        watcher.cancel()


async def wait_disconnect(receive):
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
