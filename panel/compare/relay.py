"""One Compare column's request, streamed: the gateway's own building blocks (channel order, retries, fallback,
stream opening, usage record) with the events a page needs (text deltas, then the metrics or a diagnosis).

`stream_chat` is an async generator of plain dicts. It records exactly one RequestLog row per request, like the
gateway, including when the page goes away: Django cancels the generator on a client disconnect, the upstream
connection is closed and the row says `client_closed`."""
import asyncio
import json
import time
from dataclasses import dataclass

from panel.budgets import enforcement as budgets
from panel.channels.diagnosis import describe_upstream_error
from panel.gateway.attempts import first_success
from panel.gateway.exchange import Exchange, cost_of
from panel.gateway.responses import STATUS_FOR_KIND, is_json, json_requested
from panel.gateway.upstream import TRANSPORT_ERRORS, UpstreamError, open_stream, parse_event, upstream_body

ENDPOINT = "compare"  # the RequestLog endpoint of requests sent from the Compare page
CHAT_PATH = "/chat/completions"


@dataclass(frozen=True)
class Column:
    """A resolved column: what it is called, the model name recorded, and the gateway targets to try."""

    index: int
    kind: str  # channel | route
    id: int
    label: str
    model_name: str
    targets: tuple
    fallback: bool
    route_id: int | None

    @property
    def timeout(self):
        return max(target.timeout for target in self.targets) if self.targets else 0.0


def diagnosis_of(error, column):
    """The troubleshooting wording for a failed request (channels/diagnosis.py), never a stack trace."""
    target = column.targets[-1] if column.targets else None
    if error.kind == "budget_exceeded":
        return f"Refused: {error}."
    if error.status:
        body = error.body or json.dumps({"error": {"message": str(error)}})
        return describe_upstream_error(status=error.status, body=body,
                                       model_id=target.model_id if target else "")
    if error.kind in ("connection", "stalled", "deadline"):
        return describe_upstream_error(exception=error, url=target.base_url if target else "",
                                       timeout=target.timeout if target else None)
    if error.kind == "cut":
        return f"{error}: the server closed the stream early (a crash, a restart, or a proxy timeout)."
    if error.kind in ("malformed", "error_event"):
        return f"{error}: the server is not answering like an OpenAI-compatible API."
    return str(error)


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


def metrics_of(exchange, *, started, ended, first_token_at, first_event_at, pieces, cost):
    fields = exchange.fields
    completion = fields["completion_tokens"] or len(pieces)
    ttft_at = first_token_at or first_event_at
    decode_seconds = (ended - ttft_at) if ttft_at else 0
    # Decode speed: tokens after the first over the time after it (TTFT is shown on its own).
    rate = (completion - 1) / decode_seconds if completion > 1 and decode_seconds > 0 else None
    return {"ttft_ms": round((ttft_at - started) * 1000, 1) if ttft_at else None,
            "tokens_per_second": round(rate, 1) if rate is not None else None,
            "prompt_tokens": fields["prompt_tokens"], "completion_tokens": completion,
            "cached_tokens": fields["cached_tokens"], "latency_ms": round((ended - started) * 1000, 1),
            "cost": format(cost.normalize(), "f") if cost else "0",
            "channel": exchange.target.name if exchange.target else "", "attempts": exchange.log["attempts"],
            "fell_back": exchange.log["fell_back"]}


async def stream_chat(column, payload, *, team_id):
    """Send `payload` (a chat body without `model`) to the column and yield events:
    {"type": "delta", "text"}... then {"type": "done", "ok", "text", "metrics", "diagnosis", "json_valid"}."""
    started = time.perf_counter()
    exchange = Exchange(ENDPOINT, started)
    exchange.team_id = team_id
    exchange.route_id = column.route_id
    exchange.fields.update(model=column.model_name[:200], stream=True, json_requested=json_requested(payload))
    body = {**payload, "model": column.model_name, "stream": True}
    opened, failure, pieces = None, None, []
    first_token_at = first_event_at = None
    try:
        try:
            spent = await budgets.team_refusal(team_id)
            if spent is not None:  # the panel's own traffic counts against the team's budget too
                raise UpstreamError("budget_exceeded", spent, status=402, retryable=False, client_fault=True)
            target, opened = await first_success(
                list(column.targets), lambda target, limits: open_stream(
                    target, CHAT_PATH, upstream_body(body, target, stream=True), limits),
                fallback_on_error=column.fallback, log=exchange.log, stream=True)
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
                        yield {"type": "delta", "text": piece}
        except UpstreamError as error:
            failure = error
            status = error.status if error.client_fault and error.status else STATUS_FOR_KIND.get(error.kind, 502)
            exchange.fail(status, error.kind)
            if column.kind == "channel":  # one channel was asked: its failure belongs to it in the usage record
                exchange.target = column.targets[0]
    except (asyncio.CancelledError, GeneratorExit):
        exchange.client_left()  # the page went away: stop paying for it
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
    yield {"type": "done", "ok": failure is None, "text": text,
           "metrics": metrics_of(exchange, started=started, ended=ended, first_token_at=first_token_at,
                                 first_event_at=first_event_at, pieces=pieces, cost=cost),
           "error_kind": failure.kind if failure else "", "diagnosis": diagnosis_of(failure, column) if failure
           else "", "json_valid": exchange.fields["json_valid"]}
