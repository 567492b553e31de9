"""The advisor: gather a team's traffic (RequestLog, the last ADVISOR_WINDOW_HOURS), serving profiles,
deployments, models and hosts, and run every rule of panel/advisor/rules.py over them."""
from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max, Q, Sum
from django.urls import reverse
from django.utils import timezone

from panel.advisor import rules
from panel.channels.canary import p99
from panel.channels.models import ChannelKind, Route, listed_channels
from panel.dashboards.cost import cost_summary
from panel.dashboards.home import Attention
from panel.dashboards.requests import OUTCOME_WORDS, SCAN_LIMIT
from panel.dashboards.selectors import RANGES, DashboardQuery
from panel.registry.models import RegisteredModel
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, ServingProfile
from panel.serving.services import profile_check
from panel.usage.models import PLACEMENT_STEPS, RequestLog

SEVERITY_ORDER = {"problem": 0, "warning": 1, "info": 2}
CHECKS = [  # what the page lists as looked at, in the order
    ("dynamic_system_prompt", "System prompts that change on every request (timestamp, id, name) and miss the "
                              "prefix cache"),
    ("p99_rising", f"P99 latency rising on a profile with max_num_seqs ≥ {rules.LARGE_MAX_NUM_SEQS}"),
    ("cloud_429", "429s from a cloud channel"),
    ("tensor_parallel", "tensor_parallel_size that does not divide the attention heads"),
    ("awq_group_256", "AWQ models quantized with group size 256"),
    ("prefix_caching_off", "Prefix caching off on a profile whose requests repeat a prefix"),
    ("gpu_memory_utilization", "gpu_memory_utilization outside 0.85-0.92"),
    ("awq_spare_memory", "Weight-only AWQ on a GPU with plenty of memory (can be slower than FP16/FP8)"),
    ("canary_rolled_back", "Canary rollouts that were rolled back"),
    ("local_dearer", f"Local deployments whose tokens cost more than {rules.LOCAL_DEARER:g}× the cloud's price for "
                     "them"),
    ("channel_failing", "Channels that fail their requests or their last Test"),
    ("idle_deployment", "Priced deployments that served nothing for an hour or more"),
]


def _traffic(team, since):
    return RequestLog.objects.filter(team=team, created_at__gte=since)


