"""Scraping vLLM's Prometheus /metrics into EngineSample rows.

Each scrape stores deltas since the previous good scrape of the same deployment. A counter (or a histogram count)
that went down means the engine restarted: the delta is then the new value itself (counted since the restart), and
the sample says `restarted`. A /metrics that is down, slow or not Prometheus text is a gap: a sample with ok=False
and the reason, a warning in the log, and the scraper goes on with the next deployment."""
import logging
import math

import httpx
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from panel.core.crypto import CredentialError
from panel.dashboards.models import EngineSample
from panel.serving.models import Deployment, DeploymentState

log = logging.getLogger(__name__)

# What we keep → the names vLLM has used for it, current first (DESIGN.md lists the older ones). The parser gives
# counter families without their `_total` suffix.
COUNTERS = {
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
}
GAUGES = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}


class ScrapeError(Exception):
    """Why a /metrics could not be read, in words."""


def metrics_url(deployment):
    """vLLM serves /metrics at the server's root; base_url is the OpenAI root (…/v1)."""
    base = deployment.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return f"{base}/metrics"


def metrics_headers(deployment):
    """The engine's key: every path of a deployment's engine needs it, /metrics too (engine/api_key_guard.py)."""
    try:
        key = deployment.engine_key()
    except CredentialError as error:
        raise ScrapeError(f"the engine's key cannot be read: {error}") from None
    return {"Authorization": f"Bearer {key}"} if key else {}


def parse_metrics(text):
    """Prometheus text → {"counters": {name: value}, "gauges": {...}, "histograms": {name: {"le", "count", "sum"}}},
    summed over label sets (one engine per deployment, but vLLM labels by model and engine index). Raises
    ScrapeError when the text is not Prometheus exposition or holds none of vLLM's metrics."""
    try:
        families = {family.name: family for family in text_string_to_metric_families(text)}
    except Exception as error:  # the parser raises ValueError, IndexError... on garbage
        raise ScrapeError(f"/metrics is not Prometheus text ({type(error).__name__}: {str(error)[:120]})") from None
    found = {"counters": {}, "gauges": {}, "histograms": {}}
    for kind, table in (("counters", COUNTERS), ("gauges", GAUGES)):
        for ours, names in table.items():
            family = _first(families, names)
            if family is not None:
                values = [sample.value for sample in family.samples
                          if not sample.name.endswith("_created") and math.isfinite(sample.value)]
                if values:
                    found[kind][ours] = sum(values)
    for ours, names in HISTOGRAMS.items():
        family = _first(families, names)
        if family is None:
            continue
        histogram = {"le": {}, "count": 0.0, "sum": 0.0}
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = sample.labels.get("le", "+Inf")
                histogram["le"][bound] = histogram["le"].get(bound, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                histogram["count"] += sample.value
            elif sample.name.endswith("_sum"):
                histogram["sum"] += sample.value
        found["histograms"][ours] = histogram
    if not any(found.values()):
        raise ScrapeError("/metrics answered but has none of vLLM's metrics (is this a vLLM server?)")
    return found


def _first(families, names):
    # prometheus_client writes `# TYPE x_total counter` and its parser names that family `x`; a hand-written
    # exposition with `# TYPE x counter` leaves the samples in an untyped family `x_total`. Accept both.
    for name in names:
        for candidate in (name, f"{name}_total"):
            family = families.get(candidate)
            if family is not None and family.samples:
                return family
    return None


def sample_from(*, deployment, parsed, previous, at):
    """An unsaved EngineSample: deltas of `parsed` against the previous good sample's cumulative values."""
    before = previous.cumulative if previous is not None else None
    sample = EngineSample(deployment=deployment, team_id=deployment.team_id, at=at, ok=True, cumulative=parsed,
                          kv_cache_usage=parsed["gauges"].get("kv_cache_usage"),
                          running=parsed["gauges"].get("running"), waiting=parsed["gauges"].get("waiting"))
    if before is None:
        return sample  # the first scrape only sets the baseline: its counters hold the engine's whole past
    sample.seconds = (at - previous.at).total_seconds()
    sample.restarted = _went_down(parsed, before)
    for name in COUNTERS:
        now, then = parsed["counters"].get(name, 0.0), before.get("counters", {}).get(name, 0.0)
        setattr(sample, name, now if sample.restarted else max(now - then, 0.0))
    for name in HISTOGRAMS:
        now = parsed["histograms"].get(name)
        if now is None:
            continue
        then = {"le": {}, "count": 0.0, "sum": 0.0} if sample.restarted else \
            before.get("histograms", {}).get(name, {"le": {}, "count": 0.0, "sum": 0.0})
        setattr(sample, name, {"le": {bound: max(value - then["le"].get(bound, 0.0), 0.0)
                                      for bound, value in now["le"].items()},
                               "count": max(now["count"] - then["count"], 0.0),
                               "sum": max(now["sum"] - then["sum"], 0.0)})
    return sample


def _went_down(parsed, before):
    for name, value in parsed["counters"].items():
        if value < before.get("counters", {}).get(name, 0.0):
            return True
    for name, histogram in parsed["histograms"].items():
        if histogram["count"] < before.get("histograms", {}).get(name, {}).get("count", 0.0):
            return True
    return False


def deployment_scrape(*, deployment, client=None, timeout=None):
    """Scrape one deployment and store one EngineSample (a gap when it fails). Returns the sample."""
    timeout = settings.DASHBOARDS_SCRAPE_TIMEOUT_SECONDS if timeout is None else timeout
    previous = (EngineSample.objects.filter(deployment=deployment, ok=True).order_by("-at", "-pk").first())
    try:
        try:
            response = (client or httpx).get(metrics_url(deployment), headers=metrics_headers(deployment),
                                             timeout=timeout)
        except httpx.TimeoutException:
            raise ScrapeError(f"/metrics did not answer within {timeout:g} s") from None
        except httpx.HTTPError as error:
            raise ScrapeError(f"/metrics is unreachable ({type(error).__name__}: {error})") from None
        if response.status_code != 200:
            raise ScrapeError(f"/metrics answered HTTP {response.status_code}")
        parsed = parse_metrics(response.text)
    except ScrapeError as error:
        log.warning("scrape of deployment %s (%s) failed: %s", deployment.pk, metrics_url(deployment), error)
        return EngineSample.objects.create(deployment=deployment, team_id=deployment.team_id, at=timezone.now(),
                                           ok=False, gaps=1, warning=str(error))
    sample = sample_from(deployment=deployment, parsed=parsed, previous=previous, at=timezone.now())
    sample.save()
    return sample


def deployments_scrape():
    """One scrape of every ready deployment; a failing one never stops the others."""
    samples = []
    with httpx.Client() as client:
        for deployment in Deployment.objects.filter(state=DeploymentState.READY).exclude(base_url=""):
            try:
                samples.append(deployment_scrape(deployment=deployment, client=client))
            except Exception:  # a bug for one deployment must not stop the scraper for all
                log.exception("scrape of deployment %s crashed", deployment.pk)
    return samples


def engine_readings(deployment_ids, since):
    """{deployment id: its good single-scrape samples since `since`, oldest first}: what the scaler decides on
    (serving/scaling.py)."""
    found = {}
    for sample in EngineSample.objects.filter(deployment_id__in=list(deployment_ids), ok=True, period=0,
                                              at__gte=since).order_by("at"):
        found.setdefault(sample.deployment_id, []).append(sample)
    return found
