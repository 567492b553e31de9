"""Local requests carry their GPU cost. Each minute, a deployment costs its host's GPU price per hour × its GPUs × the
time it was up in that minute (as the Cost tab counts it: `Deployment.hourly_price`, `deployment_up_hours`); that
cost is split among the requests its local channels served in the minute, by prompt + completion tokens (by request
count when none has any), written to each row's `gpu_cost` and added to its `cost`. The roll-ups and the spend per
key and team then count it, and the budget counters move by the same amounts once the minute commits ([0091]). A
minute without requests is charged to no one ([0050]). A vLLM pool's GPUs are split the same way among the requests
its channel served: its GPUs × its price per GPU-hour, every minute since the channel was made (as the Cost tab counts
a pool), from this month's start at the earliest.

- A minute is allocated SETTLE_SECONDS after it ended: the usage writer stamps a row when it writes it (a batch every
  FLUSH_SECONDS, a write waits at most SQLite's busy timeout), so by then the minute's rows are in.
- A row written later still into an allocated minute (a writer stalled past the margin, rows imported or seeded) is
  found by id (above the deployment's `checked_id`, less the roll-up's overlap for PostgreSQL's out-of-order commits)
  and its whole minute is split again among all its rows: the late row gets its share, the others give up theirs,
  and the minute's total stays its GPU cost. Nothing is missed and nothing is charged twice.
- Allocating a minute sets each row's gpu_cost and moves its cost by the difference, so doing it again changes
  nothing. The rows, the watermark and the minute's roll-up are written in one transaction; once it commits, the
  money counters of each row's team, key and tags move by the same differences (budgets/adjust.py), so a budget
  counts the GPU cost when its minute is allocated, and a minute split again moves them by the difference only.
- Rounding: costs have 8 decimal places. A minute's cost is the difference of the deployment's cumulative GPU cost
  since it became ready, each rounded to 1e-8, so minutes add up to the rounded whole; a minute is split by largest
  remainders, so its rows' shares add up to it exactly."""
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Greatest, TruncMinute

from panel.budgets.adjust import CostChange, budget_money_adjust
from panel.budgets.counters import month_bounds, month_of
from panel.channels.models import Channel, ChannelKind
from panel.dashboards.cost import deployment_up_hours
from panel.dashboards.models import MINUTE, LocalCostWatermark
from panel.dashboards.rollup import OVERLAP_IDS, usage_rollup_lock, usage_rollup_minutes
from panel.serving.models import Deployment
from panel.usage.models import RequestLog

log = logging.getLogger(__name__)

SETTLE_SECONDS = 120  # a minute is allocated this long after it ended
MAX_MINUTES_PER_RUN = 24 * 60  # per deployment: a catch-up goes a day at a time
LOCK_WAIT_SECONDS = 30  # for the roll-up's lock (a roll-up run takes milliseconds)
LATE_ROWS_WINDOW_SECONDS = 3600  # a finished deployment is still checked for late rows this long after its end
UNIT = 10**8  # RequestLog.cost has 8 decimal places


@dataclass
class Allocation:
    """What one run did."""

    minutes: int = 0  # minutes whose GPU cost was split among their rows
    rows: int = 0
    late_minutes: int = 0  # of those, allocated minutes split again because a row arrived late
    unpriced: list = field(default_factory=list)  # hosts of running deployments without a GPU price: not allocated
    skipped: bool = False  # the roll-up's lock was not taken in time: the next run does this run's work
    budgets_behind: int = 0  # minutes whose change Redis did not take: the budget reconciliation raises the counters