def _dynamic_prompts(team, since):
    groups = (_traffic(team, since).exclude(system_prompt_shape_hash="")
              .values("model", "system_prompt_shape_hash")
              .annotate(requests=Count("id"), variants=Count("system_prompt_hash", distinct=True),
                        prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens"), route_id=Max("route_id")))
    for group in groups:
        yield rules.shared_prompt_with_dynamic_part(
            model_name=group["model"], route_id=group["route_id"], requests=group["requests"],
            variants=group["variants"], prompt_tokens=group["prompt"] or 0, cached_tokens=group["cached"] or 0)


def _profile_traffic(team, since, profile):
    return _traffic(team, since).filter(channel__deployment__profile=profile)


def _p99_rising(team, since, profile):
    ttfts = list(_profile_traffic(team, since, profile).filter(outcome="ok", ttft_ms__isnull=False)
                 .order_by("created_at").values_list("ttft_ms", flat=True))
    half = len(ttfts) // 2
    return rules.p99_rising_with_large_batch(profile=profile, earlier_p99=p99(ttfts[:half]),
                                             recent_p99=p99(ttfts[half:]) or 0, samples=len(ttfts))


def _prefix_caching(team, since, profile):
    hashes = list(_profile_traffic(team, since, profile).exclude(system_prompt_hash="")
                  .values_list("system_prompt_hash", flat=True))
    repeated = Counter(hashes).most_common(1)[0][1] if hashes else 0
    return rules.prefix_caching_off(profile=profile, repeated=repeated, requests=len(hashes))


def _cloud_429(team, since, route):
    cloud = [entry.channel for entry in route.routechannel_set.all() if entry.channel.kind == ChannelKind.REMOTE]
    if route.canary_channel and route.canary_channel.kind == ChannelKind.REMOTE:
        cloud.append(route.canary_channel)
    ended = Q(error_kind="rate_limited", status_code=429)
    counts = _traffic(team, since).filter(route=route).aggregate(
        requests=Count("id"), limited=Count("id", filter=ended | Q(rate_limited_attempts__gt=0)),
        ended=Count("id", filter=ended))
    # A request that met a 429 met it from the route's cloud channels (a local vLLM does not answer 429); one that
    # ended in 429 was refused last by them (cloud channels come last in local_first, or are the only ones).
    return rules.cloud_rate_limited(route=route, cloud_channels=cloud, limited=counts["limited"],
                                    ended=counts["ended"], requests=counts["requests"])


def _awq_spare(deployment):
    host = deployment.host
    if host is None or host.kind != "gpu" or not host.gpus:
        return None
    used = [gpu for gpu in host.gpus if gpu.get("index") in (deployment.gpu_indices or [])] or host.gpus
    smallest = min(used, key=lambda gpu: gpu.get("memory_bytes") or 0)
    return rules.awq_with_memory_to_spare(deployment=deployment, gpu_bytes=smallest.get("memory_bytes") or 0,
                                          gpu_name=smallest.get("name") or "GPU")


def _local_costs(team, now):
    """The Cost tab's figures over the advisor's window (the shortest dashboard range that covers it)."""
    hours = settings.ADVISOR_WINDOW_HOURS * 3600
    name = min((name for name, span in RANGES.items() if span >= hours), key=RANGES.get, default="30d")
    summary = cost_summary(DashboardQuery(team=team, range=name, now=now.timestamp()))
    lines = [line for line in summary.lines if line.kind == "local" and line.deployment_id]
    deployments = Deployment.objects.in_bulk([line.deployment_id for line in lines])
    for line in lines:
        deployment = deployments.get(line.deployment_id)
        yield rules.idle_deployment(line=line, deployment=deployment, window_hours=settings.ADVISOR_WINDOW_HOURS)
        if summary.baseline_channel is not None:
            yield rules.local_dearer_than_cloud(line=line, deployment=deployment,
                                                baseline_name=summary.baseline_channel.name)


def _channel_failures(team, since):
    """Failed attempts per channel from the attempt trails of the window's requests that failed or retried (the
    latest SCAN_LIMIT of them), and the requests each channel answered."""
    failures = {}
    rows = _traffic(team, since).filter(Q(attempts__gt=1) | ~Q(outcome="ok")).order_by("-created_at")
    for trail in rows.values_list("attempt_trail", flat=True)[:SCAN_LIMIT]:
        for step in trail or ():
            if step.get("outcome") != "ok" and step.get("outcome") not in PLACEMENT_STEPS and step.get("channel_id"):
                failures.setdefault(step["channel_id"], Counter())[step.get("outcome") or "?"] += 1
    answered = dict(_traffic(team, since).filter(outcome="ok").values_list("channel_id").annotate(Count("id")))
    live = Q(kind=ChannelKind.REMOTE) | Q(deployment__state__in=list(ACTIVE_DEPLOYMENT_STATES))
    for channel in listed_channels(team).filter(live, enabled=True):
        yield rules.channel_failing(channel=channel, failures=failures.get(channel.pk, Counter()),
                                    answered=answered.get(channel.pk, 0), outcome_words=OUTCOME_WORDS)


def problems_attention(*, team):
    """The overview's line for the advisor's problems ([] when there are none); failing channels are left out, the
    overview lists them itself."""
    problems = [item for item in advice(team=team) if item.severity == "problem" and item.rule != "channel_failing"]
    if not problems:
        return []
    return [Attention(f"Advisor: {len(problems)} problem{'s' if len(problems) != 1 else ''}",
                      "; ".join(item.title for item in problems[:3]) + ("; …" if len(problems) > 3 else ""),
                      reverse("advisor"))]


def advice(*, team, now=None):
    """Every recommendation for `team`, most urgent first."""
    now = now or timezone.now()
    since = now - timedelta(hours=settings.ADVISOR_WINDOW_HOURS)
    found = list(_dynamic_prompts(team, since))
    profiles = ServingProfile.objects.filter(team=team).select_related("model")
    for profile in profiles:
        verdict = profile_check(profile)
        found += [_p99_rising(team, since, profile), rules.tensor_parallel_mismatch(profile=profile, verdict=verdict),
                  _prefix_caching(team, since, profile),
                  rules.gpu_memory_utilization_off(profile=profile, verdict=verdict)]
    routes = Route.objects.filter(team=team).select_related("canary_channel").prefetch_related(
        "routechannel_set__channel")
    for route in routes:
        found += [_cloud_429(team, since, route), rules.canary_rolled_back(route=route)]
    for model in RegisteredModel.objects.filter(team=team):
        found.append(rules.awq_group_size_256(model=model))
    deployments = Deployment.objects.filter(team=team, state__in=ACTIVE_DEPLOYMENT_STATES).select_related(
        "profile__model__parent", "host")
    for deployment in deployments:
        found.append(_awq_spare(deployment))
    found += list(_local_costs(team, now)) + list(_channel_failures(team, since))
    found = [item for item in found if item is not None]
    found.sort(key=lambda item: SEVERITY_ORDER.get(item.severity, 9))
    return found
