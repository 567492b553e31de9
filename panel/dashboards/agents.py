"""The Agents tab: what agent sessions cost, turn by turn (docs/ARCHITECTURE.md, "Agent sessions").

Read from the usage records of requests that belong to a session (gateway/sessions.py), in the range:
- input tokens per turn: the prompt tokens the upstream counted; their growth is the agent's re-sent context.
- repeated-prefix share: the part of a turn's prompt that repeats the previous turn's (from prefix-block hashes),
  token-weighted over turns: sum(share × input tokens) / sum(input tokens).
- cache share: cached tokens / input tokens, as the upstream reported them.
- billed: the recorded cost (cached tokens at the channel's cached price). Without caching: the same tokens with
  every input token at the channel's input price. At cloud prices: the same tokens at the cloud channel's prices
  (the route's first remote channel, else the team's baseline channel of the Cost tab), cached ones at its cached
  price."""
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal

from panel.accounts.models import TeamKey
from panel.channels.models import Channel, ChannelKind, Route, RouteChannel
from panel.core.money import money, money_text
from panel.dashboards import figures as fig
from panel.dashboards.cost import baseline_channel
from panel.usage.models import RequestLog

MAX_ROWS = 50_000  # a range with more session requests is read on its latest rows
TOP_SESSIONS = 10
CURVES = 5


@dataclass
class SessionTotals:
    session_id: str
    key_id: int | None = None
    route_id: int | None = None
    turns: list = field(default_factory=list)  # one dict per request, by turn
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    repeated_tokens: float = 0.0
    billed: Decimal = Decimal(0)
    uncached: Decimal = Decimal(0)
    cloud: Decimal | None = Decimal(0)

    def add(self, turn):
        self.turns.append(turn)
        self.input_tokens += turn["input"]
        self.output_tokens += turn["output"]
        self.cached_tokens += turn["cached"]
        self.repeated_tokens += turn["repeated"]
        self.billed += turn["billed"]
        self.uncached += turn["uncached"]
        self.cloud = None if self.cloud is None or turn["cloud"] is None else self.cloud + turn["cloud"]


def _share(part, whole):
    return round(100 * part / whole, 2) if whole else None


def cloud_channels(team):
    """{route id: the channel whose prices count as the cloud's}: the route's first remote channel, else the
    team's baseline channel (as the Cost tab picks it)."""
    channels = {channel.pk: channel for channel in Channel.objects.filter(team=team)}
    fallback = baseline_channel(team, [], channels)
    found = {}
    for link in RouteChannel.objects.filter(route__team=team).select_related("channel").order_by("position", "pk"):
        if link.channel.kind == ChannelKind.REMOTE:
            found.setdefault(link.route_id, link.channel)
    return defaultdict(lambda: fallback, found)


def agent_sessions(query):
    """[SessionTotals] of the range's sessions (key and channel filters apply), each with its turns in order."""
    rows = RequestLog.objects.filter(team=query.team, created_at__gte=_moment(query.start),
                                     created_at__lte=_moment(query.end)).exclude(session_id="")
    # A request the gateway refused for the client's own fault (4xx: bad request, key, model or budget) reached no
    # model: it is no turn of a session.
    rows = rows.exclude(outcome="error", status_code__gte=400, status_code__lt=500)
    if query.key_id:
        rows = rows.filter(key_id=query.key_id)
    if query.channel_id:
        rows = rows.filter(channel_id=query.channel_id)
    rows = rows.order_by("-created_at").values(
        "session_id", "session_turn", "key_id", "route_id", "channel_id", "prompt_tokens", "completion_tokens",
        "cached_tokens", "repeated_share", "cost", "created_at")[:MAX_ROWS]
    channels = {channel.pk: channel for channel in Channel.objects.filter(team=query.team)}
    clouds = cloud_channels(query.team)
    sessions = {}
    for row in reversed(list(rows)):
        channel = channels.get(row["channel_id"])
        cloud = clouds[row["route_id"]]
        prompt, completion, cached = row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]
        turn = {"turn": row["session_turn"] or 0, "input": prompt, "output": completion, "cached": cached,
                "repeated": (row["repeated_share"] or 0) * prompt, "repeated_share": row["repeated_share"],
                "billed": row["cost"] or Decimal(0),
                "uncached": channel.cost(prompt, completion, 0) if channel else row["cost"] or Decimal(0),
                "cloud": cloud.cost(prompt, completion, cached) if cloud else None}
        session = sessions.setdefault(row["session_id"], SessionTotals(row["session_id"], key_id=row["key_id"],
                                                                       route_id=row["route_id"]))
        session.add(turn)
    return list(sessions.values())


