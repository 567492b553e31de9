"""One Compare column's request, streamed through the gateway's pipeline by its front door for the panel's own
requests (panel/gateway/panel_requests.py: the route's rules, canary, budget holds, each channel's API, the deadline,
one usage record) with the events a page needs: text deltas, then the metrics or a diagnosis.

`stream_chat` is an async generator of plain dicts. Like every gateway request it records exactly one RequestLog
row, including when the page goes away: Django cancels the generator on a client disconnect, the upstream
connection is closed and the row says `client_closed`."""
from panel.gateway import panel_requests

ENDPOINT = "compare"  # the RequestLog endpoint of requests sent from the Compare page


async def stream_chat(column, payload, *, team_id):
    """Send `payload` (a chat body without `model`) to the column (a panel_requests.Candidate) and yield events:
    {"type": "delta", "text"}... then {"type": "done", "ok", "text", "metrics", "error_kind", "diagnosis",
    "json_valid"}."""
    outcome = None
    stream = panel_requests.ask(column, payload, team_id=team_id, endpoint=ENDPOINT)
    try:
        async for kind, value in stream:
            if kind == "delta":
                yield {"type": "delta", "text": value}
            else:
                outcome = value
    finally:
        await stream.aclose()  # the page went away while a delta was out: the request stops and is recorded
    yield {"type": "done", "ok": outcome.ok, "text": outcome.text, "metrics": outcome.metrics(),
           "error_kind": outcome.error_kind, "diagnosis": outcome.diagnosis(),
           "json_valid": outcome.exchange.fields["json_valid"]}
