"""The usage rollup by tag: the usage records of each minute that carry tags → TagRollup rows per minute, tag,
channel, key and model, then per hour and per day. Called by the usage rollup for the same minutes, in its
transaction (panel/dashboards/rollup.py), so the two never disagree on which records they hold.

A record with two tags counts in both tags' rows. Few records carry tags and a record carries few, so the records'
(minute, tags, channel, key, model) groups are summed in the database and split into tags here."""
from collections import defaultdict
from datetime import datetime, timezone

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncMinute

from panel.dashboards.models import DAY, HOUR, MINUTE, TagRollup
from panel.usage.models import RequestLog
from panel.usage.tags import tags_read

SUMMED = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens",
          "reasoning_tokens", "cost")
DIMENSIONS = ("tag", "channel_id", "deployment_id", "key_id", "model")
AGGREGATES = {"requests": Count("id"),
              "errors": Count("id", filter=Q(outcome__in=("error", "upstream_stalled", "upstream_cut"))),
              "prompt_tokens": Sum("prompt_tokens"), "completion_tokens": Sum("completion_tokens"),
              "cached_tokens": Sum("cached_tokens"), "cache_write_tokens": Sum("cache_write_tokens"),
              "reasoning_tokens": Sum("reasoning_tokens"), "cost": Sum("cost")}


def tag_rollup_minutes(*, team_id, first, last, channels):
    """Recompute the tag rows of one team's minutes `first`..`last` (epoch seconds, whole minutes) and of the hours
    and days that hold them. `channels`: {channel id: (deployment id, local)}, as the usage rollup reads them."""
    since = datetime.fromtimestamp(first, tz=timezone.utc)
    until = datetime.fromtimestamp(last + MINUTE, tz=timezone.utc)
    groups = (RequestLog.objects.filter(team_id=team_id, created_at__gte=since, created_at__lt=until,
                                        tags__isnull=False).order_by()
              .annotate(minute=TruncMinute("created_at")).values("minute", "tags", "channel_id", "key_id", "model")
              .annotate(**AGGREGATES))
    sums = defaultdict(lambda: dict.fromkeys(SUMMED, 0))
    for group in groups:
        deployment_id = channels.get(group["channel_id"], (None, False))[0]
        for tag in tags_read(group["tags"]):
            row = sums[(int(group["minute"].timestamp()), tag, group["channel_id"], deployment_id, group["key_id"],
                        group["model"])]
            for name in SUMMED:
                row[name] += float(group[name] or 0) if name == "cost" else group[name] or 0
    TagRollup.objects.filter(team_id=team_id, period=MINUTE, start__gte=first, start__lte=last).delete()
    TagRollup.objects.bulk_create([TagRollup(team_id=team_id, period=MINUTE, start=start,
                                             **dict(zip(DIMENSIONS, dimensions, strict=True)), **row)
                                   for (start, *dimensions), row in sums.items()], batch_size=1000)
    _rebuild(team_id, MINUTE, HOUR, _floor(first, HOUR), _floor(last, HOUR))
    _rebuild(team_id, HOUR, DAY, _floor(first, DAY), _floor(last, DAY))


def _rebuild(team_id, source, target, first, last):
    finer = TagRollup.objects.filter(team_id=team_id, period=source, start__gte=first, start__lt=last + target)
    coarse = (finer.annotate(bucket=F("start") / target * target).order_by().values("bucket", *DIMENSIONS)
              .annotate(**{f"total_{name}": Sum(name) for name in SUMMED}))
    rows = [TagRollup(team_id=team_id, period=target, start=row["bucket"], **{name: row[name] for name in DIMENSIONS},
                      **{name: row[f"total_{name}"] or 0 for name in SUMMED}) for row in coarse]
    TagRollup.objects.filter(team_id=team_id, period=target, start__gte=first, start__lte=last).delete()
    TagRollup.objects.bulk_create(rows, batch_size=1000)


def _floor(seconds, step):
    return int(seconds // step * step)
