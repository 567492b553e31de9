"""One Compare column's request, streamed through the gateway's in-process entry point
(panel/gateway/panel_requests.py: channel order, retries, fallback, budget, usage record) with the events a page
needs (text deltas, then the metrics or a diagnosis).

`stream_chat` is an async generator of plain dicts. Like every gateway request it records exactly one RequestLog
row, including when the page goes away: Django cancels the generator on a client disconnect, the upstream
connection is closed and the row says `client_closed`."""
import json
from dataclasses import dataclass
from decimal import Decimal

from panel.channels.diagnosis import describe_upstream_error
from panel.gateway import panel_requests

ENDPOINT = "compare"  # the RequestLog endpoint of requests sent from the Compare page


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


def metrics_of(outcome):
    exchange, started, ended, cost = outcome.exchange, outcome.started, outcome.ended, outcome.cost
    first_token_at, first_event_at, pieces = outcome.first_token_at, outcome.first_event_at, outcome.pieces
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
            "fell_back": exchange.log["fell_back"], **_local_cost(exchange.target)}


def _local_cost(target):
    """A deployment's engine has no price per token: its GPU's price per hour is shared out by the minute among
    the requests it served (the usage row gets its share then), so the column says that instead of a cost of 0."""
    if target is None or not target.engine_words:
        return {}
    hourly = target.gpu_hourly
    return {"cost": None, "local_gpu": True,
            "gpu_hourly": format(Decimal(str(hourly)).normalize(), "f") if hourly is not None else None}


async def stream_chat(column, payload, *, team_id, endpoint=ENDPOINT):
    """Send `payload` (a chat body without `model`) to the column and yield events:
    {"type": "delta", "text"}... then {"type": "done", "ok", "text", "metrics", "diagnosis", "json_valid"}.
    `endpoint`: what its usage row says sent it (Compare, an evaluation run)."""
    outcome = None
    stream = panel_requests.chat_stream(
        targets=column.targets, payload=payload, model_name=column.model_name, team_id=team_id,
        route_id=column.route_id, fallback=column.fallback, endpoint=endpoint,
        # one channel was asked: its failure belongs to it in the usage record
        failed_target=column.targets[0] if column.kind == "channel" and column.targets else None)
    try:
        async for kind, value in stream:
            if kind == "delta":
                yield {"type": "delta", "text": value}
            else:
                outcome = value
    finally:
        await stream.aclose()  # the page went away while a delta was out: the request stops and is recorded
    failure = outcome.error
    yield {"type": "done", "ok": outcome.ok, "text": outcome.text, "metrics": metrics_of(outcome),
           "error_kind": failure.kind if failure else "", "diagnosis": diagnosis_of(failure, column) if failure
           else "", "json_valid": outcome.exchange.fields["json_valid"]}
