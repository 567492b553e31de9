"""What each dashboard tab shows: its figures, its tables (every table also exports as CSV) and its headline
numbers, for one query. Views render this; the JSON endpoint returns it for live refresh."""
from dataclasses import dataclass, field

from django.urls import reverse

from panel.accounts.models import TeamKey
from panel.channels.models import Channel, ChannelKind
from panel.core.money import money, money_text
from panel.dashboards import figures as fig
from panel.dashboards.agents import agents as agents_page
from panel.dashboards.cache_causes import causes_table
from panel.dashboards.cost import cost_summary
from panel.dashboards.ledger import TOLERANCE_PERCENT, deployment_ledger
from panel.dashboards.models import (
    LATENCY_COLUMNS,
    TTFT_COLUMNS,
    EngineSample,
    UsageRollup,
)
from panel.dashboards.requests import failures_table, hit_rate_tables
from panel.dashboards.selectors import (
    QUANTILES,
    engine_by_deployment,
    engine_by_step,
    engine_percentile,
    latency_by,
    latency_by_step,
    percentile_from_buckets,
    scrape_gaps,
    source,
    usage_by_step,
    usage_by_tag,
    usage_grouped,
    usage_totals,
)
from panel.dashboards.tables import Table
from panel.serving.models import Deployment

TABS = {"overview": "Overview", "latency": "Latency", "cache": "Cache", "cost": "Cost", "agents": "Agents"}
TOP = 10


@dataclass
class Page:
    figures: dict = field(default_factory=dict)
    tables: list = field(default_factory=list)
    cards: list = field(default_factory=list)  # (label, value, hint)

    def table(self, name):
        return next((table for table in self.tables if table.name == name), None)


def team_has_data(team):
    return UsageRollup.objects.filter(team=team).exists() or EngineSample.objects.filter(team=team).exists()


def dashboard_page(*, tab, query):
    """The figures, tables and cards of one tab for one query."""
    if tab == "agents":
        return agents_page(query, page=Page, table=Table)
    return {"overview": overview, "latency": latency, "cache": cache, "cost": cost}[tab](query)


def _names(query):
    channels = dict(Channel.objects.filter(team=query.team).values_list("pk", "name"))
    keys = {key.pk: str(key) for key in TeamKey.objects.filter(team=query.team)}
    # The engines' figures are by source: a deployment, or a vLLM pool (selectors.source).
    engines = {("deployment", d.pk): f"{d.served_model_name or d.profile.name} #{d.pk}"
               for d in Deployment.objects.filter(team=query.team).select_related("profile")}
    engines.update({("pool", pk): f"pool {name}" for pk, name in Channel.objects.filter(
        team=query.team, kind=ChannelKind.POOL).values_list("pk", "name")})
    return channels, keys, engines


def _window(query):
    return (query.chart_start, query.end)


def _rate(part, whole):
    return round(100 * part / whole, 2) if whole else None


def _per_minute(value, query, t):
    # The last step is still running: divide by the part of it that has passed, or it would always dip.
    elapsed = min(query.step, max(query.end - t, 1))
    return round(value * 60 / elapsed, 2)


def _ms(value):
    return None if value is None else round(value, 1)


def _money(value):
    return money(value)


def channel_label(channels, pk):
    """A channel's name in a table or legend; requests refused before any channel was picked have none."""
    if pk is None:
        return "(none: refused before a channel)"
    return channels.get(pk, "(deleted channel)")


def server_errors(row):
    """Errors that are not the clients' own refusals (4xx): what the error rate counts."""
    return row["errors"] - (row.get("refused") or 0)


