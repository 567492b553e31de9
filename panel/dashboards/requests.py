"""The team's requests one by one: the list (newest first, failures only on demand), one request's detail with its
attempt trail (which channel was called, what happened, how long it took), and the dashboards' tables that read the
usage rows themselves: failed attempts per channel and outcome, and cached-token hit rates per key, route and
request. Rows never hold a prompt or a key, so every member of the team may read them, as the dashboards."""
from collections import Counter
from datetime import datetime, timezone

from django.db.models import Q
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from panel.accounts.decorators import team_view
from panel.accounts.models import TeamKey
from panel.dashboards.selectors import usage_grouped
from panel.dashboards.tables import Table
from panel.usage.models import PLACEMENT_STEPS, RequestLog

LIST_LIMIT = 100
SCAN_LIMIT = 20_000  # the most usage rows one failures table reads (the newest of the range)
OUTCOME_WORDS = {
    "ok": "answered", "stalled": "stalled (no first token, or a silence past the idle time)",
    "cut": "the stream broke", "connection": "could not connect", "upstream_error": "the channel answered 5xx",
    "rate_limited": "the channel answered 429", "upstream_auth": "the channel refused its key",
    "upstream_not_found": "the channel does not serve the model", "malformed": "an answer that is not JSON",
    "error_event": "an error event", "bad_request": "the channel refused the request (4xx)",
    "misconfigured": "the channel's key cannot be read (not called)",
    "refused": "the channel's address is not allowed (not called)", "client_closed": "the client left",
    "upstream_too_large": "an answer larger than the gateway accepts (not kept)",
}


def _moment(epoch):
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def rows_in(query):
    """The usage rows of a dashboard query (its range, key and channel filters)."""
    rows = RequestLog.objects.filter(team=query.team, created_at__gte=_moment(query.start),
                                     created_at__lt=_moment(query.end))
    if query.key_id is not None:
        rows = rows.filter(key_id=query.key_id)
    if query.key_ids is not None:
        rows = rows.filter(key_id__in=sorted(query.key_ids))
    if query.models is not None:
        rows = rows.filter(model__in=sorted(query.models))
    return rows


def failures_table(query, channel_names):
    """Failed upstream attempts per channel and outcome, from the attempt trails of the range's rows."""
    rows = rows_in(query).filter(Q(attempts__gt=1) | ~Q(outcome="ok")).order_by("-created_at")
    attempts, requests, rescued = Counter(), Counter(), Counter()
    for trail, outcome, channel_id in rows.values_list("attempt_trail", "outcome", "channel_id")[:SCAN_LIMIT]:
        seen = set()
        for step in trail or ():
            if step.get("outcome") == "ok" or step.get("outcome") in PLACEMENT_STEPS:
                continue
            if query.channel_id is not None and step.get("channel_id") != query.channel_id:
                continue
            name = channel_names.get(step.get("channel_id"), step.get("channel") or "(deleted channel)")
            key = (name, step.get("outcome") or "?")
            attempts[key] += 1
            seen.add(key)
        if outcome == "client_closed" and (query.channel_id is None or channel_id == query.channel_id):
            key = (channel_names.get(channel_id, "(no channel)"), "client_closed")
            attempts[key] += 1
            seen.add(key)
        for key in seen:
            requests[key] += 1
            rescued[key] += outcome == "ok"
    return Table("failures", "Failed attempts by channel and outcome", [
        "channel", "outcome", "what happened", "failed attempts", "requests", "answered by another attempt"],
        [[name, outcome, OUTCOME_WORDS.get(outcome, outcome), count, requests[(name, outcome)],
          rescued[(name, outcome)]] for (name, outcome), count in attempts.most_common()],
        note="From each request's attempt trail (Requests lists them one by one). A request may fail on a channel "
             "and still be answered by a retry or a fallback.")


def _rate(part, whole):
    return round(100 * part / whole, 1) if whole else None


