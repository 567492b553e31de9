"""The break-even planner: for each deployment up in the last 7 or 30 days, its replicas together, what its GPU hours
cost and how many of them were idle, what the same tokens would have cost at the cloud channel's prices, the load at
which local wins, and what it would have cost to sleep after N idle minutes, to run between a fewest and a most
replicas, or to send everything to the cloud, from the minute rollups of its traffic.

Demand, per minute: the tokens its replicas served (the local minute rows of each replica) plus those its route
spilled to the cloud (the remote minute rows of the route's model that count spilled requests; such a row may hold
other requests too, fallbacks, so the spilled share of its requests is taken as their share of its tokens). The
route of a deployment is each route whose first local channel is one of its replicas'. A replica's capacity is the
busiest replica-minute of the window: the most tokens one replica served in one minute.

"As it ran" is what it really cost: its replicas' GPU hours at their hosts' prices and what its spilled requests cost
in the cloud. The other choices price the same demand at the price of a replica-hour and the cloud channel's prices:
- Sleeping after N idle minutes, one engine: awake from a minute with requests until N minutes after the last one;
  each wake costs its start-up time (the deployment's own, from its last start) in GPU time, the part of the waking
  minute's requests that arrives while it starts goes to the cloud, and so does any minute's demand beyond one
  replica's capacity.
- A replica range: ranges.py, with the scale policy's windows (the defaults without a policy).
- All cloud: every token of the demand at the cloud's prices.
The cheapest is named with what it would have saved against what it really cost. With the cheapest range comes the
spill wait that sends a request to the cloud when it would wait about one request's time: the mean time of the
deployment's requests (their latencies summed in the rollups, over their count)."""
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from panel.advisor.ranges import replica_ranges, slice_cost
from panel.channels.models import Channel, ChannelKind, RouteChannel
from panel.channels.services import SPILL_WAIT_LIMITS
from panel.dashboards.cost import baseline_channel, deployment_up_hours
from panel.dashboards.models import MINUTE, UsageRollup
from panel.serving.models import Deployment, ScalePolicy

SLEEP_MINUTES = (5, 15, 30, 60, 120)
DAYS = (7, 30)
DEFAULT_WAKE_SECONDS = 60.0  # a deployment that never became ready: about a CPU engine's start here
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens")


@dataclass
class Choice:
    name: str  # "as it ran", "sleep after 15 min", "1 to 3 replicas", "all cloud"
    cost: float
    awake_hours: float | None = None  # GPU hours (replica hours for a range)
    wakes: int = 0  # a sleeping engine's wakes; a range's replicas started by the scaler
    cloud_cost: float = 0.0  # the part of `cost` paid to the cloud
    low: int | None = None  # a range's fewest and most replicas
    high: int | None = None


@dataclass
class Traffic:
    """One deployment's traffic in the window, its replicas together."""

    served: dict = field(default_factory=lambda: defaultdict(dict))  # replica id -> {minute with requests: tokens}
    demand: dict = field(default_factory=dict)  # minute start -> [tokens, their cloud cost], served and spilled
    served_cloud: float = 0.0  # the served tokens at the cloud's prices
    spilled_tokens: int = 0
    spilled_cost: float = 0.0  # what its spilled requests cost, as recorded
    requests: int = 0
    latency_ms: float = 0.0  # its requests' latencies, summed

    def add(self, minute, tokens, cloud_cost):
        entry = self.demand.setdefault(minute, [0, 0.0])
        entry[0] += tokens
        entry[1] += cloud_cost


@dataclass
class PlanLine:
    deployment: Deployment  # the first replica's row, which stands for the deployment
    name: str
    up_hours: float  # replica hours: its replicas' up hours summed
    busy_hours: float  # replica-minutes with at least one request, in hours
    tokens: int  # served by its replicas
    hourly: float | None  # a replica-hour's price (their GPU cost over their hours); None: a host has no GPU price
    local_cost: float | None
    cloud_cost: float | None  # the same tokens at the cloud channel's prices; None without a cloud channel
    wake_seconds: float
    replicas: int = 1  # its rows up in the window
    spilled_tokens: int = 0
    spilled_cost: float = 0.0
    capacity: int | None = None  # tokens per replica-minute: the busiest one; None: it served nothing
    route: str | None = None
    choices: list = field(default_factory=list)
    ranges: list = field(default_factory=list)  # a Choice per replica range
    spill_wait_ms: int | None = None  # to set with the cheapest range; None: nothing measured, or no range
    spill_wait_basis: str = ""  # what the spill wait came from, or why there is none

    @property
    def idle_hours(self):
        return max(self.up_hours - self.busy_hours, 0.0)

    @property
    def actual_cost(self):
        """What it really cost: its GPU hours and its spilled requests."""
        return None if self.local_cost is None else self.local_cost + self.spilled_cost

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
        """The cheapest choice; one that saves less than a cent does not beat an earlier one."""
        return _cheapest(self.choices)

    @property
    def best_range(self):
        return _cheapest(self.ranges)

    @property
    def saving(self):
        """What the cheapest choice would have saved against what it really cost."""
        return None if self.best is None or self.actual_cost is None else self.actual_cost - self.best.cost