def overview(query):
    channels, keys, _ = _names(query)
    page = Page()
    rows = usage_by_step(query, by="channel_id", columns=("requests", "prompt_tokens", "completion_tokens"))
    name = lambda pk: channel_label(channels, pk)  # noqa: E731
    series = fig.filled(fig.by_series(
        rows, "channel_id", lambda row: _per_minute(row["requests"], query, row["t"]), name), query.steps())
    page.figures["requests"] = fig.figure("Requests per minute by channel", [
        fig.line(label, xs, ys, i) for i, (label, (xs, ys)) in enumerate(sorted(series.items()))],
        y_title="requests / min", x_range=_window(query))
    series = fig.filled(fig.by_series(rows, "channel_id", lambda row: _per_minute(
        row["prompt_tokens"] + row["completion_tokens"], query, row["t"]), name), query.steps())
    page.figures["tokens"] = fig.figure("Tokens per minute by channel", [
        fig.line(label, xs, ys, i) for i, (label, (xs, ys)) in enumerate(sorted(series.items()))],
        y_title="tokens / min", x_range=_window(query))
    steps = usage_by_step(query, columns=("requests", "errors", "refused", "fallbacks"))
    xs = [row["t"] for row in steps]
    page.figures["errors"] = fig.figure("Error, refusal and fallback rate", [
        fig.line("errors", xs, [_rate(server_errors(row), row["requests"]) for row in steps], 5),
        fig.line("refused (the clients' own 4xx)", xs, [_rate(row["refused"], row["requests"]) for row in steps], 7),
        fig.line("fallbacks", xs, [_rate(row["fallbacks"], row["requests"]) for row in steps], 2)],
        y_title="% of requests", y_percent=True, x_range=_window(query))
    totals = usage_totals(query)
    page.cards = [("Requests", f"{totals['requests']:,}", f"last {query.range}"),
                  ("Tokens", f"{totals['prompt_tokens'] + totals['completion_tokens']:,}",
                   f"{totals['cached_tokens']:,} prompt tokens from cache"),
                  ("Error rate", _percent(_rate(server_errors(totals), totals["requests"])),
                   f"{totals['fallbacks']:,} fallbacks; {totals['refused']:,} refused (the clients' own 4xx: "
                   "unknown model, bad key, spent budget), not counted as errors"),
                  ("Cost recorded", money_text(totals["cost"]),
                   "cloud prices, and local requests' share of GPU cost")]
    columns = ["requests", "errors", "refused", "fallbacks", "prompt tokens", "completion tokens", "cached tokens",
               "cache writes", "reasoning tokens", "cost"]

    def counts(row):
        return [row["requests"], server_errors(row), row["refused"], row["fallbacks"], row["prompt_tokens"],
                row["completion_tokens"], row["cached_tokens"], row["cache_write_tokens"], row["reasoning_tokens"],
                _money(row["cost"])]

    grouped = sorted(usage_grouped(query, by=("channel_id",)), key=lambda row: -row["requests"])
    page.tables.append(Table("channels", "By channel", ["channel"] + columns,
                             [[name(row["channel_id"])] + counts(row) for row in grouped]))
    grouped = sorted(usage_grouped(query, by=("key_id",)), key=lambda row: -row["requests"])[:TOP]
    page.tables.append(Table("keys", f"Top {TOP} keys", ["key"] + columns,
                             [[keys.get(row["key_id"], "(deleted key)")] + counts(row) for row in grouped]))
    grouped = sorted(usage_grouped(query, by=("model",)), key=lambda row: -row["requests"])[:TOP]
    page.tables.append(Table("models", f"Top {TOP} models", ["model"] + columns,
                             [[row["model"]] + counts(row) for row in grouped]))

    page.tables.append(failures_table(query, channels))
    return page


