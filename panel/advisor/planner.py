"""The break-even planner: for each deployment up in the last 7 or 30 days, what its GPU hours cost and how many of
them were idle, what the same tokens would have cost at the cloud channel's prices, the load at which local wins,
and what it would have cost to let it sleep after N idle minutes (or to send everything to the cloud), from the
minute rollups of its traffic.

Sleeping after N idle minutes is simulated minute by minute: the deployment is awake from a minute with requests
until N minutes after the last one, and each wake costs its start-up time (the deployment's own, from its last start)
in GPU time, while the requests of that first stretch go to the cloud at the cloud's prices. The cheapest choice is
named with what it would have saved against staying up."""
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from panel.channels.models import Channel
from panel.dashboards.cost import baseline_channel, deployment_up_hours
from panel.dashboards.models import MINUTE, UsageRollup
from panel.serving.models import Deployment

SLEEP_MINUTES = (5, 15, 30, 60, 120)
DAYS = (7, 30)
DEFAULT_WAKE_SECONDS = 60.0  # a deployment that never became ready: about a CPU engine's start here


@dataclass
class Choice:
    name: str  # "stay up", "sleep after 15 min", "all cloud"
    cost: float
    awake_hours: float | None = None
    wakes: int = 0


@dataclass
class PlanLine:
    deployment: Deployment
    name: str
    up_hours: float
    busy_hours: float  # minutes with at least one request, in hours
    tokens: int
    hourly: float | None  # None: the host has no GPU price
    cloud_cost: float | None  # the same tokens at the cloud channel's prices; None without a cloud channel
    wake_seconds: float
    choices: list = field(default_factory=list)

    @property
    def idle_hours(self):
        return max(self.up_hours - self.busy_hours, 0.0)

    @property
    def local_cost(self):
        return None if self.hourly is None else self.up_hours * self.hourly

    @property
    def break_even_tokens_per_hour(self):
        """The load (tokens per hour up) at which an hour of the GPU costs what its tokens would in the cloud."""
        if self.hourly is None or not self.cloud_cost or not self.tokens:
            return None
        return self.hourly / (self.cloud_cost / self.tokens)

    @property
    def tokens_per_hour(self):
        return self.tokens / self.up_hours if self.up_hours else 0.0

    @property
    def best(self):
        return min(self.choices, key=lambda choice: choice.cost) if self.choices else None

    @property
    def saving(self):
        """What the cheapest choice would have saved against staying up."""
        return None if self.best is None or self.local_cost is None else self.local_cost - self.best.cost


def deployment_plan(team, *, days=7, now=None):
    """A PlanLine per deployment of `team` that was up in the last `days` days, most idle first."""
    until = (now or datetime.now(timezone.utc).timestamp())
    since = until - days * 86400
    rows = list(UsageRollup.objects.filter(team=team, period=MINUTE, start__gte=since, start__lt=until, local=True,
                                           deployment__isnull=False)
                .values("deployment_id", "start", "channel_id", "prompt_tokens", "completion_tokens",
                        "cached_tokens", "cache_write_tokens", "requests"))
    cloud = baseline_channel(team, [], Channel.objects.filter(team=team).in_bulk())
    deployments = (Deployment.objects.filter(team=team, ready_at__isnull=False,
                                             ready_at__lt=datetime.fromtimestamp(until, tz=timezone.utc))
                   .exclude(finished_at__lt=datetime.fromtimestamp(since, tz=timezone.utc))
                   .select_related("host", "profile"))
    by_deployment = defaultdict(dict)  # deployment id -> {minute start: [tokens, cloud cost]}, in one pass
    for row in rows:
        if not row["requests"]:
            continue
        minute = by_deployment[row["deployment_id"]].setdefault(row["start"], [0, 0.0])
        minute[0] += row["prompt_tokens"] + row["completion_tokens"]
        if cloud is not None:
            minute[1] += float(cloud.cost(row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"],
                                          row["cache_write_tokens"]))
    lines = [_line(deployment, by_deployment.get(deployment.pk, {}), cloud, since=since, until=until)
             for deployment in deployments]
    return sorted(lines, key=lambda line: (-line.idle_hours, line.deployment.pk))


def _line(deployment, minutes, cloud, *, since, until):
    up_hours = deployment_up_hours(deployment, since=since, until=until)
    started = deployment.started_at or deployment.created_at
    # Its start-up time: ready minus started, unless it restarted since (started moves, ready_at does not).
    wake = (deployment.ready_at - started).total_seconds() if started and started < deployment.ready_at \
        else DEFAULT_WAKE_SECONDS
    line = PlanLine(deployment=deployment, name=str(deployment.profile.served_model_name or deployment),
                    up_hours=up_hours, busy_hours=len(minutes) / 60, tokens=sum(m[0] for m in minutes.values()),
                    hourly=deployment.hourly_price(),
                    cloud_cost=None if cloud is None else sum(m[1] for m in minutes.values()),
                    wake_seconds=max(wake, 0.0))
    if line.hourly is None:
        return line
    line.choices.append(Choice("stay up", line.local_cost, awake_hours=up_hours))
    if line.cloud_cost is None:
        return line
    line.choices.append(Choice("all cloud", line.cloud_cost, awake_hours=0.0))
    up_from = max(deployment.ready_at.timestamp(), since)
    up_until = min(deployment.finished_at.timestamp() if deployment.finished_at else until, until)
    for idle in SLEEP_MINUTES:
        line.choices.append(_sleeping(line, minutes, idle, up_from=up_from, up_until=up_until))
    return line


def _sleeping(line, minutes, idle_minutes, *, up_from, up_until):
    """The cost of sleeping after `idle_minutes` without a request: the awake stretches (from a minute with requests
    to `idle_minutes` after the last one), each wake's start-up time, and the cloud price of the requests of each
    stretch's first minute that arrive while it starts."""
    stretches = []  # [first minute, awake until]
    for start in sorted(minute for minute in minutes if up_from <= minute < up_until):
        end = min(start + MINUTE + idle_minutes * MINUTE, up_until)
        if stretches and start < stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], end)
        else:
            stretches.append([start, end])
    share = min(line.wake_seconds / MINUTE, 1.0)  # of a waking minute's requests, those the cloud serves
    seconds = sum(end - start + line.wake_seconds for start, end in stretches)
    spilled = sum(minutes[start][1] * share for start, _ in stretches)
    hours = seconds / 3600
    return Choice(f"sleep after {idle_minutes} min", hours * line.hourly + spilled, awake_hours=hours,
                  wakes=len(stretches))