def _moment(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _turn_line(name, turns, values, index):
    return {"type": "scatter", "name": name, "x": turns, "y": values, "mode": "lines+markers",
            "line": {"color": fig.COLORS[index % len(fig.COLORS)], "width": 2}, "marker": {"size": 5}}


def _turn_axis(figure):
    figure["layout"]["xaxis"].update(title={"text": "turn"}, dtick=1 if len(figure["data"]) else None)
    figure["layout"]["hovermode"] = "closest"
    figure["layout"]["legend"]["y"] = -0.32  # below the axis title
    return figure


def agents(query, *, page, table):
    """The Agents tab's Page (`page` and `table` are the Page and Table classes of pages.py)."""
    sessions = agent_sessions(query)
    keys = {key.pk: str(key) for key in TeamKey.objects.filter(team=query.team)}
    routes = dict(Route.objects.filter(team=query.team).values_list("pk", "model_name"))
    # Costliest first; on equal cost (a free local channel) the longer session, then the larger one, then by id.
    by_cost = sorted(sessions, key=lambda session: (-session.billed, -len(session.turns), -session.input_tokens,
                                                    session.session_id))
    shown = by_cost[:CURVES]
    result = page()
    result.figures["growth"] = _turn_axis(fig.figure("Input tokens per turn (top sessions by cost)", [
        _turn_line(session.session_id[:24], [turn["turn"] for turn in session.turns],
                   [turn["input"] for turn in session.turns], index) for index, session in enumerate(shown)],
        y_title="input tokens", empty="No agent sessions in this range"))
    top = shown[0] if shown else None
    turns = top.turns if top else []
    result.figures["shares"] = _turn_axis(fig.figure(
        f"Repeated prefix and cache share per turn: {top.session_id[:24] if top else 'no session'}", [
            _turn_line("repeats the previous turn", [turn["turn"] for turn in turns],
                       [None if turn["repeated_share"] is None else round(100 * turn["repeated_share"], 2)
                        for turn in turns], 0),
            _turn_line("served from cache", [turn["turn"] for turn in turns],
                       [_share(turn["cached"], turn["input"]) for turn in turns], 1)],
        y_title="% of the turn's input", y_percent=True, empty="No agent sessions in this range"))
    result.tables.append(table("sessions", "Top sessions by cost", [
        "session", "key", "route", "turns", "input tokens", "repeated prefix %", "from cache %", "billed",
        "without caching", "at cloud prices"],
        [[session.session_id, keys.get(session.key_id, "—"), routes.get(session.route_id, "—"), len(session.turns),
          session.input_tokens, _share(session.repeated_tokens, session.input_tokens),
          _share(session.cached_tokens, session.input_tokens), money(session.billed), money(session.uncached),
          money(session.cloud)] for session in by_cost[:TOP_SESSIONS]],
        note="Billed: the recorded cost, cached input at the channel's cached price. Without caching: every input "
             "token at the channel's input price. At cloud prices: the route's remote channel (else the team's "
             "cloud baseline) for the same tokens."))
    result.tables.append(table("turns", "Turns of the top sessions", [
        "session", "turn", "input tokens", "repeats the previous turn %", "from cache %", "output tokens", "billed",
        "without caching", "at cloud prices"],
        [[session.session_id, turn["turn"], turn["input"],
          None if turn["repeated_share"] is None else round(100 * turn["repeated_share"], 2),
          _share(turn["cached"], turn["input"]), turn["output"], money(turn["billed"]), money(turn["uncached"]),
          money(turn["cloud"])] for session in shown for turn in session.turns]))
    for name, title, label, attribute, names in (("keys", "Sessions by key", "key", "key_id", keys),
                                                 ("routes", "Sessions by route", "route", "route_id", routes)):
        groups = defaultdict(list)
        for session in sessions:
            groups[getattr(session, attribute)].append(session)
        result.tables.append(table(name, title, [
            label, "sessions", "turns", "input tokens", "from cache %", "billed", "without caching",
            "at cloud prices"],
            [[names.get(ident, "—"), len(group), sum(len(s.turns) for s in group),
              sum(s.input_tokens for s in group),
              _share(sum(s.cached_tokens for s in group), sum(s.input_tokens for s in group)),
              money(sum(s.billed for s in group)), money(sum(s.uncached for s in group)),
              money(None if any(s.cloud is None for s in group) else sum(s.cloud for s in group))]
             for ident, group in sorted(groups.items(), key=lambda item: -sum(s.billed for s in item[1]))]))
    total_input = sum(session.input_tokens for session in sessions)
    billed = sum((session.billed for session in sessions), Decimal(0))
    uncached = sum((session.uncached for session in sessions), Decimal(0))
    cloud = None if any(s.cloud is None for s in sessions) else sum((s.cloud for s in sessions), Decimal(0))
    result.cards = [
        ("Sessions", f"{len(sessions):,}", f"{sum(len(s.turns) for s in sessions):,} turns"),
        ("Repeated prefix", _percent(_share(sum(s.repeated_tokens for s in sessions), total_input)),
         "of the input re-sends the previous turn"),
        ("From cache", _percent(_share(sum(s.cached_tokens for s in sessions), total_input)),
         f"of {total_input:,} input tokens"),
        ("Billed", money_text(billed),
         f"without caching {money_text(uncached)}; saved {money_text(uncached - billed)}"),
        ("At cloud prices", money_text(cloud), "the same tokens on the cloud channel")]
    return result


def _percent(value):
    return "—" if value is None else f"{value:.1f}%"
