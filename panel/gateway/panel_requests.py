"""The panel's own front door to the gateway: the requests that Compare, evaluation runs and shadow tests send, in
process, through the same pipeline as a client's (panel/gateway/pipeline.py: the route's rules, the budgets' holds,
the canary split, the balance and spill, each channel's API, the deadline, one usage record). They differ from a
client's only in who sends them (the team, without a key: `PanelKey`) and in where the answer goes: a reader that
turns the pipeline's chat stream back into text pieces.

A candidate is what such a request is sent to: one channel (asked once, without retries, when Compare measures it)
or a route (as the gateway serves that model name). `ask` is the one way to send a request; it records exactly one
usage row, including when its caller goes away (the row says `client_closed`)."""
import asyncio
import json
import re
import time
from dataclasses import dataclass
from decimal import Decimal

from panel.channels.diagnosis import describe_upstream_error
from panel.channels.models import Channel, Route
from panel.channels.routing import channel_route, route_read
from panel.gateway import pipeline
from panel.gateway.exchange import Exchange
from panel.gateway.responses import json_requested

KEY = re.compile(r"^(channel|route):(\d{1,10})$")


class CandidateError(Exception):
    """A candidate the caller must refuse, with the sentence it shows: `status` 400 (bad input) or 404 (not the
    team's), `field` the form field it belongs to."""

    def __init__(self, message, *, status=400, field=""):
        super().__init__(message)
        self.status, self.field = status, field


@dataclass(frozen=True)
class Candidate:
    """A resolved candidate: what it is called, and the route its requests take (a channel's is a route of it)."""

    index: int
    kind: str  # channel | route
    id: int
    label: str
    route: object  # channels/routing.RouteTargets

    @property
    def model_name(self):
        return self.route.model_name

    @property
    def targets(self):
        """The channels the route may call (its rules' and canary's aside)."""
        return tuple(entry.target for entry in self.route.entries)


def candidate_spec(*, team, key, field="columns"):
    """"channel:3" -> {"kind", "id", "label"} for an enabled channel or route of the team (else CandidateError)."""
    match = KEY.match(key) if isinstance(key, str) else None
    if not match:
        raise CandidateError(f"{key!r} is not a column: use channel:<id> or route:<id>", field=field)
    kind, pk = match.group(1), int(match.group(2))
    model = Channel if kind == "channel" else Route
    row = model.objects.filter(team=team, pk=pk).first()
    if row is None:
        raise CandidateError(f"{kind} #{pk} does not exist in team {team.name}", status=404, field=field)
    if not row.enabled:
        raise CandidateError(f"{kind} {row} is disabled: enable it on the Channels page, or pick another",
                             field=field)
    label = f"{row.name} · {row.model_id}" if kind == "channel" else f"route {row.model_name}"
    return {"kind": kind, "id": pk, "label": label}


def candidate_resolve(*, team, spec, index=0, retries=0):
    """A candidate spec -> Candidate, read now (a deleted or disabled channel or route is a CandidateError).

    A channel is tried `retries` times after the first (0: Compare measures that channel, and a retry would hide
    its TTFT; None: the channel's own setting). A route behaves as the gateway does for that model name."""
    if spec["kind"] == "channel":
        channel = Channel.objects.filter(team=team, pk=spec["id"]).first()
        if channel is None or not channel.enabled:
            raise CandidateError(f"{spec['label']} is gone or disabled", status=404)
        return Candidate(index=index, kind="channel", id=channel.pk, label=spec["label"],
                         route=channel_route(channel, retries=retries))
    row = Route.objects.filter(team=team, pk=spec["id"]).first()
    route = route_read(team.pk, row.model_name) if row is not None and row.enabled else None
    if route is None:
        raise CandidateError(f"{spec['label']} is gone or disabled", status=404)
    return Candidate(index=index, kind="route", id=row.pk, label=spec["label"], route=route)


def channel_candidate(team, name, *, retries=None):
    """The team's enabled channel `name` as a candidate (an evaluation's reference or judge); CandidateError when
    it is gone or disabled."""
    channel = Channel.objects.filter(team=team, name=name, enabled=True).first()
    if channel is None:
        raise CandidateError(f"channel {name} is gone or disabled", status=404)
    return candidate_resolve(team=team, spec={"kind": "channel", "id": channel.pk, "label": name}, retries=retries)