def _cheapest(choices):
    return min(choices, key=lambda choice: round(choice.cost, 2)) if choices else None


def deployment_plan(team, *, days=7, now=None):
    """A PlanLine per deployment of `team` (its replicas together) that was up in the last `days` days, most idle
    first."""
    until = (now or datetime.now(timezone.utc).timestamp())
    since = until - days * 86400
    window = {"team": team, "period": MINUTE, "start__gte": since, "start__lt": until}
    rows = list(UsageRollup.objects.filter(**window, local=True, deployment__isnull=False)
                .values("deployment_id", "start", "channel_id", "requests", "latency_sum_ms", *TOKEN_COLUMNS))
    cloud = baseline_channel(team, [], Channel.objects.filter(team=team).in_bulk())
    replicas = list(Deployment.objects.filter(team=team, ready_at__isnull=False,
                                              ready_at__lt=datetime.fromtimestamp(until, tz=timezone.utc))
                    .exclude(finished_at__lt=datetime.fromtimestamp(since, tz=timezone.utc))
                    .select_related("host", "profile").order_by("replica_index", "pk"))
    groups = defaultdict(list)  # the first replica's id -> its replicas up in the window
    for replica in replicas:
        groups[replica.head_id].append(replica)
    heads = {replica.pk: replica for replica in replicas if replica.pk in groups}
    heads.update(Deployment.objects.filter(pk__in=set(groups) - set(heads)).select_related("host", "profile")
                 .in_bulk())
    head_of = {replica.pk: replica.head_id for replica in replicas}
    traffic = defaultdict(Traffic)
    for row in rows:
        head = head_of.get(row["deployment_id"])
        if head is None or not row["requests"]:
            continue
        tokens = row["prompt_tokens"] + row["completion_tokens"]
        served = traffic[head].served[row["deployment_id"]]
        served[row["start"]] = served.get(row["start"], 0) + tokens
        price = _cloud_price(cloud, row)
        traffic[head].served_cloud += price
        traffic[head].add(row["start"], tokens, price)
        traffic[head].requests += row["requests"]
        traffic[head].latency_ms += row["latency_sum_ms"]
    spans = {head: _span(group, since=since, until=until) for head, group in groups.items()}
    routes = _routes(team, heads)
    for row in UsageRollup.objects.filter(**window, local=False, spilled__gt=0, model__in=list(routes)).values(
            "model", "start", "requests", "spilled", "spilled_cost", *TOKEN_COLUMNS):
        head = routes[row["model"]]
        if not spans[head][0] <= row["start"] < spans[head][1]:
            continue  # spilled while another deployment held the route's channel
        share = row["spilled"] / row["requests"]
        spilled = {name: round(row[name] * share) for name in TOKEN_COLUMNS}
        tokens = spilled["prompt_tokens"] + spilled["completion_tokens"]
        traffic[head].add(row["start"], tokens, _cloud_price(cloud, spilled))
        traffic[head].spilled_tokens += tokens
        traffic[head].spilled_cost += row["spilled_cost"] or 0.0
    policies = {policy.deployment_id: policy for policy in ScalePolicy.objects.filter(deployment_id__in=groups)}
    lines = [_line(heads[head], groups[head], traffic[head], cloud, policy=policies.get(head) or ScalePolicy(),
                   route=min((name for name, of in routes.items() if of == head), default=None),
                   span=spans[head], since=since, until=until)
             for head in groups]
    return sorted(lines, key=lambda line: (-line.idle_hours, line.deployment.pk))


def _cloud_price(cloud, counts):
    if cloud is None:
        return 0.0
    return float(cloud.cost(counts["prompt_tokens"], counts["completion_tokens"], counts["cached_tokens"],
                            counts["cache_write_tokens"]))


def _routes(team, heads):
    """{route's model name: the first replica's id of the deployment its first local channel serves}, for the
    deployments in `heads`."""
    first = {}
    for entry in (RouteChannel.objects.filter(route__team=team, channel__kind=ChannelKind.LOCAL,
                                              channel__deployment__isnull=False)
                  .order_by("route_id", "position", "pk")
                  .values("route__model_name", "channel__deployment_id", "channel__deployment__replica_of_id")):
        first.setdefault(entry["route__model_name"],
                         entry["channel__deployment__replica_of_id"] or entry["channel__deployment_id"])
    return {name: head for name, head in first.items() if head in heads}


def _span(replicas, *, since, until):
    """(from, until), epoch seconds: from the first ready replica to the last one's end, within the window."""
    return (min(max(replica.ready_at.timestamp(), since) for replica in replicas),
            max(min(replica.finished_at.timestamp() if replica.finished_at else until, until) for replica in replicas))


