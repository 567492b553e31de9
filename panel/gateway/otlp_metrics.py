"""The panel's own Prometheus metrics (panel/gateway/metrics.py, the figures /metrics serves) as OTLP metrics: the
same counters and histograms, read from this process's registry and sent as they stand (cumulative, under their
Prometheus names), so a collector and a Prometheus scrape see the same figures. Each process sends its own; the
collector or the backend adds them up, as /metrics does across processes."""
import time

from opentelemetry.sdk.metrics import export as otlp
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from panel.gateway.metrics import registry

SCOPE = InstrumentationScope("tokenwise.metrics")
CUMULATIVE = otlp.AggregationTemporality.CUMULATIVE


def metrics_data(resource, started_ns):
    """Every metric of the registry as OTLP MetricsData, counted since `started_ns`."""
    now = time.time_ns()
    converted = [metric for family in registry.collect()
                 if (metric := _metric(family, started_ns, now)) is not None]
    scope = otlp.ScopeMetrics(scope=SCOPE, metrics=converted, schema_url="")
    return otlp.MetricsData(resource_metrics=[otlp.ResourceMetrics(resource=resource, scope_metrics=[scope],
                                                                   schema_url="")])


def _number(sample, started_ns, now):
    return otlp.NumberDataPoint(attributes=sample.labels, start_time_unix_nano=started_ns, time_unix_nano=now,
                                value=sample.value)


def _metric(family, started_ns, now):
    if family.type == "counter":
        data = otlp.Sum(data_points=[_number(sample, started_ns, now) for sample in family.samples
                                     if sample.name.endswith("_total")],
                        aggregation_temporality=CUMULATIVE, is_monotonic=True)
    elif family.type == "gauge":
        data = otlp.Gauge(data_points=[_number(sample, started_ns, now) for sample in family.samples])
    elif family.type == "histogram":
        data = otlp.Histogram(data_points=_histogram_points(family.samples, started_ns, now),
                              aggregation_temporality=CUMULATIVE)
    else:
        return None
    return otlp.Metric(name=family.name, description=family.documentation, unit=family.unit, data=data)


def _histogram_points(samples, started_ns, now):
    """Prometheus gives each label set's buckets as cumulative counts up to `le`; OTLP wants each bucket's own count
    and the bounds without +Inf. Prometheus keeps no min or max: they are left out."""
    series = {}
    for sample in samples:
        labels = {name: value for name, value in sample.labels.items() if name != "le"}
        entry = series.setdefault(tuple(sorted(labels.items())),
                                  {"labels": labels, "buckets": [], "count": 0, "sum": 0.0})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_count"):
            entry["count"] = int(sample.value)
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
    points = []
    for entry in series.values():
        cumulative = sorted(entry["buckets"])
        below = [0, *(value for _, value in cumulative)]
        counts = [int(value - below[index]) for index, (_, value) in enumerate(cumulative)]
        points.append(otlp.HistogramDataPoint(
            attributes=entry["labels"], start_time_unix_nano=started_ns, time_unix_nano=now, count=entry["count"],
            sum=entry["sum"], bucket_counts=counts,
            explicit_bounds=[bound for bound, _ in cumulative if bound != float("inf")], min=None, max=None))
    return points
