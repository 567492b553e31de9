"""/v1/messages/count_tokens: how many input tokens a Messages request holds, counted where the model's tokenizer is.

A channel that speaks Messages is asked the same question (the body passes through). A local vLLM deployment's
channel set to speak chat completions only is asked through the engine's own /tokenize, with the request translated
to chat messages (the chat template applied, as for a chat request). A route with no channel that can count (a
cloud provider that speaks only chat completions) gets the gateway's own estimate (the characters of the request's
text / 4, as the routing rules count), marked as one in the `x-tokenwise-token-count` header: Claude Code counts its
context before it trims it, and a 400 would stop it. A count is not a request for an answer: no usage record and
nothing charged, but it is admitted like one (the key, its model allow-list, the route, its per-minute limits and a
spent budget's 402)."""
import dataclasses

from panel.channels.rules import input_token_estimate
from panel.gateway import messages_api, translation
from panel.gateway.attempts import first_success
from panel.gateway.responses import send_json, upstream_failure
from panel.gateway.upstream import UpstreamError, post_json
from panel.gateway.waking import Waker

ESTIMATE_WORDS = b"estimate: no channel of this route counts tokens; characters / 4"


class _Errors:
    """Errors in Anthropic's shape (upstream_failure's `passage`)."""

    @staticmethod
    def error_body(status, message, *, kind, code):
        return messages_api.error_body(status, message)


def can_count(target):
    return target.channel.speaks("messages") or target.loopback_ok


def engine_root(target):
    """The target at its server's root, where vLLM serves /tokenize (the channel's base URL ends in /v1)."""
    base = target.base_url.rstrip("/")
    return dataclasses.replace(target, base_url=base[:-3] if base.endswith("/v1") else base)


async def respond(exchange, route, body, send):
    targets = [target for target in route.ordered() if can_count(target)]
    if not targets:
        await send_json(send, 200, {"input_tokens": input_token_estimate(body)},
                        [*exchange.headers, (b"x-tokenwise-token-count", ESTIMATE_WORDS)])
        exchange.responded = True
        return
    chat = None
    if not all(target.channel.speaks("messages") for target in targets):
        try:
            chat = translation.messages_request_to_chat(dict(body, max_tokens=1), model_id="")
        except translation.NotTranslatable as error:
            targets = [target for target in targets if target.channel.speaks("messages")]
            if not targets:
                await send_json(send, 400, messages_api.error_body(400, str(error)), exchange.headers)
                return

    async def attempt(target, limits):
        if target.channel.speaks("messages"):
            data = await post_json(target, "/messages/count_tokens", dict(body, model=target.model_id), limits,
                                   "messages")
            count = data.get("input_tokens") if isinstance(data, dict) else None
        else:
            payload = {"model": target.model_id, "messages": chat["messages"]}
            if chat.get("tools"):
                payload["tools"] = chat["tools"]
            data = await post_json(engine_root(target), "/tokenize", payload, limits)
            count = data.get("count") if isinstance(data, dict) else None
        if not isinstance(count, int) or isinstance(count, bool):
            raise UpstreamError("malformed", "the channel's answer has no token count")
        return count

    try:
        _, count = await first_success(targets, attempt, fallback_on_error=route.fallback_on_error, log=exchange.log,
                                       deadline=route.deadline, waker=Waker.for_route(exchange.owner_team_id, route))
    except UpstreamError as error:
        status, payload = upstream_failure(exchange, error, _Errors)
        await send_json(send, status, payload, exchange.headers)
        return
    await send_json(send, 200, {"input_tokens": count}, exchange.headers)
    exchange.responded = True
