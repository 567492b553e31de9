"""Reads for the dashboards. Every usage figure comes from UsageRollup (minute rows for the last day, hour rows
beyond), engine figures from EngineSample; never from RequestLog, so a page costs the same at ten million records."""
import time
from dataclasses import dataclass

from django.db.models import F, Sum

from panel.accounts.models import TeamKey
from panel.channels.models import Channel, ChannelKind
from panel.dashboards.models import (
    BUCKET_BOUNDS_MS,
    DAY,
    HOUR,
    LATENCY_COLUMNS,
    MINUTE,
    TTFT_COLUMNS,
    EngineSample,
    TagRollup,
    UsageRollup,
)
from panel.serving.models import Deployment

# range → span seconds. The charts' step is the finest of STEPS that gives at most MAX_POINTS points over the
# window they draw: the range, or less when the team's data is younger than the range (a team an hour old sees its
# hour at minute steps in every range, not one dot a day). Each step reads the coarsest rollup rows that divide it:
# 24 hours at 15-minute steps from minute rows, 7 days at hour steps from hour rows, 30 days from day rows.
RANGES = {"1h": HOUR, "24h": 24 * HOUR, "7d": 7 * 24 * HOUR, "30d": 30 * 24 * HOUR}
STEPS = (MINUTE, 5 * MINUTE, 15 * MINUTE, HOUR, DAY)
MAX_POINTS = 200
MIN_WINDOW = 15 * MINUTE  # a team a minute old still gets an axis of a quarter hour, with its points on a line
QUANTILES = (0.5, 0.95, 0.99)
COUNTS = ("requests", "errors", "refused", "fallbacks", "prompt_tokens", "completion_tokens", "cached_tokens",
          "cache_write_tokens", "reasoning_tokens", "server_tool_calls", "cost", "spilled", "spilled_cost",
          "ttft_count", "ttft_sum_ms", "latency_sum_ms")

TAG_COUNTS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens",
              "reasoning_tokens", "cost")


class BadQuery(ValueError):
    """A query parameter the dashboards cannot use; the message says which and why."""