def hit_rate_tables(query, channel_names, key_names):
    """The gateway's cached-token hit rates (cached prompt tokens / prompt tokens) per key, per route and per
    request, beside the engine's own prefix-cache counters on the same tab."""
    columns = ("requests", "prompt_tokens", "cached_tokens")
    by_key = sorted(usage_grouped(query, by=("key_id",), columns=columns), key=lambda row: -row["prompt_tokens"])
    by_route = sorted(usage_grouped(query, by=("model",), columns=columns), key=lambda row: -row["prompt_tokens"])
    recent = rows_in(query).filter(prompt_tokens__gt=0).order_by("-created_at")
    if query.channel_id is not None:
        recent = recent.filter(channel_id=query.channel_id)
    recent = recent.values("created_at", "request_id", "key_id", "model", "prompt_tokens", "cached_tokens")[:20]
    heads = ["requests", "prompt tokens", "cached tokens", "hit rate %"]
    return [
        Table("hit_by_key", "Cached-token hit rate by key (gateway usage)", ["key"] + heads,
              [[key_names.get(row["key_id"], "(panel traffic)" if row["key_id"] is None else "(deleted key)"),
                row["requests"], row["prompt_tokens"], row["cached_tokens"],
                _rate(row["cached_tokens"], row["prompt_tokens"])] for row in by_key]),
        Table("hit_by_route", "Cached-token hit rate by route (gateway usage)", ["route"] + heads,
              [[row["model"], row["requests"], row["prompt_tokens"], row["cached_tokens"],
                _rate(row["cached_tokens"], row["prompt_tokens"])] for row in by_route]),
        Table("hit_by_request", "Cached-token hit rate of the latest requests (gateway usage)", [
            "at (UTC)", "request id", "key", "route", "prompt tokens", "cached tokens", "hit rate %"],
            [[row["created_at"].strftime("%Y-%m-%d %H:%M:%S"), row["request_id"],
              key_names.get(row["key_id"], "(panel traffic)" if row["key_id"] is None else "(deleted key)"),
              row["model"], row["prompt_tokens"], row["cached_tokens"],
              _rate(row["cached_tokens"], row["prompt_tokens"])] for row in recent],
            note="Hit rate: the prompt tokens the channel reported as cached (vLLM: its prefix cache), over all "
                 "prompt tokens. Requests lists every request with its detail."),
    ]


# ------------------------------------------------------------------------------------------------------- the pages

def _keys(team):
    return {key.pk: str(key) for key in TeamKey.objects.filter(team=team)}


@require_GET
@team_view("usage.view")
def request_list(request):
    failed = request.GET.get("failed") == "1"
    rows = RequestLog.objects.filter(team=request.team).select_related("channel", "route")
    if failed:
        rows = rows.filter(Q(attempts__gt=1) | ~Q(outcome="ok") | Q(status_code__gte=400))
    rows = list(rows.order_by("-created_at")[:LIST_LIMIT])
    keys = _keys(request.team)
    for row in rows:
        row.key_name = keys.get(row.key_id, "(panel traffic)" if row.key_id is None else "(deleted key)")
        row.hit_rate = _rate(row.cached_tokens, row.prompt_tokens)
    return render(request, "dashboards/requests.html", {"rows": rows, "failed": failed, "limit": LIST_LIMIT})


@require_GET
@team_view("usage.view")
def request_detail(request, request_id):
    row = get_object_or_404(RequestLog.objects.select_related("channel", "route", "route_rule"), team=request.team,
                            request_id=request_id)
    row.key_name = _keys(request.team).get(row.key_id, "(panel traffic)" if row.key_id is None else "(deleted key)")
    row.hit_rate = _rate(row.cached_tokens, row.prompt_tokens)
    trail = [{**step, "words": step.get("note") or OUTCOME_WORDS.get(step.get("outcome"), step.get("outcome"))}
             for step in row.attempt_trail or ()]
    return render(request, "dashboards/request_detail.html", {"row": row, "trail": trail})