def _wake_seconds(deployment):
    """Its start-up time: ready minus started, unless it restarted since (started moves, ready_at does not)."""
    started = deployment.started_at or deployment.created_at
    if deployment.ready_at is None or not started or started >= deployment.ready_at:
        return DEFAULT_WAKE_SECONDS
    return (deployment.ready_at - started).total_seconds()


def _line(head, replicas, traffic, cloud, *, policy, route, span, since, until):
    hours = [deployment_up_hours(replica, since=since, until=until) for replica in replicas]
    prices = [replica.hourly_price() for replica in replicas]
    up_hours = sum(hours)
    local_cost = None if None in prices else sum(h * price for h, price in zip(hours, prices))
    if local_cost is None:
        hourly = None
    else:  # one price when the hosts agree (a division would round it), else the mean of a replica-hour
        hourly = prices[0] if len(set(prices)) == 1 else local_cost / up_hours if up_hours else head.hourly_price()
    served = [tokens for minutes in traffic.served.values() for tokens in minutes.values()]
    line = PlanLine(deployment=head, name=str(head.profile.served_model_name or head), up_hours=up_hours,
                    busy_hours=len(served) / 60, tokens=sum(served), hourly=hourly, local_cost=local_cost,
                    cloud_cost=None if cloud is None else traffic.served_cloud,
                    wake_seconds=_wake_seconds(head), replicas=len(replicas), spilled_tokens=traffic.spilled_tokens,
                    spilled_cost=traffic.spilled_cost, capacity=max(served, default=0) or None, route=route)
    if line.hourly is None:
        return line
    line.choices.append(Choice("as it ran", line.actual_cost, awake_hours=up_hours, cloud_cost=line.spilled_cost))
    if line.cloud_cost is None:
        return line
    everything = sum(cost for _, cost in traffic.demand.values())
    line.choices.append(Choice("all cloud", everything, awake_hours=0.0, cloud_cost=everything))
    up_from, up_until = span
    demand = {minute: tuple(value) for minute, value in traffic.demand.items() if up_from <= minute < up_until}
    for idle in SLEEP_MINUTES:
        line.choices.append(_sleeping(line, demand, idle, up_until=up_until))
    if line.capacity is None:
        return line
    line.ranges = [Choice(found.name, found.cost, awake_hours=found.replica_hours, wakes=found.starts,
                          cloud_cost=found.cloud_cost, low=found.low, high=found.high)
                   for found in replica_ranges(demand, capacity=line.capacity, hourly=line.hourly, up_from=up_from,
                                               up_until=up_until, up_after=policy.up_after_seconds,
                                               down_after=policy.down_after_seconds, wake=line.wake_seconds)]
    line.choices.append(line.best_range)
    line.spill_wait_ms, line.spill_wait_basis = _spill_wait(traffic)
    return line


def _sleeping(line, demand, idle_minutes, *, up_until):
    """The cost of sleeping after `idle_minutes` without a request, one engine: the awake stretches (from a minute
    with requests to `idle_minutes` after the last one), each wake's start-up time, and the cloud price of the
    requests of each stretch's first minute that arrive while it starts and of any minute's demand beyond one
    replica's capacity."""
    stretches = []  # [first minute, awake until]
    for start in sorted(demand):
        end = min(start + MINUTE + idle_minutes * MINUTE, up_until)
        if stretches and start < stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], end)
        else:
            stretches.append([start, end])
    share = min(line.wake_seconds / MINUTE, 1.0)  # of a waking minute's requests, those the cloud serves
    seconds = sum(end - start + line.wake_seconds for start, end in stretches)
    spilled = sum(slice_cost(*demand[start], above=0, size=line.capacity) * share for start, _ in stretches)
    if line.capacity is not None:
        spilled += sum(slice_cost(tokens, cost, above=line.capacity) for tokens, cost in demand.values())
    hours = seconds / 3600
    return Choice(f"sleep after {idle_minutes} min", hours * line.hourly + spilled, awake_hours=hours,
                  wakes=len(stretches), cloud_cost=spilled)


def _spill_wait(traffic):
    """(the spill wait in milliseconds, what it came from): a request spills when it would wait about one request's
    time, the mean time of the deployment's requests; (None, why) when their times were not measured."""
    if not traffic.requests or traffic.latency_ms <= 0:
        return None, "nothing measured: its requests of these days carry no time"
    mean = traffic.latency_ms / traffic.requests
    wait = min(max(round(mean), SPILL_WAIT_LIMITS[0]), SPILL_WAIT_LIMITS[1])
    basis = f"the mean time of its {traffic.requests:,} request{'s' if traffic.requests != 1 else ''}, " \
            "arrival to last byte"
    if wait != round(mean):
        basis += f", {mean:,.0f} ms, held within the spill wait's {SPILL_WAIT_LIMITS[0]:,} to " \
                 f"{SPILL_WAIT_LIMITS[1]:,} ms"
    return wait, basis