def latency(query):
    channels, _, deployments = _names(query)
    page = Page()
    steps = latency_by_step(query)
    engine = engine_by_step(query)
    xs = [row["t"] for row in steps]
    traces = [fig.line(f"gateway p{int(q * 100)}", xs, [_ms(row["ttft"][q]) for row in steps], i)
              for i, q in enumerate(QUANTILES)]
    for i, (label, (exs, eys)) in enumerate(sorted(_engine_series(engine, "ttft", 0.95, deployments).items())):
        traces.append(fig.line(f"engine p95 · {label}", exs, eys, 3 + i, dash="dot", connect=True))
    page.figures["ttft"] = fig.figure("Time to first token (ms): gateway and engine", traces, y_title="ms",
                                      x_range=_window(query))
    traces = []
    for q_index, q in enumerate(QUANTILES):
        for label, (exs, eys) in sorted(_engine_series(engine, "itl", q, deployments).items()):
            traces.append(fig.line(f"p{int(q * 100)} · {label}", exs, eys, q_index, connect=True))
    page.figures["itl"] = fig.figure("Inter-token latency (ms, engine)", traces, y_title="ms", x_range=_window(query),
                                     empty="No engine samples in this range: the scraper reads ready deployments "
                                           "and vLLM pools")
    queue = {}
    for row in engine:
        if row["waiting"] is not None:
            xs, ys = queue.setdefault(deployments.get(row["source"], "?"), ([], []))
            xs.append(row["t"])
            ys.append(round(row["waiting"], 2))
    page.figures["queue"] = fig.figure("Requests waiting in the engine's queue (engine, mean per step)", [
        fig.line(label, xs, ys, i, connect=True) for i, (label, (xs, ys)) in enumerate(sorted(queue.items()))],
        y_title="requests", x_range=_window(query), empty="No engine samples in this range")
    page.figures["latency"] = fig.figure("End-to-end latency (ms, gateway)", [
        fig.line(f"p{int(q * 100)}", xs, [_ms(row["latency"][q]) for row in steps], i)
        for i, q in enumerate(QUANTILES)], y_title="ms", x_range=_window(query))
    rows = sorted(latency_by(query, by=("channel_id",)), key=lambda row: -row["requests"])
    page.tables.append(Table("latency", "Gateway latency by channel (ms)", [
        "channel", "requests", "with TTFT", "TTFT p50", "TTFT p95", "TTFT p99", "latency p50", "latency p95",
        "latency p99"], [[channel_label(channels, row["channel_id"]), row["requests"], row["ttft_count"]]
                         + [_ms(row["ttft"][q]) for q in QUANTILES] + [_ms(row["latency"][q]) for q in QUANTILES]
                         for row in rows]))
    totals = engine_by_deployment(query, steps=engine)
    page.tables.append(Table("engine_latency",
                             "Engine latency by deployment or vLLM pool (ms, from vLLM's histograms)", [
        "deployment", "requests (TTFT samples)", "TTFT p50", "TTFT p95", "TTFT p99", "ITL p50", "ITL p95",
        "ITL p99"], [[deployments.get(row["source"], "?"), int(row["ttft"].get("count", 0))]
                     + [_seconds_ms(engine_percentile(row["ttft"], q)) for q in QUANTILES]
                     + [_seconds_ms(engine_percentile(row["itl"], q)) for q in QUANTILES] for row in totals]))
    total = usage_totals(query, columns=("ttft_count",) + TTFT_COLUMNS + LATENCY_COLUMNS)
    ttft = [total[column] for column in TTFT_COLUMNS]
    latencies = [total[column] for column in LATENCY_COLUMNS]
    page.cards = [("TTFT p50", _fmt_ms(percentile_from_buckets(ttft, 0.5)), "gateway, all requests"),
                  ("TTFT p95", _fmt_ms(percentile_from_buckets(ttft, 0.95)),
                   f"{total['ttft_count']:,} requests with a first token"),
                  ("Latency p95", _fmt_ms(percentile_from_buckets(latencies, 0.95)), "end to end")]
    return page