@dataclass(frozen=True)
class DashboardQuery:
    team: object
    range: str
    channel_id: int | None = None
    deployment_id: int | None = None
    key_id: int | None = None
    now: float | None = None
    # My usage: only these keys / these models (None: no such filter; empty: nothing matches)
    key_ids: frozenset | None = None
    models: frozenset | None = None
    first: float | None = None  # epoch seconds of the team's first data (None: draw the whole range)

    @property
    def span(self):
        return RANGES[self.range]

    @property
    def window(self):
        """Seconds the charts draw: the range, or since the team's first data when that is younger."""
        if self.first is None:
            return self.span
        return min(self.span, max(self.end - self.first, MIN_WINDOW))

    @property
    def step(self):
        return next((step for step in STEPS if self.window / step <= MAX_POINTS), STEPS[-1])

    @property
    def period(self):
        return next(period for period in (DAY, HOUR, MINUTE) if self.step % period == 0)

    @property
    def end(self):
        return self.now if self.now is not None else time.time()

    @property
    def start(self):
        # Whole steps, so the first point is a full one and consecutive refreshes line up.
        return int((self.end - self.span) // self.step * self.step)

    @property
    def chart_start(self):
        """Where the charts' x axis begins (a whole step)."""
        return max(self.start, int((self.end - self.window) // self.step * self.step))

    def steps(self):
        """Every step start the charts draw, oldest first."""
        return list(range(self.chart_start, int(self.end) + 1, self.step))

    def as_params(self):
        params = {"range": self.range}
        for name in ("channel", "deployment", "key"):
            value = getattr(self, f"{name}_id")
            if value is not None:
                params[name] = value
        return params


def dashboard_query_parse(*, team, params):
    """The query a page asked for, checked: the range is one of RANGES, and channel/deployment/key are ids of this
    team's objects. Raises BadQuery with the reason."""
    allowed = {"range", "channel", "deployment", "key", "tab", "table"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise BadQuery(f"unknown parameter {unknown[0]!r}: use range, channel, deployment or key")
    value = params.get("range") or "24h"
    if value not in RANGES:
        raise BadQuery(f"range must be one of {', '.join(RANGES)}, not {value!r}")
    ids = {}
    for name, model in (("channel", Channel), ("deployment", Deployment), ("key", TeamKey)):
        raw = params.get(name, "")
        if raw == "":
            continue
        if not raw.isdigit():
            raise BadQuery(f"{name} must be the id of one of your team's {name}s, not {raw!r}")
        if not model.objects.filter(team=team, pk=int(raw)).exists():
            raise BadQuery(f"your team has no {name} with id {raw}")
        ids[f"{name}_id"] = int(raw)
    return DashboardQuery(team=team, range=value, now=time.time(), first=team_first_data(team), **ids)


def team_first_data(team):
    """Epoch seconds of the team's oldest usage minute or engine sample; None when it has neither."""
    first_usage = (UsageRollup.objects.filter(team=team, period=MINUTE).order_by("start")
                   .values_list("start", flat=True).first())
    first_sample = EngineSample.objects.filter(team=team).order_by("at").values_list("at", flat=True).first()
    found = [value for value in (first_usage, first_sample.timestamp() if first_sample else None) if value is not None]
    return min(found) if found else None


def _rollups(query, model=UsageRollup):
    rows = model.objects.filter(team=query.team, period=query.period, start__gte=query.start, start__lt=query.end)
    if query.channel_id is not None:
        rows = rows.filter(channel_id=query.channel_id)
    if query.deployment_id is not None:
        rows = rows.filter(deployment_id=query.deployment_id)
    if query.key_id is not None:
        rows = rows.filter(key_id=query.key_id)
    if query.key_ids is not None:
        rows = rows.filter(key_id__in=sorted(query.key_ids))
    if query.models is not None:
        rows = rows.filter(model__in=sorted(query.models))
    return rows.order_by()


def _sums(columns):
    return {f"s_{name}": Sum(name) for name in columns}


def _plain(row, columns):
    return {name: row[f"s_{name}"] or 0 for name in columns}


def usage_by_step(query, *, by=None, columns=COUNTS):
    """[{"t": step start (epoch s), by: value, counts...}] in time order."""
    group = ("t", by) if by else ("t",)
    rows = (_rollups(query).annotate(t=F("start") / query.step * query.step).values(*group)
            .annotate(**_sums(columns)).order_by("t"))
    return [{"t": row["t"], **({by: row[by]} if by else {}), **_plain(row, columns)} for row in rows]


def usage_grouped(query, *, by, columns=COUNTS):
    """Totals over the range per value of `by` (channel_id, key_id, model, deployment_id)."""
    rows = _rollups(query).values(*by).annotate(**_sums(columns))
    return [{**{name: row[name] for name in by}, **_plain(row, columns)} for row in rows]


def usage_by_tag(query, *, columns=TAG_COUNTS):
    """Totals over the range per tag, most cost first (TagRollup: a record with two tags counts under both)."""
    rows = _rollups(query, TagRollup).values("tag").annotate(**_sums(columns))
    found = [{"tag": row["tag"], **_plain(row, columns)} for row in rows]
    return sorted(found, key=lambda row: (-row["cost"], -row["requests"], row["tag"]))


def usage_totals(query, *, columns=COUNTS):
    row = _rollups(query).aggregate(**_sums(columns))
    return _plain(row, columns)


def percentile_from_buckets(counts, quantile, bounds=BUCKET_BOUNDS_MS):
    """A quantile from fixed-bucket counts, linear inside the bucket (as Prometheus' histogram_quantile); None when
    there is nothing. The open last bucket answers its lower bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = quantile * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(bounds):
                return float(bounds[-1])
            lower = bounds[index - 1] if index else 0.0
            return lower + (bounds[index] - lower) * (rank - seen) / count
        seen += count
    return float(bounds[-1])


def latency_by_step(query):
    """Gateway TTFT and end-to-end latency percentiles per step, from the summed bucket columns."""
    rows = usage_by_step(query, columns=("requests", "ttft_count") + TTFT_COLUMNS + LATENCY_COLUMNS)
    return [{"t": row["t"], "requests": row["requests"],
             "ttft": {q: percentile_from_buckets([row[c] for c in TTFT_COLUMNS], q) for q in QUANTILES},
             "latency": {q: percentile_from_buckets([row[c] for c in LATENCY_COLUMNS], q) for q in QUANTILES}}
            for row in rows]


def latency_by(query, *, by):
    rows = usage_grouped(query, by=by, columns=("requests", "ttft_count", "ttft_sum_ms", "latency_sum_ms")
                         + TTFT_COLUMNS + LATENCY_COLUMNS)
    for row in rows:
        row["ttft"] = {q: percentile_from_buckets([row[c] for c in TTFT_COLUMNS], q) for q in QUANTILES}
        row["latency"] = {q: percentile_from_buckets([row[c] for c in LATENCY_COLUMNS], q) for q in QUANTILES}
    return rows


# --- Engine samples


def engine_samples(query):
    """The samples in the query's range: of the deployment asked for, of the channel's deployment, of a vLLM pool
    asked for as its channel, or all of them (a deployment's rows and a pool's: `source` tells them apart)."""
    samples = EngineSample.objects.filter(team=query.team, at__gte=_aware(query.start), at__lt=_aware(query.end))
    deployment_id = query.deployment_id
    if query.channel_id is not None:
        channel = Channel.objects.filter(pk=query.channel_id).values("deployment_id", "kind").first() or {}
        if channel.get("kind") == ChannelKind.POOL:
            pool = samples.filter(channel_id=query.channel_id) if query.deployment_id is None else samples.none()
            return pool.order_by("at")
        deployment_id = channel.get("deployment_id")
        if deployment_id is None or (query.deployment_id not in (None, deployment_id)):
            return EngineSample.objects.none()
    if deployment_id is not None:
        samples = samples.filter(deployment_id=deployment_id)
    return samples.order_by("at")


def source(deployment_id, channel_id):
    """What an engine figure is of, as a key: ("deployment", id) or, for a vLLM pool, ("pool", its channel's id)."""
    return ("deployment", deployment_id) if deployment_id is not None else ("pool", channel_id)


def engine_by_step(query, *, histograms=True):
    """Per (step, source: a deployment or a vLLM pool): prefix-cache queries and hits, tokens, mean KV cache usage
    and queue, gaps (failed scrapes) and, with `histograms`, the merged TTFT and inter-token histograms. Without them
    the JSON histograms are not read (decoding their JSON is most of the cost)."""
    steps = {}
    fields = ("deployment_id", "channel_id", "at", "ok", "gaps", "prefix_queries", "prefix_hits", "prompt_tokens",
              "generation_tokens", "kv_cache_usage", "running", "waiting", "preemptions") + (
        ("ttft", "itl") if histograms else ())
    for row in engine_samples(query).values_list(*fields).iterator(chunk_size=5000):
        (deployment_id, channel_id, at, ok, gaps, queries, hits, prompt, generation, kv, running, waiting,
         preemptions) = row[:13]
        ttft, itl = row[13:] if histograms else (None, None)
        t = int(at.timestamp() // query.step * query.step)
        key = (t, source(deployment_id, channel_id))
        step = steps.get(key)
        if step is None:
            step = steps[key] = {
                "t": t, "source": key[1], "deployment_id": deployment_id, "prefix_queries": 0.0, "prefix_hits": 0.0,
                "prompt_tokens": 0.0, "generation_tokens": 0.0, "kv": [], "running": [], "waiting": [],
                "ttft": {}, "itl": {}, "gaps": 0, "samples": 0, "preemptions": 0.0, "kv_max": None}
        step["samples"] += 1
        step["gaps"] += gaps
        if not ok:
            continue
        step["prefix_queries"] += queries
        step["prefix_hits"] += hits
        step["prompt_tokens"] += prompt
        step["generation_tokens"] += generation
        step["preemptions"] += preemptions
        if kv is not None:
            step["kv_max"] = kv if step["kv_max"] is None else max(step["kv_max"], kv)
        for name, value in (("kv", kv), ("running", running), ("waiting", waiting)):
            if value is not None:
                step[name].append(value)
        for name, histogram in (("ttft", ttft), ("itl", itl)):
            merge_histogram(step[name], histogram)
    result = sorted(steps.values(), key=lambda step: (step["t"], step["source"]))
    for step in result:
        for name in ("kv", "running", "waiting"):
            values = step[name]
            step[name] = sum(values) / len(values) if values else None
        step["hit_rate"] = step["prefix_hits"] / step["prefix_queries"] if step["prefix_queries"] else None
    return result


def merge_histogram(into, histogram):
    """Adds a stored histogram delta ({"le": {bound: cumulative count}, "count", "sum"}) into `into`."""
    if not histogram:
        return into
    buckets = into.setdefault("le", {})
    for bound, count in histogram.get("le", {}).items():
        buckets[bound] = buckets.get(bound, 0) + count
    into["count"] = into.get("count", 0) + histogram.get("count", 0)
    into["sum"] = into.get("sum", 0) + histogram.get("sum", 0)
    return into


def engine_percentile(histogram, quantile):
    """A quantile (seconds) from a Prometheus-style histogram with cumulative `le` buckets; None when empty."""
    buckets = sorted(((float(bound), count) for bound, count in histogram.get("le", {}).items()),
                     key=lambda pair: pair[0])
    total = histogram.get("count") or (buckets[-1][1] if buckets else 0)
    if not total:
        return None
    rank = quantile * total
    lower, below = 0.0, 0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1)
        lower, below = bound, cumulative
    return lower


def engine_by_deployment(query, *, steps=None):
    """Totals per source (a deployment or a vLLM pool) over the range, with merged histograms (from `steps`,
    engine_by_step's answer, when the caller has it already)."""
    totals = {}
    for step in engine_by_step(query) if steps is None else steps:
        total = totals.setdefault(step["source"], {
            "source": step["source"], "deployment_id": step["deployment_id"], "prefix_queries": 0.0,
            "prefix_hits": 0.0, "prompt_tokens": 0.0,
            "generation_tokens": 0.0, "ttft": {}, "itl": {}, "gaps": 0, "samples": 0, "kv": [], "last_kv": None,
            "preemptions": 0.0, "kv_max": None})
        for name in ("prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens", "gaps", "samples",
                     "preemptions"):
            total[name] += step[name]
        if step["kv_max"] is not None:
            total["kv_max"] = max(total["kv_max"] or 0.0, step["kv_max"])
        merge_histogram(total["ttft"], step["ttft"])
        merge_histogram(total["itl"], step["itl"])
        if step["kv"] is not None:
            total["kv"].append(step["kv"])
            total["last_kv"] = step["kv"]
    for total in totals.values():
        total["hit_rate"] = total["prefix_hits"] / total["prefix_queries"] if total["prefix_queries"] else None
        total["kv"] = sum(total["kv"]) / len(total["kv"]) if total["kv"] else None
    return list(totals.values())


def scrape_gaps(query, *, limit=20):
    return list(engine_samples(query).filter(gaps__gt=0).order_by("-at")[:limit])


def _aware(seconds):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, tz=timezone.utc)
