"""The usage rollup: RequestLog rows → UsageRollup rows per minute, then per hour.

Incremental and idempotent: each run reads the records added since the watermark (a RequestLog id), finds the
minutes they fall in, and recomputes those whole minutes from every record in them (delete, insert), then the hours
that hold them from the minute rows. A late record (an old `created_at`, a new id) therefore lands in its minute,
and running it twice changes nothing."""
import bisect
import logging
import time
from collections import defaultdict
from contextlib import contextmanager

from django.db import OperationalError, transaction
from django.db.models import F, Sum
from redis import RedisError

from panel.channels.models import Channel
from panel.dashboards.models import (
    BUCKET_BOUNDS_MS,
    DAY,
    HOUR,
    LATENCY_COLUMNS,
    MINUTE,
    TTFT_COLUMNS,
    RollupWatermark,
    UsageRollup,
)
from panel.dashboards.tag_rollup import tag_rollup_minutes
from panel.usage.models import RequestLog

log = logging.getLogger(__name__)

# Ids are re-read this far behind the watermark: on PostgreSQL two writers can commit ids out of order, so a row
# with a smaller id may become visible after a larger one. Re-reading is cheap because the work is idempotent.
OVERLAP_IDS = 2000
BATCH_IDS = 50000
MAX_RUN_SECONDS = 6 * HOUR  # bounds the records one transaction reads
JOIN_GAP_SECONDS = HOUR
# roll_up_usage's time limits (tasks.py). The run's lock lasts as long as the hard limit, so the lock of a run killed
# there is gone when the run is; a longer lock made every roll-up after such a kill skip for minutes.
SOFT_TIME_LIMIT_SECONDS = 300
HARD_TIME_LIMIT_SECONDS = 360
LOCK_KEY = "dashboards:rollup-running"
LOCK_SECONDS = HARD_TIME_LIMIT_SECONDS
SUMMED = ("requests", "errors", "refused", "fallbacks", "prompt_tokens", "completion_tokens", "cached_tokens",
          "cache_write_tokens", "reasoning_tokens", "server_tool_calls", "cost", "spilled", "spilled_cost",
          "ttft_count", "ttft_sum_ms", "latency_sum_ms") + TTFT_COLUMNS + LATENCY_COLUMNS


def bucket_of(milliseconds):
    """The index of the fixed bucket that holds a duration (upper bounds inclusive, like Prometheus' `le`)."""
    return bisect.bisect_left(BUCKET_BOUNDS_MS, milliseconds)


def usage_rollup_run(*, batch_ids=BATCH_IDS, lock=True):
    """Roll up every record added since the last run. Returns the number of records read, or None when this round is
    skipped: another run holds the lock (beat may fire again while a long run is still going; two runs would both
    insert a minute), Redis did not answer within its socket timeout, or the database stayed locked past SQLite's
    busy timeout. A skip for Redis or the database is logged; the next beat tick tries again."""
    if lock and not _lock_take():
        return None
    try:
        return _run(batch_ids)
    except OperationalError as error:
        if "locked" not in str(error):
            raise
        log.warning("usage roll-up skipped: the database stayed locked past its busy timeout (%s)", error)
        return None
    finally:
        if lock:
            _lock_release()


def _lock_take():
    from django.core.cache import cache

    try:
        return cache.add(LOCK_KEY, 1, timeout=LOCK_SECONDS)
    except RedisError as error:
        log.warning("usage roll-up skipped: Redis did not answer for the roll-up's lock (%s)", error)
        return False


def _lock_release():
    from django.core.cache import cache

    try:
        cache.delete(LOCK_KEY)
    except RedisError as error:
        log.warning("the usage roll-up's lock was not released (%s); it expires within %s s", error, LOCK_SECONDS)


@contextmanager
def usage_rollup_lock(*, wait_seconds):
    """Hold the roll-up's lock around work that recomputes minutes outside a roll-up run (two writers of one minute
    would both insert it on PostgreSQL). Yields whether it was taken within `wait_seconds` (each Redis call is bounded
    by the cache's socket timeout)."""
    deadline = time.monotonic() + wait_seconds
    taken = _lock_take()
    while not taken and time.monotonic() < deadline:
        time.sleep(0.25)
        taken = _lock_take()
    try:
        yield taken
    finally:
        if taken:
            _lock_release()