def local_cost_allocate(*, now=None):
    """Split each priced deployment's GPU cost of every minute that ended SETTLE_SECONDS ago and was not allocated
    yet among the requests it served in it, and again for any allocated minute a row arrived in late. A deployment
    first seen starts at its ready minute, or at the start of this month if it was ready before (a closed month's
    spend is not rewritten). Returns an Allocation."""
    now = time.time() if now is None else now
    horizon = _floor(now - SETTLE_SECONDS)
    month_start = month_bounds(month_of(datetime.fromtimestamp(now, tz=timezone.utc)))[0]
    result = Allocation()
    with usage_rollup_lock(wait_seconds=LOCK_WAIT_SECONDS) as taken:
        if not taken:
            log.warning("local GPU cost not allocated: the roll-up's lock stayed taken for %s s", LOCK_WAIT_SECONDS)
            result.skipped = True
            return result
        top = RequestLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
        watermarks = LocalCostWatermark.objects.filter(deployment__isnull=False).in_bulk(field_name="deployment_id")
        deployments = (Deployment.objects.filter(ready_at__isnull=False)
                       .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=month_start))
                       .select_related("host").order_by("pk"))
        for deployment in deployments:
            hourly = deployment.hourly_price()
            if hourly is None:
                if deployment.finished_at is None:
                    result.unpriced.append(deployment.host.host if deployment.host else f"deployment #{deployment.pk}")
                continue
            if deployment.pk not in watermarks:
                first = _floor(max(deployment.ready_at, month_start).timestamp())
                watermarks[deployment.pk] = LocalCostWatermark.objects.create(
                    deployment=deployment, allocated_since=first, allocated_until=first, checked_id=top)
            watermark = watermarks[deployment.pk]
            if not _done(deployment, watermark, now):
                _source_allocate(_DeploymentSource(deployment, hourly), watermark, horizon=horizon, top=top,
                                 result=result)
        pool_marks = LocalCostWatermark.objects.filter(channel__isnull=False).in_bulk(field_name="channel_id")
        for pool in Channel.objects.filter(kind=ChannelKind.POOL).order_by("pk"):
            hourly = pool.gpu_hourly_price()
            if hourly is None:
                continue  # the Cost tab names an unpriced pool
            if pool.pk not in pool_marks:  # from when it was made, as the Cost tab charges it, within this month
                first = _floor(max(pool.created_at, month_start).timestamp())
                pool_marks[pool.pk] = LocalCostWatermark.objects.create(
                    channel=pool, allocated_since=first, allocated_until=first, checked_id=top)
            _source_allocate(_PoolSource(pool, hourly), pool_marks[pool.pk], horizon=horizon, top=top, result=result)
    if result.unpriced:
        log.info("no GPU price on %s: their requests carry no GPU cost", ", ".join(sorted(set(result.unpriced))))
    return result


def _done(deployment, watermark, now):
    """A finished deployment whose last minute is allocated and whose late rows have had their hour."""
    ended = deployment.finished_at
    return (ended is not None and watermark.allocated_until >= _ceil(ended.timestamp())
            and now - ended.timestamp() > LATE_ROWS_WINDOW_SECONDS)


class _DeploymentSource:
    """A deployment's GPUs: their cost while it was up (less its sleep), split among its local channels' rows."""

    def __init__(self, deployment, hourly):
        self.deployment, self.hourly = deployment, hourly
        self.finished_at = deployment.finished_at
        self.channels = list(Channel.objects.filter(deployment=deployment, kind=ChannelKind.LOCAL)
                             .values_list("id", flat=True))

    def units_until(self, until):
        """The GPU cost from its ready time to `until`, in 1e-8 units."""
        hours = deployment_up_hours(self.deployment, since=self.deployment.ready_at.timestamp(), until=until)
        return round(hours * self.hourly * UNIT)


class _PoolSource:
    """A vLLM pool's GPUs: always up since its channel was made (engines the panel did not start), split among the
    pool channel's rows."""

    finished_at = None

    def __init__(self, pool, hourly):
        self.created, self.hourly, self.channels = pool.created_at.timestamp(), hourly, [pool.pk]

    def units_until(self, until):
        return round(max(until - self.created, 0) / 3600 * self.hourly * UNIT)