def cache(query):
    channels, keys, deployments = _names(query)
    page = Page()
    engine = engine_by_step(query, histograms=False)
    series = {}
    kv = {}
    for row in engine:
        label = deployments.get(row["source"], "?")
        if row["hit_rate"] is not None:
            xs, ys = series.setdefault(label, ([], []))
            xs.append(row["t"])
            ys.append(round(100 * row["hit_rate"], 2))
        if row["kv"] is not None:
            xs, ys = kv.setdefault(label, ([], []))
            xs.append(row["t"])
            ys.append(round(100 * row["kv"], 2))
    page.figures["hit_rate"] = fig.figure("Prefix cache hit rate by deployment or vLLM pool (engine)", [
        fig.line(label, xs, ys, i, connect=True) for i, (label, (xs, ys)) in enumerate(sorted(series.items()))],
        y_title="% of prompt tokens", y_percent=True, x_range=_window(query),
        empty="No prefix-cache lookups in this range (the scraper reads ready deployments every few seconds)")
    page.figures["kv"] = fig.figure("KV cache usage by deployment or vLLM pool (engine)", [
        fig.line(label, xs, ys, i, connect=True) for i, (label, (xs, ys)) in enumerate(sorted(kv.items()))],
        y_title="% of KV cache", y_percent=True, empty="No engine samples in this range", x_range=_window(query))
    steps = usage_by_step(query, columns=("prompt_tokens", "cached_tokens"))
    page.figures["cached_share"] = fig.figure("Share of prompt tokens served from cache (gateway usage)", [
        fig.line("cached share", [row["t"] for row in steps],
                 [_rate(row["cached_tokens"], row["prompt_tokens"]) for row in steps], 1)],
        y_title="% of prompt tokens", y_percent=True, x_range=_window(query))
    totals = engine_by_deployment(query, steps=engine)
    page.tables.append(Table("cache", "Prefix cache by deployment or vLLM pool (engine)", [
        "deployment", "prefix queries (tokens)", "prefix hits (tokens)", "hit rate %", "mean KV usage %",
        "last KV usage %", "scrapes", "gaps"],
        [[deployments.get(row["source"], "?"), int(row["prefix_queries"]), int(row["prefix_hits"]),
          _rate(row["prefix_hits"], row["prefix_queries"]), _pct(row["kv"]), _pct(row["last_kv"]), row["samples"],
          row["gaps"]] for row in totals]))
    page.tables.append(causes_table(query, totals, deployments))
    rows = sorted(usage_grouped(query, by=("channel_id",), columns=("prompt_tokens", "cached_tokens")),
                  key=lambda row: -row["prompt_tokens"])
    page.tables.append(Table("cached_tokens", "Cached prompt tokens by channel (gateway usage)", [
        "channel", "prompt tokens", "cached tokens", "cached %"],
        [[channel_label(channels, row["channel_id"]), row["prompt_tokens"], row["cached_tokens"],
          _rate(row["cached_tokens"], row["prompt_tokens"])] for row in rows]))

    page.tables.extend(hit_rate_tables(query, channels, keys))
    page.tables.append(Table("gaps", "Recent scrape gaps", ["at (UTC)", "deployment", "warning"],
                             [[sample.at.strftime("%Y-%m-%d %H:%M:%S"), deployments.get(source(sample.deployment_id,
                                                                                           sample.channel_id), "?"),
                               sample.warning] for sample in scrape_gaps(query)],
                             note="A gap is a scrape that failed: /metrics down, slow or not Prometheus text."))
    queries = sum(row["prefix_queries"] for row in totals)
    hits = sum(row["prefix_hits"] for row in totals)
    prompt = sum(row["prompt_tokens"] for row in rows)
    cached = sum(row["cached_tokens"] for row in rows)
    page.cards = [("Prefix hit rate", _percent(_rate(hits, queries)), f"{int(hits):,} of {int(queries):,} tokens"),
                  ("Cached prompt tokens", _percent(_rate(cached, prompt)), "as the gateway's usage reports them"),
                  ("Scrape gaps", f"{sum(row['gaps'] for row in totals):,}", f"last {query.range}")]
    return page


