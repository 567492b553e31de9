"""Cost per million tokens, local against cloud, and the savings against an all-cloud baseline.

- Local: a deployment costs its host's GPU price per hour × its GPUs for every hour it was up within the range,
  whatever it served; per million tokens that is the hourly price divided by the tokens it actually served per
  hour. With a key filter, a deployment's cost is split by that key's share of its tokens.
- Cloud: what the gateway recorded for each request from the channel's prices.
- Baseline: the same tokens all sent to the cloud: local tokens priced at the prices of the team's cloud channel
  (the remote channel that carried the most tokens in the range, else the first enabled one).
- A vLLM pool (engines the panel did not start) is local too: its GPUs × its price per GPU-hour for every hour of
  the range since the channel was made.
- Monthly projection: the range's savings scaled to 30 days."""
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from panel.channels.models import Channel, ChannelKind
from panel.dashboards.selectors import DashboardQuery, usage_grouped
from panel.serving.models import Deployment

MONTH_SECONDS = 30 * 24 * 3600
TOKEN_COLUMNS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens",
                 "reasoning_tokens", "server_tool_calls", "cost")


@dataclass
class CostLine:
    """One channel's tokens and cost in the range."""

    name: str
    kind: str  # "local" or "remote"
    requests: int
    tokens: int
    cost: float | None  # None: a local channel whose host has no GPU price
    gpu_hours: float = 0.0
    asleep_hours: float = 0.0  # a local line's hours asleep in the range, not in gpu_hours (serving/sleep.py)
    hourly: float | None = None
    baseline: float | None = None  # these tokens at the cloud baseline's prices
    cached: int = 0  # prompt tokens read from the provider's cache (part of `tokens`)
    cache_writes: int = 0  # prompt tokens written to it (part of `tokens`)
    reasoning: int = 0  # completion tokens spent reasoning, where the upstream says (part of `tokens`)
    tool_calls: int = 0  # tool calls the provider ran and billed per call (their price is part of `cost`)
    deployment_id: int | None = None  # a local line's deployment

    @property
    def per_million(self):
        if self.cost is None or not self.tokens:
            return None
        return self.cost / self.tokens * 1_000_000


@dataclass
class CostSummary:
    lines: list = field(default_factory=list)
    baseline_channel: object = None
    missing_prices: list = field(default_factory=list)  # host names without a GPU price
    span_seconds: float = 0

    def _total(self, kind):
        return sum(line.cost or 0 for line in self.lines if line.kind == kind)

    def _tokens(self, kind):
        return sum(line.tokens for line in self.lines if line.kind == kind)

    @property
    def local_unknown(self):
        """A local channel whose host has no GPU price: its cost, and so every total and saving, is unknown (not
        zero, which would make local serving look free)."""
        return any(line.kind == "local" and line.cost is None for line in self.lines)

    @property
    def local_cost(self):
        return None if self.local_unknown else self._total("local")

    @property
    def cloud_cost(self):
        return self._total("remote")

    @property
    def local_tokens(self):
        return self._tokens("local")

    @property
    def cloud_tokens(self):
        return self._tokens("remote")

    @property
    def actual(self):
        return None if self.local_cost is None else self.local_cost + self.cloud_cost

    @property
    def all_cloud(self):
        """The same tokens with every local one priced at the baseline channel; None without a baseline."""
        if self.baseline_channel is None:
            return None
        return self.cloud_cost + sum(line.baseline or 0 for line in self.lines if line.kind == "local")

    @property
    def savings(self):
        return None if self.all_cloud is None or self.actual is None else self.all_cloud - self.actual

    @property
    def savings_share(self):
        return self.savings / self.all_cloud if self.all_cloud and self.savings is not None else None

    @property
    def monthly_savings(self):
        if self.savings is None or not self.span_seconds:
            return None
        return self.savings * MONTH_SECONDS / self.span_seconds

    @property
    def monthly_cost(self):
        return self.actual * MONTH_SECONDS / self.span_seconds if self.span_seconds and self.actual is not None \
            else None

    @property
    def cloud_per_million(self):
        """Cloud cost per million tokens: what the cloud channels charged, or, with no cloud traffic in the range,
        what the baseline channel would charge for the local tokens."""
        if self.cloud_tokens:
            return self.per_million("remote")
        local = [line.baseline for line in self.lines if line.kind == "local" and line.baseline is not None]
        return sum(local) / self.local_tokens * 1_000_000 if local and self.local_tokens else None

    @property
    def break_even_tokens_per_hour(self):
        """The local load at which a GPU hour costs what its tokens would at the cloud baseline: below it the
        local deployment is the dearer one. None without local traffic, a price or a baseline."""
        priced = [line for line in self.lines if line.kind == "local" and line.hourly and line.baseline and line.tokens]
        if not priced:
            return None
        hourly = sum(line.hourly for line in priced) / len(priced)
        baseline_per_token = sum(line.baseline for line in priced) / sum(line.tokens for line in priced)
        return hourly / baseline_per_token

    def per_million(self, kind):
        if kind == "local" and self.local_unknown:
            return None
        tokens = self._tokens(kind)
        return self._total(kind) / tokens * 1_000_000 if tokens else None