def _source_allocate(source, watermark, *, horizon, top, result):
    channels = source.channels
    start = watermark.allocated_until
    end = min(horizon, start + MAX_MINUTES_PER_RUN * MINUTE)
    if source.finished_at is not None:
        end = min(end, _ceil(source.finished_at.timestamp()))
    late = busy = ()
    if channels:
        late = {_floor(created.timestamp()) for created in RequestLog.objects.filter(
            id__gt=watermark.checked_id - OVERLAP_IDS, id__lte=top, channel_id__in=channels, gpu_cost__isnull=True,
            created_at__gte=_moment(watermark.allocated_since), created_at__lt=_moment(start))
            .values_list("created_at", flat=True)}
        busy = {_floor(minute.timestamp()) for minute in RequestLog.objects.filter(
            channel_id__in=channels, created_at__gte=_moment(start), created_at__lt=_moment(end)).order_by()
            .annotate(minute=TruncMinute("created_at")).values_list("minute", flat=True).distinct()} if end > start \
            else ()
    for minute in sorted(late):
        result.rows += _minute_allocate(source, watermark, minute, result)
        result.minutes += 1
        result.late_minutes += 1
    for minute in sorted(busy):
        result.rows += _minute_allocate(source, watermark, minute, result)
        result.minutes += 1
    # The idle minutes up to `end` are passed: charged to no one.
    LocalCostWatermark.objects.filter(pk=watermark.pk).update(allocated_until=Greatest("allocated_until", end),
                                                              checked_id=Greatest("checked_id", top))


def _minute_allocate(source, watermark, minute, result):
    """Split one minute's GPU cost among the rows of that minute, with the watermark and the roll-up of the minute
    in the same transaction, and move the budget counters by the rows' changes once it commits. Returns the number
    of rows."""
    units = source.units_until(minute + MINUTE) - source.units_until(minute)
    with transaction.atomic():
        # The watermark first: its UPDATE takes the write lock (SQLite) or the row's lock (PostgreSQL) before the
        # rows are read, so two runs never split one minute from a stale read.
        LocalCostWatermark.objects.filter(pk=watermark.pk).update(
            allocated_until=Greatest("allocated_until", minute + MINUTE))
        rows = list(RequestLog.objects.filter(channel_id__in=source.channels, created_at__gte=_moment(minute),
                                              created_at__lt=_moment(minute + MINUTE)).order_by("id")
                    .only("id", "team_id", "key_id", "tags", "created_at", "prompt_tokens", "completion_tokens",
                          "cost", "gpu_cost"))
        shares = shares_split(units, [row.prompt_tokens + row.completion_tokens for row in rows])
        changes = []
        for row, share in zip(rows, shares):
            gpu_cost = Decimal(share) / UNIT
            change = gpu_cost - (row.gpu_cost or 0)
            row.cost, row.gpu_cost = row.cost + change, gpu_cost
            if change:
                changes.append(CostChange(row.team_id, row.key_id, row.tags, row.created_at, change))
        RequestLog.objects.bulk_update(rows, ["cost", "gpu_cost"], batch_size=500)
        for team_id in sorted({row.team_id for row in rows if row.team_id is not None}):
            usage_rollup_minutes(team_id=team_id, minutes={minute})
        if changes:
            transaction.on_commit(lambda: _budgets_move(changes, result))
    return len(rows)


def _budgets_move(changes, result):
    """Move the budget counters by a committed minute's changes. After Redis failed once in a run the rest of the
    run does not wait on it again (a catch-up may commit hundreds of minutes): the reconciliation raises the
    counters to the rows' sums instead."""
    if result.budgets_behind or not budget_money_adjust(changes):
        result.budgets_behind += 1


def shares_split(units, weights):
    """Split `units` (integers) in proportion to `weights`, by largest remainders (ties to the earlier row): the
    shares add up to `units` exactly. All weights zero: equal weights."""
    if not weights:
        return []
    if not any(weights):
        weights = [1] * len(weights)
    total = sum(weights)
    shares = [units * weight // total for weight in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(units * weights[i] % total), i))
    for i in order[:units - sum(shares)]:
        shares[i] += 1
    return shares


def _moment(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _floor(seconds):
    return int(seconds // MINUTE * MINUTE)


def _ceil(seconds):
    return -int(-seconds // MINUTE * MINUTE)
