"""The usage records (one per gateway request) for export into a team's own billing: filtered, and paged by a cursor
on the record id (keyset: `WHERE team_id = ? AND id > ? ORDER BY id LIMIT n` on the (team, id) index), so the
thousandth page costs what the first does, at ten million records too. `since`/`until` are turned into an id range
once (the first and last record of the window by created_at, through the (team, created_at) index, widened by
ID_SLACK ids because rows are not written in exact time order), so no page scans outside the window."""
import base64
import datetime
from typing import Any

from django.db.models import Q
from ninja import Field, Query, Router, Schema

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.schemas import Money
from panel.usage.models import RequestLog
from panel.usage.tags import TagError, tag_clean, tag_lookup, tags_read

router = Router(tags=["usage"])

ID_SLACK = 2000  # as the rollup's overlap: writers may commit ids slightly out of time order
FIELDS = ("id", "created_at", "key_id", "route_id", "channel_id", "endpoint", "model", "stream", "status_code",
          "outcome", "error_kind", "attempts", "fell_back", "prompt_tokens", "completion_tokens", "cached_tokens",
          "cache_write_tokens", "reasoning_tokens", "server_tool_calls", "tokens_estimated", "ttft_ms", "latency_ms",
          "cost", "gpu_cost", "json_requested", "json_valid", "canary", "spilled", "request_id", "attempt_trail",
          "tags")


class UsageQuery(Schema):
    since: datetime.datetime | None = Field(None, description="Records at or after this time (ISO 8601, UTC).")
    until: datetime.datetime | None = Field(None, description="Records before this time.")
    key: int | None = Field(None, ge=1, le=2**53)
    channel: int | None = Field(None, ge=1, le=2**53)
    route: int | None = Field(None, ge=1, le=2**53)
    model: str | None = Field(None, max_length=200)
    outcome: str | None = Field(None, pattern=r"^(ok|error|client_closed|upstream_stalled|upstream_cut)$")
    tag: str | None = Field(None, max_length=200, description="Only records that carry this tag.")
    cursor: str | None = Field(None, max_length=64, description="next_cursor of the page before.")
    limit: int = Field(1000, ge=1, le=10_000)


class UsageRecord(Schema):
    id: int
    created_at: datetime.datetime
    key_id: int | None
    route_id: int | None
    channel_id: int | None
    endpoint: str
    model: str
    stream: bool
    status_code: int
    outcome: str
    error_kind: str
    attempts: int
    fell_back: bool
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_write_tokens: int | None = Field(None, description="Prompt tokens written to the provider's prompt cache "
                                                             "(Anthropic's cache creation tokens); part of "
                                                             "prompt_tokens. Empty where the provider did not say.")
    reasoning_tokens: int | None = Field(None, description="Completion tokens spent reasoning before the answer, "
                                                           "where the provider reports them; part of "
                                                           "completion_tokens.")
    server_tool_calls: int | None = Field(None, description="Tool calls the provider ran itself and bills per call "
                                                            "(web searches, file searches), priced at the channel's "
                                                            "price per 1,000 calls and part of cost.")
    tokens_estimated: str | None = Field(None, description="Which token figures are estimated rather than reported "
                                                           "by the upstream: 'prompt', 'completion' or "
                                                           "'prompt+completion' (a client that left before the "
                                                           "usage arrived, a channel that reports none). Empty: all "
                                                           "reported.")
    ttft_ms: float | None
    latency_ms: float
    cost: Money
    gpu_cost: Money | None = Field(None, description="A local request's share of its deployment's GPU cost in its "
                                                     "minute (split by tokens), already part of cost. Empty: a "
                                                     "cloud request, a host without a GPU price, or not allocated "
                                                     "yet (a few minutes after the request).")
    json_requested: bool
    json_valid: bool | None
    canary: bool | None
    spilled: bool | None = Field(description="True: the local engine's expected wait passed the route's spill wait, "
                                 "so the request went to a remote channel first.")
    request_id: str = Field(description="The x-request-id header of the answer.")
    attempt_trail: list[dict[str, Any]] = Field(description="Each upstream attempt in order: channel, channel_id, "
                                                "outcome, ms, status (a \"spilled\" step also says expected_wait_ms).")
    tags: list[str] = Field(description="The request's tags (the x-tokenwise-tags header, metadata.tags).")


class UsagePage(Schema):
    items: list[UsageRecord]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null when this was the last.")


def cursor_encode(last_id, high):
    return base64.urlsafe_b64encode(f"{last_id}:{high}".encode()).decode().rstrip("=")


def cursor_decode(text):
    try:
        last, high = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode().split(":")
        return int(last), int(high)
    except (ValueError, UnicodeDecodeError):
        raise Invalid({"cursor": ["That cursor did not come from this API: pass next_cursor as it was."]}) from None


def _window_ids(team, since, until):
    """(lowest id, highest id) that can hold a record of the window."""
    rows = RequestLog.objects.filter(team=team).order_by()
    low = 0
    if since is not None:
        first = rows.filter(created_at__gte=since).order_by("created_at").values_list("id", flat=True).first()
        if first is None:
            return None
        low = max(first - ID_SLACK - 1, 0)
    high = rows.order_by("-id").values_list("id", flat=True).first() or 0
    if until is not None:
        last = rows.filter(created_at__lt=until).order_by("-created_at").values_list("id", flat=True).first()
        if last is None:
            return None
        high = min(last + ID_SLACK, high)
    return low, high


def usage_page(*, team, query):
    """One page of the team's usage records and the cursor of the next."""
    if query.since and query.until and query.since >= query.until:
        raise Invalid({"until": ["until must be after since."]})
    if query.cursor:
        after, high = cursor_decode(query.cursor)
    else:
        window = _window_ids(team, query.since, query.until)
        if window is None:
            return {"items": [], "next_cursor": None}
        after, high = window
    rows = RequestLog.objects.filter(team=team, id__gt=after, id__lte=high)
    conditions = Q()
    for name, value in (("created_at__gte", query.since), ("created_at__lt", query.until), ("key_id", query.key),
                        ("channel_id", query.channel), ("route_id", query.route), ("model", query.model),
                        ("outcome", query.outcome)):
        if value is not None:
            conditions &= Q(**{name: value})
    if query.tag is not None:
        try:
            conditions &= Q(**tag_lookup(tag_clean(query.tag)))
        except TagError as error:
            raise Invalid({"tag": [str(error)]}) from None
    items = list(rows.filter(conditions).order_by("id").values(*FIELDS)[:query.limit])
    for item in items:
        item["tags"] = tags_read(item["tags"])
    more = len(items) == query.limit and items[-1]["id"] < high
    return {"items": items, "next_cursor": cursor_encode(items[-1]["id"], high) if more else None}


@router.get("/usage", auth=gate("usage.view"), response=errors({200: UsagePage}),
            summary="Usage records, oldest first, a page at a time (follow next_cursor until it is null)")
def usage_list(request, query: Query[UsageQuery]):
    return usage_page(team=request.team, query=query)
