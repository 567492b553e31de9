"""Scraping vLLM's Prometheus /metrics into EngineSample rows.

Each scrape stores deltas since the previous good scrape of the same deployment. A counter (or a histogram count)
that went down means the engine restarted: the delta is then the new value itself (counted since the restart), and
the sample says `restarted`. A /metrics that is down, slow or not Prometheus text is a gap: a sample with ok=False
and the reason, a warning in the log, and the scraper goes on with the next deployment.

A vLLM pool (engines the panel did not start, channels/pools.py) is scraped the same way, each of its scrape URLs
under the outbound policy with its token: one sample per pool, its engines' deltas and queues summed (KV cache usage
averaged), each engine's cumulative values kept under its URL. An engine that fails keeps its last good values, so
its next good scrape counts what it missed; the sample names it and counts a gap."""
import contextlib
import logging
import math

import httpx
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from panel.channels.models import Channel, ChannelKind
from panel.channels.pools import scrape_headers
from panel.core import outbound
from panel.core.crypto import CredentialError
from panel.dashboards.models import EngineSample
from panel.dashboards.selectors import merge_histogram
from panel.serving.models import Deployment, DeploymentState

log = logging.getLogger(__name__)

# What we keep → the names vLLM has used for it, current first (DESIGN.md lists the older ones). The parser gives
# counter families without their `_total` suffix.
COUNTERS = {
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "preemptions": ("vllm:num_preemptions",),  # requests evicted mid-run for want of KV blocks
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


MAX_METRICS_BYTES = 8 * 1024 * 1024  # a pool's /metrics is read up to this much (vLLM's: tens of kilobytes)


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


def sample_from(*, deployment, parsed, previous, at, channel=None):
    """An unsaved EngineSample: deltas of `parsed` against the previous good sample's cumulative values (a pool's:
    `channel`, no deployment)."""
    before = previous.cumulative if previous is not None else None
    sample = EngineSample(deployment=deployment, channel=channel, team_id=(deployment or channel).team_id, at=at,
                          ok=True, cumulative=parsed,
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


def pool_scrape(*, channel, client=None, timeout=None):
    """Scrape every engine of a vLLM pool and store one EngineSample for the pool. Returns the sample."""
    timeout = settings.DASHBOARDS_SCRAPE_TIMEOUT_SECONDS if timeout is None else timeout
    previous = EngineSample.objects.filter(channel=channel, ok=True).order_by("-at", "-pk").first()
    before = previous.cumulative.get("engines", {}) if previous is not None else {}
    at, engines, parts, failures = timezone.now(), {}, [], []
    try:
        headers = scrape_headers(channel)
    except CredentialError as error:
        headers, failures = None, [f"the scrape token cannot be read: {error}"]
    with httpx.Client() if client is None else contextlib.nullcontext(client) as http:
        for url in channel.scrape_url_list() if headers is not None else ():
            try:
                parsed = _pool_read(url, headers, client=http, timeout=timeout)
            except ScrapeError as error:
                failures.append(f"{url}: {error}")
                if url in before:
                    engines[url] = before[url]  # its next good scrape counts from here
                continue
            engines[url] = parsed
            earlier = EngineSample(cumulative=before[url], at=previous.at) if url in before else None
            parts.append(sample_from(deployment=None, channel=channel, parsed=parsed, previous=earlier, at=at))
    if not parts:
        warning = "; ".join(failures) or "the pool has no scrape URLs"
        log.warning("scrape of pool channel %s failed: %s", channel.pk, warning)
        return EngineSample.objects.create(channel=channel, team_id=channel.team_id, at=at, ok=False,
                                           gaps=max(len(failures), 1), warning=warning[:2000])
    if failures:
        log.warning("scrape of pool channel %s: %s", channel.pk, "; ".join(failures))
    sample = _pool_sum(channel, parts, at=at, previous=previous)
    sample.cumulative, sample.gaps, sample.warning = {"engines": engines}, len(failures), "; ".join(failures)[:2000]
    sample.save()
    return sample


def _pool_read(url, headers, *, client, timeout):
    """One engine's /metrics, parsed; ScrapeError in words. The address connected to is the one the outbound policy
    checked, no redirect is followed and the body is read up to MAX_METRICS_BYTES."""
    try:
        pinned_url, extra, extensions = outbound.pinned(url)
        with client.stream("GET", pinned_url, headers={**extra, **headers}, extensions=extensions,
                                      timeout=timeout) as response:
            if response.status_code != 200:
                raise ScrapeError(f"/metrics answered HTTP {response.status_code}")
            body, cut = outbound.read_capped(response, MAX_METRICS_BYTES)
    except outbound.OutboundRefused as error:
        raise ScrapeError(f"the panel does not call this address: {error}") from None
    except httpx.TimeoutException:
        raise ScrapeError(f"/metrics did not answer within {timeout:g} s") from None
    except httpx.HTTPError as error:
        raise ScrapeError(f"/metrics is unreachable ({type(error).__name__}: {error})") from None
    if cut:
        raise ScrapeError(f"/metrics is larger than {MAX_METRICS_BYTES // (1024 * 1024)} MiB")
    return parse_metrics(body.decode("utf-8", errors="replace"))


def _pool_sum(channel, parts, *, at, previous):
    """One sample of the pool from its engines' samples: deltas and queues summed, KV cache usage averaged."""
    sample = EngineSample(channel=channel, team_id=channel.team_id, at=at, ok=True, ttft={}, itl={},
                          seconds=(at - previous.at).total_seconds() if previous is not None else 0,
                          restarted=any(part.restarted for part in parts))
    for name in COUNTERS:
        setattr(sample, name, sum(getattr(part, name) for part in parts))
    for name in ("running", "waiting"):
        values = [getattr(part, name) for part in parts if getattr(part, name) is not None]
        setattr(sample, name, sum(values) if values else None)
    usage = [part.kv_cache_usage for part in parts if part.kv_cache_usage is not None]
    sample.kv_cache_usage = sum(usage) / len(usage) if usage else None
    for part in parts:
        merge_histogram(sample.ttft, part.ttft)
        merge_histogram(sample.itl, part.itl)
    return sample


def pools_scrape():
    """One scrape of every enabled vLLM pool; a failing one never stops the others."""
    samples = []
    with httpx.Client() as client:
        for channel in Channel.objects.filter(kind=ChannelKind.POOL, enabled=True).exclude(scrape_urls=""):
            try:
                samples.append(pool_scrape(channel=channel, client=client))
            except Exception:  # a bug for one pool must not stop the scraper for all
                log.exception("scrape of pool channel %s crashed", channel.pk)
    return samples


def engine_readings(deployment_ids, since):
    """{deployment id: its good single-scrape samples since `since`, oldest first}: what the scaler decides on
    (serving/scaling.py)."""
    found = {}
    for sample in EngineSample.objects.filter(deployment_id__in=list(deployment_ids), ok=True, period=0,
                                              at__gte=since).order_by("at"):
        found.setdefault(sample.deployment_id, []).append(sample)
    return found
