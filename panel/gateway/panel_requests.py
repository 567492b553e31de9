"""Requests the panel itself sends through the gateway (the Compare page and its checks), in process rather than
over HTTP: the same channel order, retries, fallback, budget refusal, stream checks and usage record as a client's
request. `chat_stream` is the one entry point for such callers.

It records exactly one RequestLog row per request, including when the caller goes away: a cancelled generator
closes the upstream connection and the row says `client_closed`."""
import asyncio
import time
from dataclasses import dataclass

from panel.budgets import enforcement as budgets
from panel.gateway.attempts import first_success
from panel.gateway.exchange import Exchange, cost_of
from panel.gateway.responses import STATUS_FOR_KIND, is_json, json_requested
from panel.gateway.upstream import TRANSPORT_ERRORS, UpstreamError, open_stream, parse_event, upstream_body
from panel.gateway.waking import Waker

CHAT_PATH = "/chat/completions"


@dataclass
class Outcome:
    """How a panel request ended: `error` is the UpstreamError that ended it (None when it succeeded), `exchange`
    holds the usage record's figures (fields, log, target), `cost` what it cost."""

    text: str
    error: object
    exchange: Exchange
    cost: object
    started: float
    ended: float
    first_token_at: float | None
    first_event_at: float | None
    pieces: list

    @property
    def ok(self):
        return self.error is None


async def chat_stream(*, targets, payload, model_name, team_id, route_id, fallback, endpoint, failed_target=None):
    """Stream the chat `payload` (without `model`) to the first of `targets` that answers, and yield
    ("delta", text) for every piece of the answer, then ("done", Outcome). `failed_target`: the target a failure
    is recorded against when every target failed (a single channel asked for by name)."""
    started = time.perf_counter()
    exchange = Exchange(endpoint, started)
    exchange.team_id = team_id
    exchange.route_id = route_id
    exchange.fields.update(model=model_name[:200], stream=True, json_requested=json_requested(payload))
    body = {**payload, "model": model_name, "stream": True}
    opened, failure, pieces = None, None, []
    first_token_at = first_event_at = None
    try:
        try:
            spent = await budgets.team_refusal(team_id)
            if spent is not None:  # the panel's own traffic counts against the team's budget too
                raise UpstreamError("budget_exceeded", spent, status=402, retryable=False, client_fault=True)
            target, opened = await first_success(
                list(targets), lambda target, limits: open_stream(
                    target, CHAT_PATH, upstream_body(body, target, stream=True), limits),
                fallback_on_error=fallback, log=exchange.log, stream=True,
                waker=Waker.for_channels(f"a {endpoint} request"))
            exchange.target = target
            async for event in stream_events(opened):
                exchange.usage_from(event)
                for choice in event.get("choices") or []:
                    first_event_at = first_event_at or time.perf_counter()
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        if first_token_at is None:
                            first_token_at = time.perf_counter()
                            exchange.fields["ttft_ms"] = (first_token_at - started) * 1000
                        pieces.append(piece)
                        yield "delta", piece
        except UpstreamError as error:
            failure = error
            status = error.status if error.client_fault and error.status else STATUS_FOR_KIND.get(error.kind, 502)
            exchange.fail(status, error.kind)
            if failed_target is not None:
                exchange.target = failed_target
    except (asyncio.CancelledError, GeneratorExit):
        exchange.client_left()  # the caller went away: stop paying for it
        raise
    finally:
        if opened is not None:
            opened.response.close()
        ended = time.perf_counter()
        if not exchange.fields["completion_tokens"]:
            exchange.fields["completion_tokens"] = len(pieces)
        text = "".join(pieces)
        if exchange.fields["json_requested"] and failure is None:
            exchange.fields["json_valid"] = is_json(text)
        await exchange.finish()
    cost = cost_of(exchange.target, exchange.fields["prompt_tokens"], exchange.fields["completion_tokens"],
                   exchange.fields["cached_tokens"])
    yield "done", Outcome(text=text, error=failure, exchange=exchange, cost=cost, started=started, ended=ended,
                          first_token_at=first_token_at, first_event_at=first_event_at, pieces=pieces)


async def stream_events(opened):
    """The parsed events of an opened stream, up to [DONE]. UpstreamError for a cut, an error event, bad JSON."""
    async def lines():
        for line in opened.first:
            yield line
        async for line in opened.lines:
            yield line

    try:
        async for line in lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = parse_event(data)
            if event is None:
                raise UpstreamError("malformed", "the channel's stream has an event that is not JSON")
            if "error" in event:
                error = event["error"]
                raise UpstreamError("error_event", str(error.get("message", "error event in the stream")
                                                       if isinstance(error, dict) else error))
            yield event
    except TimeoutError:
        raise UpstreamError("stalled", "the stream ran past the channel's total time") from None
    except TRANSPORT_ERRORS as error:
        raise UpstreamError("cut", f"the channel's stream broke ({type(error).__name__})") from None
    raise UpstreamError("cut", "the channel's stream ended without [DONE]")
