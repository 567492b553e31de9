"""Replica ranges for the break-even planner: what a deployment's traffic would have cost with between `low` and
`high` replicas under scale on queue, with the demand no replica was serving spilled to the cloud.

Demand: per minute, the tokens its replicas served plus those its route spilled to the cloud, each minute with its
cloud cost (planner.py). Capacity: the tokens one replica serves in a minute, measured as the busiest replica-minute
of the window. A minute needs ceil(demand / capacity) replicas.

Each minute's demand is cut into slices of one capacity: the k-th replica serves the k-th slice (the demand above
(k - 1) × capacity, at most one capacity). Under a range (low, high), the k-th replica is
- k <= low: up the whole time the deployment was up; it serves its slices.
- low < k <= high: one the scaler adds and removes. It starts the policy's up window after the first minute that
  needs it and serves once the deployment's start-up time has passed too; it stops the quiet window after the end of
  the last minute that needs it (a minute that needs it meanwhile keeps it up). Its GPU time runs from start to stop;
  its slices go to the cloud for the part of each minute before it serves. One that would start only when it would
  already stop (an up window longer than the need and the quiet window) never starts: its slices go to the cloud.
- k > high: none; its slices go to the cloud.
The cost of a range: replica hours × the hourly price of a replica + the cloud cost of every slice that went to the
cloud, at its minute's cloud price per token. What the k-th replica costs depends only on k and on whether it is
always up or scaled, never on the rest of the range, so each is computed once and a range is a sum."""
from dataclasses import dataclass
from math import ceil

from panel.dashboards.models import MINUTE
from panel.serving.placement import MAX_REPLICAS


@dataclass
class Range:
    low: int
    high: int
    cost: float
    replica_hours: float
    starts: int  # replicas the scaler would have started
    cloud_cost: float  # the part of `cost` paid to the cloud

    @property
    def name(self):
        if self.low == self.high:
            return f"{self.low} replica{'s' if self.low != 1 else ''}"
        return f"{self.low} to {self.high} replicas"


@dataclass
class Scaled:
    """The k-th replica as one the scaler adds and removes, and the cloud cost of all its slices."""

    hours: float
    late_cost: float  # its slices' cloud cost for the part of their minutes before it serves
    starts: int
    cloud_cost: float


def slice_cost(tokens, cost, *, above, size=None):
    """The cloud cost of the part of a minute's `tokens` (costing `cost`) above `above` tokens, `size` at most."""
    if tokens <= above:
        return 0.0
    part = tokens - above if size is None else min(tokens - above, size)
    return cost * part / tokens


def replicas_needed(demand, capacity):
    """The most replicas any minute of `demand` needed, at least 1."""
    return max([ceil(tokens / capacity) for tokens, _ in demand.values()] + [1])


def replica_ranges(demand, *, capacity, hourly, up_from, up_until, up_after, down_after, wake):
    """A Range per (low, high), 1 <= low <= high <= the most replicas a minute needed (at most MAX_REPLICAS).
    `demand`: {minute start: (tokens, their cloud cost)} within [up_from, up_until) (epoch seconds); `up_after` and
    `down_after`: the scale policy's windows, `wake`: the deployment's start-up time, in seconds."""
    top = min(replicas_needed(demand, capacity), MAX_REPLICAS)
    span_hours = max(up_until - up_from, 0) / 3600
    # scaled[k - 2]: the k-th replica (the first is always up, every range's low being at least 1)
    scaled = [_scaled(demand, k, capacity=capacity, up_until=up_until, up_after=up_after, down_after=down_after,
                      wake=wake) for k in range(2, top + 1)]
    beyond = sum(slice_cost(tokens, cost, above=MAX_REPLICAS * capacity) for tokens, cost in demand.values())
    ranges = []
    for low in range(1, top + 1):
        for high in range(low, top + 1):
            added, absent = scaled[low - 1:high - 1], scaled[high - 1:]
            hours = low * span_hours + sum(replica.hours for replica in added)
            cloud = (sum(replica.late_cost for replica in added) + sum(replica.cloud_cost for replica in absent)
                     + beyond)
            ranges.append(Range(low, high, hours * hourly + cloud, replica_hours=hours,
                                starts=sum(replica.starts for replica in added), cloud_cost=cloud))
    return ranges


def _scaled(demand, k, *, capacity, up_until, up_after, down_after, wake):
    slices = [(minute, slice_cost(tokens, cost, above=(k - 1) * capacity, size=capacity))
              for minute, (tokens, cost) in sorted(demand.items()) if tokens > (k - 1) * capacity]
    stretches = []  # [first minute that needs it, when it stops, [(minute, slice cost)]]
    for minute, cost in slices:
        stops = min(minute + MINUTE + down_after, up_until)
        if stretches and minute < stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], stops)
            stretches[-1][2].append((minute, cost))
        else:
            stretches.append([minute, stops, [(minute, cost)]])
    seconds, late, starts = 0.0, 0.0, 0
    for first, stops, needed in stretches:
        started = first + up_after
        serves = started + wake
        if started < stops:
            seconds += stops - started
            starts += 1
        for minute, cost in needed:
            before = 1.0 if started >= stops else min(max(serves - minute, 0) / MINUTE, 1.0)
            late += cost * before
    return Scaled(hours=seconds / 3600, late_cost=late, starts=starts, cloud_cost=sum(cost for _, cost in slices))
