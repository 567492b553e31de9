"""The usage rollup: RequestLog rows → UsageRollup rows per minute, then per hour.

Incremental and idempotent: each run reads the records added since the watermark (a RequestLog id), finds the
minutes they fall in, and recomputes those whole minutes from every record in them (delete, insert), then the hours
that hold them from the minute rows. A late record (an old `created_at`, a new id) therefore lands in its minute,
and running it twice changes nothing."""
import bisect
from collections import defaultdict

from django.db import transaction
from django.db.models import F, Sum

from panel.dashboards.models import (BUCKET_BOUNDS_MS, HOUR, LATENCY_COLUMNS, MINUTE, TTFT_COLUMNS, RollupWatermark,
                                     UsageRollup)

# Ids are re-read this far behind the watermark: on PostgreSQL two writers can commit ids out of order, so a row
# with a smaller id may become visible after a larger one. Re-reading is cheap because the work is idempotent.
OVERLAP_IDS = 2000
BATCH_IDS = 50000
MAX_RUN_SECONDS = 6 * HOUR  # bounds the records one transaction reads
JOIN_GAP_SECONDS = HOUR
LOCK_KEY = "dashboards:rollup-running"
LOCK_SECONDS = 600
SUMMED = ("requests", "errors", "fallbacks", "prompt_tokens", "completion_tokens", "cached_tokens", "cost",
          "ttft_count", "ttft_sum_ms", "latency_sum_ms") + TTFT_COLUMNS + LATENCY_COLUMNS
RAW_FIELDS = ("created_at", "channel_id", "key_id", "model", "outcome", "fell_back", "prompt_tokens",
              "completion_tokens", "cached_tokens", "cost", "ttft_ms", "latency_ms")


def bucket_of(milliseconds):
    """The index of the fixed bucket that holds a duration (upper bounds inclusive, like Prometheus' `le`)."""
    return bisect.bisect_left(BUCKET_BOUNDS_MS, milliseconds)


def usage_rollup_run(*, batch_ids=BATCH_IDS, lock=True):
    """Roll up every record added since the last run. Returns the number of records read, or None when another run
    holds the lock (beat may fire again while a long run is still going; two runs would both insert a minute)."""
    from django.core.cache import cache

    if lock and not cache.add(LOCK_KEY, 1, timeout=LOCK_SECONDS):
        return None
    try:
        return _run(batch_ids)
    finally:
        if lock:
            cache.delete(LOCK_KEY)


def _run(batch_ids):
    from panel.gateway.models import RequestLog

    watermark = RollupWatermark.objects.order_by("pk").first() or RollupWatermark.objects.create(last_id=0)
    top = RequestLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
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
    """Recompute the given minutes (epoch seconds) of one team from the raw records, and the hours that hold them."""
    channels = _channel_facts() if channels is None else channels
    for first, last in _runs(sorted(minutes)):
        with transaction.atomic():
            rows = _aggregate_minutes(team_id, first, last, channels)
            UsageRollup.objects.filter(team_id=team_id, period=MINUTE, start__gte=first, start__lte=last).delete()
            UsageRollup.objects.bulk_create(rows, batch_size=2000)
            _rebuild_hours(team_id, _floor(first, HOUR), _floor(last, HOUR))


def _aggregate_minutes(team_id, first, last, channels):
    from datetime import datetime, timezone

    from panel.gateway.models import RequestLog

    since = datetime.fromtimestamp(first, tz=timezone.utc)
    until = datetime.fromtimestamp(last + MINUTE, tz=timezone.utc)
    groups = {}
    for (created_at, channel_id, key_id, model, outcome, fell_back, prompt, completion, cached, cost, ttft,
         latency) in (RequestLog.objects.filter(team_id=team_id, created_at__gte=since, created_at__lt=until)
                      .order_by().values_list(*RAW_FIELDS).iterator(chunk_size=10000)):
        start = _floor(created_at.timestamp(), MINUTE)
        group = groups.get((start, channel_id, key_id, model))
        if group is None:
            deployment_id, local = channels.get(channel_id, (None, False))
            group = groups[(start, channel_id, key_id, model)] = UsageRollup(
                team_id=team_id, period=MINUTE, start=start, channel_id=channel_id, deployment_id=deployment_id,
                key_id=key_id, model=model, local=local)
        group.requests += 1
        group.errors += outcome == "error"
        group.fallbacks += bool(fell_back)
        group.prompt_tokens += prompt
        group.completion_tokens += completion
        group.cached_tokens += cached
        group.cost += float(cost)
        if ttft is not None:
            group.ttft_count += 1
            group.ttft_sum_ms += ttft
            name = TTFT_COLUMNS[bucket_of(ttft)]
            setattr(group, name, getattr(group, name) + 1)
        group.latency_sum_ms += latency
        name = LATENCY_COLUMNS[bucket_of(latency)]
        setattr(group, name, getattr(group, name) + 1)
    return list(groups.values())


def _rebuild_hours(team_id, first_hour, last_hour):
    minutes = UsageRollup.objects.filter(team_id=team_id, period=MINUTE, start__gte=first_hour,
                                         start__lt=last_hour + HOUR)
    dimensions = ("channel_id", "deployment_id", "key_id", "model", "local")
    hours = (minutes.annotate(hour=F("start") / HOUR * HOUR).order_by().values("hour", *dimensions)
             .annotate(**{f"total_{name}": Sum(name) for name in SUMMED}))
    rows = [UsageRollup(team_id=team_id, period=HOUR, start=row["hour"], **{name: row[name] for name in dimensions},
                        **{name: row[f"total_{name}"] for name in SUMMED}) for row in hours]
    UsageRollup.objects.filter(team_id=team_id, period=HOUR, start__gte=first_hour, start__lte=last_hour).delete()
    UsageRollup.objects.bulk_create(rows, batch_size=2000)


def _channel_facts():
    from panel.channels.models import Channel

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