def cost(query):
    page = Page()
    summary = cost_summary(query)
    lines = summary.lines
    unpriced = ", ".join(sorted(set(summary.missing_prices)))
    local = [line for line in lines if line.kind == "local" and line.per_million is not None]
    remote = [line for line in lines if line.kind == "remote"]
    page.figures["per_million"] = fig.figure("Cost per million tokens by channel", [
        fig.bars("local (GPU hours)", [line.name for line in local], [_money(line.per_million) for line in local], 1,
                 text=[_fmt_money(line.per_million) for line in local]),
        fig.bars("cloud (channel prices)", [line.name for line in remote],
                 [_money(line.per_million) for line in remote], 0,
                 text=[_fmt_money(line.per_million) for line in remote])],
        y_title="cost / 1M tokens", y_money=True)
    shown = [(label, value) for label, value in (("actual", summary.actual), ("all cloud", summary.all_cloud))
             if value is not None]
    page.figures["savings"] = fig.figure(f"This range ({query.range}): actual cost against all-cloud", [
        fig.bars("cost", [label for label, _ in shown], [_money(value) for _, value in shown], 0,
                 text=[_fmt_money(value) for _, value in shown])],
        y_title="cost", y_money=True, empty="No traffic in this range")
    if summary.local_unknown:
        page.figures["savings"]["layout"]["title"]["text"] = f"All-cloud cost ({query.range}); actual unknown"
    # "hours asleep" only where a deployment slept in the range (serving/sleep.py): the table stays narrow otherwise.
    slept = any(line.asleep_hours for line in lines)
    page.tables.append(Table("cost", "Cost by channel", [
        "channel", "kind", "requests", "tokens", "cached prompt tokens", "cache writes", "reasoning tokens",
        "provider tool calls", "GPU hours", *(["hours asleep"] if slept else []), "price per hour", "cost",
        "cost / 1M tokens", "same tokens at the cloud baseline"],
        [[line.name, line.kind, line.requests, line.tokens, line.cached, line.cache_writes, line.reasoning,
          line.tool_calls,
          round(line.gpu_hours, 3) if line.kind == "local" else "",
          *([round(line.asleep_hours, 3) if line.kind == "local" else ""] if slept else []),
          _money(line.hourly) if line.hourly is not None else ("unknown" if line.kind == "local" else ""),
          _money(line.cost) if line.cost is not None else "unknown",
          _money(line.per_million) if line.cost is not None or line.kind == "remote" else "unknown",
          _money(line.baseline) if line.kind == "local" else ""] for line in lines],
        note=("Local cost: the host's GPU price per hour × GPUs × the hours the deployment was up in this range "
              "(hours asleep, its engine stopped after idle minutes, are not counted). "
              "Each request carries its minute's share of it, by tokens; idle minutes count here but are charged to no "
              "request. "
              + (f"No GPU price on: {unpriced}: its local cost is unknown until a price is set on the Workers "
                 "page, and no savings are computed." if unpriced else ""))))
    page.tables.append(tag_table(query))
    baseline = summary.baseline_channel
    unknown = "unknown until a GPU price is set" if summary.local_unknown else None
    page.tables.append(Table("savings", "Savings against an all-cloud baseline", ["what", "value"], [
        ["baseline channel", baseline.name if baseline else "none: add a cloud channel with prices"],
        ["local cost", _or(_money(summary.local_cost), unknown)], ["cloud cost", _money(summary.cloud_cost)],
        ["actual cost", _or(_money(summary.actual), unknown)], ["all-cloud cost", _money(summary.all_cloud)],
        ["savings", _or(_money(summary.savings), unknown)], ["savings %", _rate(summary.savings, summary.all_cloud)
                                                          if summary.savings is not None else unknown],
        ["monthly projection: cost", _or(_money(summary.monthly_cost), unknown)],
        ["monthly projection: savings", _or(_money(summary.monthly_savings), unknown)],
        ["local cost / 1M tokens", _or(_money(summary.per_million("local")), unknown)],
        ["break-even local load (tokens / hour)", _whole(summary.break_even_tokens_per_hour)],
        ["local load, average over this range (tokens / hour)",
         _whole(summary.local_tokens / (summary.span_seconds / 3600))
         if summary.span_seconds else None],
        ["cloud cost / 1M tokens", _money(summary.cloud_per_million)],
        *_spilled_rows(query)],
        note="Monthly projection: this range's numbers scaled to 30 days. Spilled: requests a route sent to its "
             "cloud channel because its local engine would have kept them waiting past the route's spill wait."))
    _, _, deployments = _names(query)
    page.tables.append(Table("ledger", "Ledger: each engine's own token counts against the usage rows", [
        "deployment", "engine tokens", "recorded tokens", "difference", "status"],
        [[deployments.get(line.source, "?"), int(line.engine_tokens),
          line.recorded_tokens, "" if line.difference_percent is None else f"{line.difference_percent:+.1f}%",
          line.words] for line in deployment_ledger(query)],
        note=f"Prompt and generation tokens over this range: the engine's from vLLM's own counters, the recorded "
             f"ones from the usage rows; within {TOLERANCE_PERCENT:g}% they agree. A cloud channel's provider is "
             f"checked the same way against its usage export.",
        link=("Compare a provider's usage export", reverse("statements"))))
    price_link = ("Set a GPU price", reverse("hosts")) if summary.local_unknown else None
    cloud_hint = "channel prices" if summary.cloud_tokens else (
        f"{baseline.name}'s prices for the local tokens" if baseline else "add a cloud channel with prices")
    savings = summary.savings
    page.cards = [
        ("Local / 1M tokens", "unknown" if summary.local_unknown else _fmt_money(summary.per_million("local")),
         f"until a GPU price is set for {unpriced}" if unpriced else "GPU hours ÷ tokens served", price_link),
        ("Cloud / 1M tokens", _fmt_money(summary.cloud_per_million), cloud_hint),
        ("Savings", _percent(_rate(savings, summary.all_cloud)) if savings is not None and summary.all_cloud
         else ("unknown" if summary.local_unknown else "—"),
         f"{_fmt_money(savings)} against all-cloud" if savings is not None else
         "not computed: the local cost is unknown" if summary.local_unknown else "no cloud baseline", price_link),
        ("Monthly projection", _fmt_money(summary.monthly_savings) if savings is not None else "unknown"
         if summary.local_unknown else "—", "savings at this range's rate")]
    return page