def cost_summary(query: DashboardQuery):
    """The Cost page's numbers for one query."""
    rows = usage_grouped(query, by=("channel_id", "deployment_id", "local"), columns=TOKEN_COLUMNS)
    channels = Channel.objects.filter(team=query.team).in_bulk()
    summary = CostSummary(span_seconds=query.end - query.start)
    summary.baseline_channel = baseline_channel(query.team, rows, channels)
    deployments = Deployment.objects.filter(pk__in={row["deployment_id"] for row in rows if row["local"]}) \
        .select_related("host").in_bulk()
    unfiltered = _deployment_tokens(query) if query.key_id is not None else {}
    for row in rows:
        if row["channel_id"] is None:
            continue  # refused before any channel was picked: no tokens, no cost, and no channel to list
        tokens = row["prompt_tokens"] + row["completion_tokens"]
        channel = channels.get(row["channel_id"])
        name = channel.name if channel else "(deleted channel)"
        cache = {"cached": row["cached_tokens"], "cache_writes": row["cache_write_tokens"],
                 "reasoning": row["reasoning_tokens"], "tool_calls": row["server_tool_calls"]}
        if channel is not None and channel.kind == ChannelKind.POOL:
            share = tokens / unfiltered[("pool", channel.pk)] if unfiltered.get(("pool", channel.pk)) else 1.0
            summary.lines.append(_pool_line(query, channel, summary, requests=row["requests"], tokens=tokens,
                                            share=share, row=row, **cache))
            continue
        if not row["local"]:
            summary.lines.append(CostLine(name=name, kind="remote", requests=row["requests"], tokens=tokens,
                                          cost=float(row["cost"]), **cache))
            continue
        line = CostLine(name=name, kind="local", requests=row["requests"], tokens=tokens, cost=None,
                        deployment_id=row["deployment_id"], **cache)
        deployment = deployments.get(row["deployment_id"])
        if deployment is not None:
            line.gpu_hours = deployment_up_hours(deployment, since=query.start, until=query.end)
            line.asleep_hours = deployment_asleep_hours(deployment, since=query.start, until=query.end)
            line.hourly = deployment.hourly_price()
            if line.hourly is None:
                summary.missing_prices.append(deployment.host.host if deployment.host else str(deployment))
            else:
                share = tokens / unfiltered[deployment.pk] if unfiltered.get(deployment.pk) else 1.0
                line.cost = line.gpu_hours * line.hourly * share
        if summary.baseline_channel is not None:
            line.baseline = float(summary.baseline_channel.cost(row["prompt_tokens"], row["completion_tokens"],
                                                                row["cached_tokens"], row["cache_write_tokens"]))
        summary.lines.append(line)
    if query.key_id is None:  # a key has no share of a GPU it sent nothing to
        summary.lines += _idle_lines(query, served={row["deployment_id"] for row in rows if row["local"]},
                                     channels=channels, summary=summary)
        served = {row["channel_id"] for row in rows}
        idle = [pool for pool in channels.values() if pool.kind == ChannelKind.POOL and pool.pk not in served
                and query.channel_id in (None, pool.pk) and query.deployment_id is None]
        summary.lines += [_pool_line(query, pool, summary, requests=0, tokens=0, share=1.0, row=None, idle=True)
                          for pool in idle if pool.created_at.timestamp() < query.end]
    summary.lines.sort(key=lambda line: (line.kind, -line.tokens))
    return summary