@dataclass
class Outcome:
    """How a panel request ended: `exchange` holds its usage record's figures (fields, trail, the channel that
    answered, `error` when it failed)."""

    text: str
    exchange: Exchange
    started: float
    ended: float
    first_token_at: float | None
    first_event_at: float | None
    pieces: list

    @property
    def ok(self):
        fields = self.exchange.fields
        return fields["outcome"] == "ok" and fields["status_code"] == 200

    @property
    def error(self):
        """What ended it (an UpstreamError, or the gateway's Refusal), None when it succeeded."""
        return None if self.ok else self.exchange.error

    @property
    def error_kind(self):
        return "" if self.ok else self.exchange.fields["error_kind"]

    @property
    def cost(self):
        return self.exchange.fields.get("cost") or Decimal(0)

    def metrics(self):
        """The figures a page shows for the answer."""
        exchange, fields = self.exchange, self.exchange.fields
        completion = fields["completion_tokens"] or len(self.pieces)
        ttft_at = self.first_token_at or self.first_event_at
        decode_seconds = (self.ended - ttft_at) if ttft_at else 0
        # Decode speed: tokens after the first over the time after it (TTFT is shown on its own).
        rate = (completion - 1) / decode_seconds if completion > 1 and decode_seconds > 0 else None
        return {"ttft_ms": round((ttft_at - self.started) * 1000, 1) if ttft_at else None,
                "tokens_per_second": round(rate, 1) if rate is not None else None,
                "prompt_tokens": fields["prompt_tokens"], "completion_tokens": completion,
                "cached_tokens": fields["cached_tokens"], "latency_ms": round((self.ended - self.started) * 1000, 1),
                "cost": format(self.cost.normalize(), "f") if self.cost else "0",
                "channel": exchange.target.name if exchange.target else "", "attempts": exchange.log["attempts"],
                "fell_back": exchange.log["fell_back"], **_local_cost(exchange.target)}

    def diagnosis(self):
        """What went wrong, in the troubleshooting words of channels/diagnosis.py, never a stack trace ("" when
        nothing did)."""
        error = self.error
        if self.ok:
            return ""
        if error is None:
            return f"the request ended early ({self.error_kind})"
        if isinstance(error, pipeline.Refusal):
            return f"Refused: {error}."
        target = self.exchange.channel
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


def _local_cost(target):
    """A deployment's engine has no price per token: its GPU's price per hour is shared out by the minute among
    the requests it served (the usage row gets its share then), so a page says that instead of a cost of 0."""
    if target is None or not target.engine_words:
        return {}
    hourly = target.gpu_hourly
    return {"cost": None, "local_gpu": True,
            "gpu_hourly": format(Decimal(str(hourly)).normalize(), "f") if hourly is not None else None}


class _Reader:
    """The pipeline's `send` for the panel: the chat stream it relays, read back into text pieces (a queue the
    caller reads, None at the end). An error answer's body is not read: the exchange holds the error."""

    def __init__(self):
        self.pieces = asyncio.Queue()
        self.status = None
        self.pending = b""
        self.first_event_at = None

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        if self.status != 200:
            return
        self.pending += message.get("body", b"")
        while b"\n\n" in self.pending:
            event, self.pending = self.pending.split(b"\n\n", 1)
            self._event(event)

    def _event(self, raw):
        if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
            return
        event = json.loads(raw[6:])
        for choice in event.get("choices") or ():
            self.first_event_at = self.first_event_at or time.perf_counter()
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece:
                self.pieces.put_nowait(piece)


async def ask(candidate, payload, *, team_id, endpoint):
    """Stream the chat `payload` (without `model`) to `candidate` through the gateway's pipeline for `team_id`,
    and yield ("delta", text) for every piece of the answer, then ("done", Outcome). `endpoint` is what its usage
    row says sent it (compare, evaluation, shadow)."""
    started = time.perf_counter()
    exchange = Exchange(endpoint, started)
    exchange.team_id = team_id
    body = {**payload, "model": candidate.model_name, "stream": True}
    exchange.fields.update(model=candidate.model_name[:200], stream=True, json_requested=json_requested(body))
    call = pipeline.Call("chat", body, candidate.route, pipeline.PanelKey(team_id), client=False)
    reader = _Reader()
    work = asyncio.ensure_future(_serve(call, exchange, reader))
    pieces, first_token_at = [], None
    try:
        while (piece := await reader.pieces.get()) is not None:
            first_token_at = first_token_at or time.perf_counter()
            pieces.append(piece)
            yield "delta", piece
        await work
    except (asyncio.CancelledError, GeneratorExit):
        exchange.client_left()  # the caller went away: stop paying for it
        raise
    finally:
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        ended = time.perf_counter()
        await pipeline.finish(exchange)
    yield "done", Outcome(text="".join(pieces), exchange=exchange, started=started, ended=ended,
                          first_token_at=first_token_at, first_event_at=reader.first_event_at, pieces=pieces)


async def _serve(call, exchange, reader):
    try:
        await pipeline.serve(call, exchange, reader.send)
    finally:
        reader.pieces.put_nowait(None)