def _spilled_rows(query):
    totals = usage_totals(query, columns=("requests", "spilled", "spilled_cost"))
    if not totals["spilled"]:
        return [["spilled to the cloud (local engine busy)", "none"]]
    return [["spilled to the cloud (local engine busy)",
             f"{totals['spilled']:,} request{'s' if totals['spilled'] != 1 else ''} "
             f"({_percent(_rate(totals['spilled'], totals['requests']))} of all)"],
            ["spilled requests' cost", _money(totals["spilled_cost"])]]


def tag_table(query):
    """The Cost tab's spend per request tag."""
    return Table("tags", "Cost by tag", [
        "tag", "requests", "errors", "prompt tokens", "completion tokens", "cached prompt tokens", "cache writes",
        "reasoning tokens", "cost"],
        [[row["tag"], row["requests"], row["errors"], row["prompt_tokens"], row["completion_tokens"],
          row["cached_tokens"], row["cache_write_tokens"], row["reasoning_tokens"], _money(row["cost"])]
         for row in usage_by_tag(query)],
        note="Requests carry tags in the x-tokenwise-tags header or in metadata.tags. A request with two tags counts "
             "under both, so the rows do not add up to the team's total. Cost is what the requests were charged: "
             "a local request its minute's share of its deployment's GPU cost, once that is allocated.")


def _engine_series(steps, name, quantile, deployments):
    series = {}
    for row in steps:
        value = engine_percentile(row[name], quantile) if row[name] else None
        if value is None:
            continue
        xs, ys = series.setdefault(deployments.get(row["source"], "?"), ([], []))
        xs.append(row["t"])
        ys.append(_seconds_ms(value))
    return series


def _or(value, fallback):
    return fallback if value is None else value


def _whole(value):
    return None if value is None else int(round(value))


def _seconds_ms(value):
    return None if value is None else round(value * 1000, 1)


def _pct(value):
    return None if value is None else round(100 * value, 2)


def _percent(value):
    """12.5 %, 100 %, -6,253,378.67 % (never in exponent form)."""
    return "—" if value is None else f"{value:,.2f}".rstrip("0").rstrip(".") + " %"


def _fmt_ms(value):
    return "—" if not value else f"{value:,.0f} ms"


def _fmt_money(value):
    return money_text(value)
