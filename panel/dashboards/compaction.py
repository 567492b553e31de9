"""Engine samples are kept at scrape resolution (10 s) for an hour, per minute for six hours, per hour for a
week, per day after that, so a 30-day page reads about 850 rows a deployment instead of 260,000. A compacted row
sums the deltas of the rows it replaces, merges their histograms, averages their gauges, keeps the newest
cumulative values (the next scrape's delta is taken against them) and counts their gaps."""
from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from panel.dashboards.models import DAY, HOUR, MINUTE, EngineSample
from panel.dashboards.selectors import merge_histogram

# (rows older than this, are merged into rows of this period)
TIERS = ((timedelta(hours=1), MINUTE), (timedelta(hours=6), HOUR), (timedelta(days=7), DAY))
COUNTERS = ("prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens", "preemptions", "seconds")
GAUGES = ("kv_cache_usage", "running", "waiting")


def engine_samples_compact(*, now=None):
    """Merge old samples into per-minute and per-hour rows. Returns the number of rows removed."""
    now = now or timezone.now()
    removed = 0
    for age, period in TIERS:
        removed += _compact(cutoff=now - age, period=period)
    return removed


def _compact(*, cutoff, period):
    # Only whole periods that end before the cutoff, so a period is merged once, with every row it will ever have.
    cutoff_seconds = int(cutoff.timestamp() // period * period)
    cutoff = cutoff.fromtimestamp(cutoff_seconds, tz=cutoff.tzinfo)
    candidates = EngineSample.objects.filter(period__lt=period, at__lt=cutoff).order_by("deployment_id", "channel_id",
                                                                                       "at", "pk")
    groups = defaultdict(list)
    for sample in candidates.iterator(chunk_size=5000):  # a deployment's, or a vLLM pool's (its channel)
        groups[(sample.deployment_id, sample.channel_id, int(sample.at.timestamp() // period * period))].append(sample)
    removed = 0
    merged = []
    for (_, _, start), samples in groups.items():
        merged.append(_merge(samples, start=start, period=period))
        removed += len(samples)
    with transaction.atomic():
        # The same rows as read: new scrapes are stamped now, far after the cutoff.
        candidates.delete()
        EngineSample.objects.bulk_create(merged, batch_size=1000)
    return removed - len(merged)


def _merge(samples, *, start, period):
    from datetime import datetime
    from datetime import timezone as tz

    first = samples[0]
    row = EngineSample(deployment_id=first.deployment_id, channel_id=first.channel_id, team_id=first.team_id,
                       period=period,
                       at=datetime.fromtimestamp(start, tz=tz.utc), ok=any(s.ok for s in samples),
                       gaps=sum(s.gaps for s in samples), restarted=any(s.restarted for s in samples),
                       warning=next((s.warning for s in reversed(samples) if s.warning), ""), ttft={}, itl={})
    good = [s for s in samples if s.ok]
    for name in COUNTERS:
        setattr(row, name, sum(getattr(s, name) for s in good))
    for name in GAUGES:
        values = [getattr(s, name) for s in good if getattr(s, name) is not None]
        setattr(row, name, sum(values) / len(values) if values else None)
    for sample in good:
        merge_histogram(row.ttft, sample.ttft)
        merge_histogram(row.itl, sample.itl)
    row.cumulative = good[-1].cumulative if good else {}
    return row