def _run(batch_ids):
    watermark = RollupWatermark.objects.order_by("pk").first() or RollupWatermark.objects.create(last_id=0)
    top = RequestLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
    if top <= watermark.last_id:
        return 0  # nothing new: an idle installation does no work every ten seconds
    low = max(watermark.last_id - OVERLAP_IDS, 0)
    channels = _channel_facts()
    read = 0
    while low < top:
        high = min(low + batch_ids, top)
        touched = defaultdict(set)
        for team_id, created_at in (RequestLog.objects.filter(id__gt=low, id__lte=high, team__isnull=False)
                                    .values_list("team_id", "created_at").iterator(chunk_size=10000)):
            touched[team_id].add(_floor(created_at.timestamp(), MINUTE))
            read += 1
        for team_id, minutes in touched.items():
            usage_rollup_minutes(team_id=team_id, minutes=minutes, channels=channels)
        low = high
    RollupWatermark.objects.filter(pk=watermark.pk).update(last_id=max(top, watermark.last_id))
    return read


def usage_rollup_minutes(*, team_id, minutes, channels=None):
    """Recompute the given minutes (epoch seconds) of one team from the raw records, and the hours and days that
    hold them; their rows by tag too (panel/dashboards/tag_rollup.py)."""
    channels = _channel_facts() if channels is None else channels
    for first, last in _runs(sorted(minutes)):
        with transaction.atomic():
            rows = _aggregate_minutes(team_id, first, last, channels)
            UsageRollup.objects.filter(team_id=team_id, period=MINUTE, start__gte=first, start__lte=last).delete()
            _insert(rows)
            _rebuild(team_id, MINUTE, HOUR, _floor(first, HOUR), _floor(last, HOUR))
            _rebuild(team_id, HOUR, DAY, _floor(first, DAY), _floor(last, DAY))
            tag_rollup_minutes(team_id=team_id, first=first, last=last, channels=channels)


def _aggregate_minutes(team_id, first, last, channels):
    """One GROUP BY in the database: per minute / channel / key / model, the counts, sums and bucket counts."""
    from datetime import datetime, timezone

    from django.db.models.functions import TruncMinute


    since = datetime.fromtimestamp(first, tz=timezone.utc)
    until = datetime.fromtimestamp(last + MINUTE, tz=timezone.utc)
    rows = (RequestLog.objects.filter(team_id=team_id, created_at__gte=since, created_at__lt=until).order_by()
            .annotate(minute=TruncMinute("created_at")).values("minute", "channel_id", "key_id", "model")
            .annotate(**AGGREGATES))
    groups = []
    for row in rows:
        deployment_id, local = channels.get(row["channel_id"], (None, False))
        groups.append({"team_id": team_id, "period": MINUTE, "start": int(row["minute"].timestamp()),
                       "channel_id": row["channel_id"], "deployment_id": deployment_id, "key_id": row["key_id"],
                       "model": row["model"], "local": local,
                       **{name: (float(row[name] or 0) if name in FLOATS else row[name] or 0) for name in SUMMED}})
    return groups


def _bucket_counts(field, columns):
    """Count(...) of records whose `field` falls in each fixed bucket (lower bound exclusive, upper inclusive)."""
    from django.db.models import Count, Q

    counts = {}
    bounds = (None,) + BUCKET_BOUNDS_MS + (None,)
    for index, column in enumerate(columns):
        lower, upper = bounds[index], bounds[index + 1]
        where = Q(**{f"{field}__isnull": False})
        if lower is not None:
            where &= Q(**{f"{field}__gt": lower})
        if upper is not None:
            where &= Q(**{f"{field}__lte": upper})
        counts[column] = Count("id", filter=where)
    return counts