def _idle_lines(query, *, served, channels, summary):
    """A local line for each deployment that was up in the range and served nothing: its GPU hours cost the same
    (a priced host's idle deployment is not free), with no tokens to spread them over."""
    since = datetime.fromtimestamp(query.start, tz=timezone.utc)
    until = datetime.fromtimestamp(query.end, tz=timezone.utc)
    idle = (Deployment.objects.filter(team=query.team, ready_at__isnull=False, ready_at__lt=until)
            .exclude(finished_at__lt=since).exclude(pk__in=served).select_related("host", "profile"))
    if query.deployment_id is not None:
        idle = idle.filter(pk=query.deployment_id)
    if query.channel_id is not None:
        channel = channels.get(query.channel_id)
        idle = idle.filter(pk=channel.deployment_id if channel is not None and channel.deployment_id else -1)
    named = {channel.deployment_id: channel.name for channel in channels.values() if channel.deployment_id}
    lines = []
    for deployment in idle:
        hours = deployment_up_hours(deployment, since=query.start, until=query.end)
        if not hours:
            continue
        hourly = deployment.hourly_price()
        if hourly is None:
            summary.missing_prices.append(deployment.host.host if deployment.host else str(deployment))
        name = f"{named.get(deployment.pk, f'deployment #{deployment.pk}')} (idle)"
        lines.append(CostLine(name=name, kind="local", requests=0, tokens=0, gpu_hours=hours, hourly=hourly,
                              asleep_hours=deployment_asleep_hours(deployment, since=query.start, until=query.end),
                              cost=None if hourly is None else hours * hourly, deployment_id=deployment.pk,
                              baseline=0.0 if summary.baseline_channel is not None else None))
    return lines


def _pool_line(query, pool, summary, *, requests, tokens, share, row, idle=False, **cache):
    """A vLLM pool's line: its GPUs × its price per GPU-hour over the hours of the range since it was made, this
    query's share of it (by tokens, with a key filter)."""
    hours = max(min(query.end, time.time()) - max(query.start, pool.created_at.timestamp()), 0) / 3600
    hourly = pool.gpu_hourly_price()
    if hourly is None and hours:
        summary.missing_prices.append(f"the vLLM pool {pool.name} (its channel's price per GPU-hour)")
    line = CostLine(name=f"{pool.name} (idle)" if idle else pool.name, kind="local", requests=requests,
                    tokens=tokens, gpu_hours=hours, hourly=hourly,
                    cost=None if hourly is None else hours * hourly * share, **cache)
    if summary.baseline_channel is not None:
        line.baseline = 0.0 if row is None else float(summary.baseline_channel.cost(
            row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"], row["cache_write_tokens"]))
    return line


def _lifetime(deployment, since, until):
    """[began, ended] of the deployment's life (first ready until finished, or now) within [since, until]."""
    if deployment.ready_at is None:
        return None
    began = max(deployment.ready_at.timestamp(), since)
    ended = min(deployment.finished_at.timestamp() if deployment.finished_at else until, until)
    return (began, ended) if ended > began else None


def deployment_up_hours(deployment, *, since, until):
    """Hours the deployment was up (ready until finished, or now) within [since, until] (epoch seconds), less the
    time it slept (serving/sleep.py: its engine stopped, its GPU free)."""
    life = _lifetime(deployment, since, until)
    if life is None:
        return 0.0
    return max(life[1] - life[0] - deployment.nap_seconds(since=life[0], until=life[1]), 0) / 3600


def deployment_asleep_hours(deployment, *, since, until):
    life = _lifetime(deployment, since, until)
    return deployment.nap_seconds(since=life[0], until=life[1]) / 3600 if life is not None else 0.0


def baseline_channel(team, rows, channels):
    """The cloud channel that local traffic is priced against: the remote channel that carried the most tokens in
    the range, else the team's first enabled remote one. A vLLM pool is self-hosted GPUs, never the baseline."""
    carried = {}
    for row in rows:
        channel = channels.get(row["channel_id"])
        if channel is not None and channel.kind == ChannelKind.REMOTE:
            tokens = row["prompt_tokens"] + row["completion_tokens"]
            carried[row["channel_id"]] = carried.get(row["channel_id"], 0) + tokens
    if carried:
        return channels[max(carried, key=carried.get)]
    remote = [channel for channel in channels.values() if channel.kind == "remote" and channel.enabled]
    return min(remote, key=lambda channel: (channel.priority, channel.name)) if remote else None


def _deployment_tokens(query):
    """Every key's tokens per deployment in the range (the denominator of a key's share of the GPU cost)."""
    whole = DashboardQuery(team=query.team, range=query.range, channel_id=query.channel_id,
                           deployment_id=query.deployment_id, now=query.end, first=query.first)
    tokens = {}
    for row in usage_grouped(whole, by=("deployment_id", "channel_id"), columns=("prompt_tokens", "completion_tokens")):
        # by deployment, and by channel for a vLLM pool's rows (which have no deployment)
        key = row["deployment_id"] if row["deployment_id"] is not None else ("pool", row["channel_id"])
        tokens[key] = tokens.get(key, 0) + row["prompt_tokens"] + row["completion_tokens"]
    return tokens