def _aggregates():
    from django.db.models import Count, Q

    return {
        # First, in this order: an aggregate's "cost" or "spilled" names the aggregate of that name once it is
        # defined, no longer the column.
        "spilled_cost": Sum("cost", filter=Q(spilled=True)), "spilled": Count("id", filter=Q(spilled=True)),
        "requests": Count("id"),
        "errors": Count("id", filter=Q(outcome__in=("error", "upstream_stalled", "upstream_cut"))),
        "refused": Count("id", filter=Q(outcome="error", status_code__gte=400, status_code__lt=500)),
        "fallbacks": Count("id", filter=Q(fell_back=True)), "prompt_tokens": Sum("prompt_tokens"),
        "completion_tokens": Sum("completion_tokens"), "cached_tokens": Sum("cached_tokens"),
        "cache_write_tokens": Sum("cache_write_tokens"), "reasoning_tokens": Sum("reasoning_tokens"),
        "server_tool_calls": Sum("server_tool_calls"), "cost": Sum("cost"),
        "ttft_count": Count("ttft_ms"), "ttft_sum_ms": Sum("ttft_ms"), "latency_sum_ms": Sum("latency_ms"),
        **_bucket_counts("ttft_ms", TTFT_COLUMNS), **_bucket_counts("latency_ms", LATENCY_COLUMNS)}


AGGREGATES = _aggregates()
FLOATS = {"cost", "spilled_cost", "ttft_sum_ms", "latency_sum_ms"}


def _rebuild(team_id, source, target, first, last):
    """Recompute the `target`-period rows from first to last (their starts) by summing the `source`-period rows."""
    finer = UsageRollup.objects.filter(team_id=team_id, period=source, start__gte=first, start__lt=last + target)
    dimensions = ("channel_id", "deployment_id", "key_id", "model", "local")
    coarse = (finer.annotate(bucket=F("start") / target * target).order_by().values("bucket", *dimensions)
              .annotate(**{f"total_{name}": Sum(name) for name in SUMMED}))
    rows = [{"team_id": team_id, "period": target, "start": row["bucket"], **{name: row[name] for name in dimensions},
             **{name: row[f"total_{name}"] or 0 for name in SUMMED}} for row in coarse]
    UsageRollup.objects.filter(team_id=team_id, period=target, start__gte=first, start__lte=last).delete()
    _insert(rows)


def _insert(rows):
    """INSERT the rollup rows with executemany (COPY on PostgreSQL): Django's bulk_create prepares 50 values a row
    one by one, which made it most of a backfill's time."""
    if not rows:
        return
    from django.db import connection

    columns = tuple(rows[0])
    table = connection.ops.quote_name(UsageRollup._meta.db_table)
    names = ", ".join(connection.ops.quote_name(UsageRollup._meta.get_field(_field_name(c)).column) for c in columns)
    sql = f"INSERT INTO {table} ({names}) VALUES ({', '.join(['%s'] * len(columns))})"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # COPY: psycopg's executemany binds each value client-side
            with cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(tuple(row[c] for c in columns))
            return
        for first in range(0, len(rows), 5000):
            cursor.executemany(sql, [tuple(row[c] for c in columns) for row in rows[first:first + 5000]])


def _field_name(column):
    return column[:-3] if column.endswith("_id") else column


def _channel_facts():
    return {row["id"]: (row["deployment_id"], row["kind"] == "local")
            for row in Channel.objects.values("id", "deployment_id", "kind")}


def _floor(seconds, step):
    return int(seconds // step * step)


def _runs(starts):
    """Stretches of sorted period starts, as (first, last): one query per stretch, never one per minute, and never
    a month-wide scan because one late record fell into an old minute. Minutes up to JOIN_GAP_SECONDS apart share a
    stretch: the untouched minutes between them are recomputed too, which changes nothing and saves a round trip
    each (sparse traffic touches one minute in many)."""
    runs = []
    for start in starts:
        if runs and start - runs[-1][1] <= JOIN_GAP_SECONDS and start - runs[-1][0] < MAX_RUN_SECONDS:
            runs[-1][1] = start
        else:
            runs.append([start, start])
    return [tuple(run) for run in runs]
