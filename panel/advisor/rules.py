"""The advisor's rules: each is a small plain function that looks at one object and the numbers gathered for it
(panel/advisor/services.py) and returns a Recommendation (what triggered it, in numbers, and the fix) or None.

Profile checks that serving already makes (tensor parallel size, gpu_memory_utilization) come from
panel/serving/rules.py through `profile_check`: the advisor only turns its verdict into a recommendation."""
from dataclasses import dataclass, field

from django.urls import reverse

from panel.core.money import money_text
from panel.registry import memory
from panel.serving.rules import STABLE_UTILIZATION

LARGE_MAX_NUM_SEQS = 128  # 256 and anything near it: throughput first, latency second
MIN_REQUESTS = 20  # traffic-based rules say nothing on fewer requests than this
SHARED_PROMPT_MIN_VARIANTS = 5
LOW_CACHED_SHARE = 0.3
REPEATED_PREFIX_SHARE = 0.5
P99_RISE = 1.5
P99_RISE_MIN_MS = 200
RATE_LIMITED_MIN = 3
GOOD_RETRIES, GOOD_BACKOFF = 3, 1.5  # what a settings.json for a cloud fallback usually says
AWQ_SPARE_SHARE = 0.5  # FP16 weights would use at most half of the GPU's budget: AWQ saves memory nobody needs
LOCAL_DEARER = 1.5  # a local deployment's tokens cost this many times what the cloud would charge for them
LOCAL_MUCH_DEARER = 5  # ... and this many times is a problem, not a warning
CHANNEL_FAILURES_MIN = 5  # failed attempts on a channel before its traffic alone makes it a finding


@dataclass(frozen=True)
class Recommendation:
    rule: str
    title: str
    evidence: list
    fix: str
    link: str
    link_label: str
    severity: str = "warning"  # "problem" (act now), "warning" (worth doing), "info"
    key: str = field(default="", compare=False)  # the object it is about, for tests and anchors


def _gib(number):
    return f"{number / memory.GIB:.1f} GiB"


def _percent(share):
    return f"{100 * share:.0f}%"


# ------------------------------------------------------------------------------------------------- traffic

def shared_prompt_with_dynamic_part(*, model_name, route_id, requests, variants, prompt_tokens, cached_tokens):
    """Rule 1: many requests share one system prompt shape but arrive in many versions (a timestamp, an id or a
    name inside it) and the prefix cache rarely hits."""
    if requests < MIN_REQUESTS or variants < SHARED_PROMPT_MIN_VARIANTS or variants < 0.2 * requests:
        return None
    share = cached_tokens / prompt_tokens if prompt_tokens else 0.0
    if share >= LOW_CACHED_SHARE:
        return None
    return Recommendation(
        rule="dynamic_system_prompt", severity="problem", key=f"model:{model_name}",
        title=f"Requests to {model_name} miss the prefix cache: their system prompt changes every time",
        evidence=[f"{requests} requests share one system prompt shape but it came in {variants} different "
                  "versions: they differ only in a timestamp, an id or a name",
                  f"cached tokens were {_percent(share)} of {prompt_tokens:,} prompt tokens"],
        fix="Move the dynamic part (the time, the request or user id, the user's name) out of the system prompt "
            "into the user message. The system prompt is then identical across requests and the prefix cache "
            "computes it once.",
        link=reverse("route_detail", args=[route_id]) if route_id else reverse("channels"),
        link_label=f"route {model_name}")


def p99_rising_with_large_batch(*, profile, earlier_p99, recent_p99, samples):
    """Rule 2: TTFT P99 rises on a deployment whose profile runs many sequences at once."""
    if profile.max_num_seqs < LARGE_MAX_NUM_SEQS or samples < 2 * MIN_REQUESTS or not earlier_p99:
        return None
    if recent_p99 < earlier_p99 * P99_RISE or recent_p99 - earlier_p99 < P99_RISE_MIN_MS:
        return None
    return Recommendation(
        rule="p99_rising", key=f"profile:{profile.pk}",
        title=f"{profile.name}: P99 latency is rising with max_num_seqs = {profile.max_num_seqs}",
        evidence=[f"time to first token P99 went from {earlier_p99:,.0f} ms to {recent_p99:,.0f} ms "
                  f"(earlier half against the recent half of its last {samples} requests)",
                  f"max_num_seqs = {profile.max_num_seqs}: long requests crowd short ones out of each step"],
        fix="Split it into two deployments: a low-latency one (max_num_seqs 16-32, chunked prefill on) for "
            f"interactive traffic and a high-throughput one (max_num_seqs {profile.max_num_seqs}) for batch "
            "jobs, each behind its own route. The max_num_seqs sweep in Benchmarks finds the "
            "low-latency value.",
        link=reverse("profile_detail", args=[profile.pk]), link_label=f"profile {profile.name}")


def cloud_rate_limited(*, route, cloud_channels, limited, ended, requests):
    """Rule 3: a route's requests meet 429s from a cloud channel (`limited`, of which `ended` ended in one)."""
    if limited < RATE_LIMITED_MIN or not cloud_channels:
        return None
    fixes = [f"raise max_retries to {GOOD_RETRIES} and retry_backoff to {GOOD_BACKOFF:g} s on {channel.name} "
             "(the gateway also waits out Retry-After, up to 5 s)"
             for channel in cloud_channels
             if channel.max_retries < GOOD_RETRIES or channel.retry_backoff < GOOD_BACKOFF]
    has_local = any(entry.channel.is_local for entry in route.routechannel_set.all())
    if route.strategy != "local_first" or not has_local:
        fixes.append("route local_first with a local deployment first, so the cloud takes only the overflow")
    if not fixes:
        fixes.append("the provider's quota is the limit: ask for a higher one, or add local capacity")
    names = ", ".join(channel.name for channel in cloud_channels)
    return Recommendation(
        rule="cloud_429", severity="problem", key=f"route:{route.pk}",
        title=f"{route.model_name}: the cloud channel answers 429 (rate limited)",
        evidence=[f"{limited} of {requests} requests ended in 429 from {names}" if ended == limited else
                  f"{limited} of {requests} requests met a 429 from {names}; {ended} ended in one (retries absorbed "
                  "the rest, at the cost of latency)",
                  f"strategy {route.strategy}; " + "; ".join(
                      f"{channel.name}: {channel.max_retries} retries, backoff {channel.retry_backoff:g} s"
                      for channel in cloud_channels)],
        fix="Back off and keep the cloud for overflow: " + "; ".join(fixes) + ".",
        link=reverse("route_detail", args=[route.pk]), link_label=f"route {route.model_name}")


def prefix_caching_off(*, profile, repeated, requests):
    """Rule 6: a profile without prefix caching serves requests that repeat one system prompt."""
    if profile.enable_prefix_caching or requests < MIN_REQUESTS or repeated < REPEATED_PREFIX_SHARE * requests:
        return None
    return Recommendation(
        rule="prefix_caching_off", key=f"profile:{profile.pk}",
        title=f"{profile.name}: prefix caching is off but its requests repeat one system prompt",
        evidence=[f"{repeated} of {requests} requests ({_percent(repeated / requests)}) began with the same "
                  "system prompt", "enable_prefix_caching = false"],
        fix="Turn enable_prefix_caching on in the profile and redeploy: the shared prefix's KV cache is then "
            "computed once and reused, cutting prompt tokens computed and TTFT.",
        link=reverse("profile_detail", args=[profile.pk]), link_label=f"profile {profile.name}")


def local_dearer_than_cloud(*, line, deployment, baseline_name):
    """Rule 9: a priced local deployment whose tokens cost more than the cloud baseline channel would charge for the
    same tokens (the Cost tab's figures: GPU hours × price against the baseline's prices)."""
    if deployment is None or line.cost is None or not line.baseline or not line.tokens or not line.gpu_hours:
        return None
    ratio = line.cost / line.baseline
    if ratio < LOCAL_DEARER:
        return None
    served = line.tokens / line.gpu_hours
    break_even = line.hourly / (line.baseline / line.tokens)
    baseline_per_million = line.baseline / line.tokens * 1_000_000
    return Recommendation(
        rule="local_dearer", severity="problem" if ratio >= LOCAL_MUCH_DEARER else "warning",
        key=f"deployment:{deployment.pk}",
        title=f"{line.name} costs {ratio:.1f}× what {baseline_name} would charge for the same tokens",
        evidence=[f"{line.gpu_hours:,.1f} hours up at {money_text(line.hourly)} an hour = {money_text(line.cost)} "
                  f"for {line.tokens:,} tokens: {money_text(line.per_million)} per 1M tokens",
                  f"{baseline_name} would have charged {money_text(line.baseline)}: "
                  f"{money_text(baseline_per_million)} per 1M tokens",
                  f"it served {served:,.0f} tokens an hour; it is cheaper than the cloud above {break_even:,.0f}"],
        fix="A GPU costs the same whether it serves or idles, so local serving pays off only when it is busy. Send "
            "it more traffic (more routes or teams on it), batch more (the max_num_seqs sweep in Benchmarks finds "
            "how far), serve a quantized child on a smaller, cheaper GPU, or stop it while traffic is low and let "
            "the route fall back to the cloud channel.",
        link=reverse("deployment_detail", args=[deployment.pk]), link_label=f"deployment #{deployment.pk}")


def idle_deployment(*, line, deployment, window_hours):
    """Rule 11: a priced deployment that was up for an hour or more of the window and served nothing."""
    if deployment is None or line.tokens or line.requests or not line.cost or line.gpu_hours < 1:
        return None
    return Recommendation(
        rule="idle_deployment", key=f"deployment:{deployment.pk}",
        title=f"Deployment #{deployment.pk} served nothing in the last {window_hours} h",
        evidence=[f"{line.gpu_hours:,.1f} hours up at {money_text(line.hourly)} an hour = {money_text(line.cost)}, "
                  "for 0 requests"],
        fix="Stop it while nothing needs it: its profile launches it again in about a minute, and a route with a "
            "cloud channel carries the requests meanwhile. Or point the traffic it was meant for at it (a route "
            "named after its served model).",
        link=reverse("deployment_detail", args=[deployment.pk]), link_label=f"deployment #{deployment.pk}")


def channel_failing(*, channel, failures, answered, outcome_words):
    """Rule 10: a channel that fails its attempts (`failures`: outcome -> failed attempts in the window; `answered`:
    requests it answered) or whose last Test failed. A fallback channel that cannot be reached is found here before
    the day the local deployment is down and every request needs it."""
    failed = sum(failures.values())
    if not channel.test_failure and (failed < CHANNEL_FAILURES_MIN or failed < answered):
        return None
    evidence = []
    if failed:
        parts = ", ".join(f"{count} {outcome_words.get(outcome, outcome)}" for outcome, count in failures.most_common())
        evidence.append(f"{failed} attempts failed ({parts}); it answered {answered} requests")
    if channel.test_failure:
        evidence.append(channel.test_failure)
    return Recommendation(
        rule="channel_failing", severity="problem", key=f"channel:{channel.pk}",
        title=f"{channel.name} is failing",
        evidence=evidence,
        fix="Open the channel and press Test: it says which step fails (the name does not resolve, the connection "
            "is refused, the key is refused, the model is unknown) and what to change. A route falls back past a "
            "failing channel, at the cost of latency on every request; a fallback that fails leaves nothing behind "
            "the local deployment.",
        link=reverse("channel_detail", args=[channel.pk]), link_label=f"channel {channel.name}")


# ------------------------------------------------------------------------------------------------- configuration

def tensor_parallel_mismatch(*, profile, verdict):
    """Rule 4: tensor_parallel_size does not split the model's attention heads (serving's rule says why)."""
    messages = verdict.errors.get("tensor_parallel_size") or []
    message = next((text for text in messages if "attention heads" in text), None)
    if message is None:
        return None
    model = profile.model
    return Recommendation(
        rule="tensor_parallel", severity="problem", key=f"profile:{profile.pk}",
        title=f"{profile.name}: tensor_parallel_size {profile.tensor_parallel_size} does not divide the heads",
        evidence=[f"{model.name} has {model.num_attention_heads} attention heads and {model.num_kv_heads} KV heads",
                  f"tensor_parallel_size = {profile.tensor_parallel_size}"],
        fix=message, link=reverse("profile_detail", args=[profile.pk]), link_label=f"profile {profile.name}")


def awq_group_size_256(*, model):
    """Rule 5: an AWQ checkpoint quantized with group size 256."""
    quantization = model.quantization or {}
    if str(quantization.get("method", "")).lower() != "awq" or quantization.get("group_size") != 256:
        return None
    return Recommendation(
        rule="awq_group_256", key=f"model:{model.pk}",
        title=f"{model.name} is AWQ with group size 256",
        evidence=[f"quantization {model.quantization_label}: one scale per 256 weights"],
        fix="Quantize again with group size 128, the usual value: 256 is a little faster but loses more "
            "accuracy, and structured output (JSON) suffers first. Roll the new model out "
            "with a canary and watch JSON failures.",
        link=reverse("model_detail", args=[model.pk]), link_label=f"model {model.name}")


def gpu_memory_utilization_off(*, profile, verdict):
    """Rule 7: gpu_memory_utilization outside the stable 0.85-0.92 (serving's rule gives the reason)."""
    low, high = STABLE_UTILIZATION
    value = profile.gpu_memory_utilization
    if low <= value <= high:
        return None
    reason = next(iter(verdict.errors.get("gpu_memory_utilization") or []), None) or next(
        (text for text in verdict.warnings if text.startswith("GPU memory utilization")), "")
    return Recommendation(
        rule="gpu_memory_utilization", severity="problem" if "gpu_memory_utilization" in verdict.errors
        else "warning", key=f"profile:{profile.pk}",
        title=f"{profile.name}: gpu_memory_utilization {value:.2f} is outside {low}-{high}",
        evidence=[f"gpu_memory_utilization = {value:.2f}; the stable range is {low}-{high}"],
        fix=f"{reason} Set it to 0.90.".strip(),
        link=reverse("profile_detail", args=[profile.pk]), link_label=f"profile {profile.name}")


def awq_with_memory_to_spare(*, deployment, gpu_bytes, gpu_name):
    """Rule 8: weight-only AWQ served on a GPU with room for the FP16 weights several times over."""
    profile = deployment.profile
    model = profile.model
    is_awq = profile.quantization == "awq" or str((model.quantization or {}).get("method", "")).lower() == "awq"
    if not is_awq or not gpu_bytes:
        return None
    source = model.parent or model
    devices = max(1, profile.tensor_parallel_size * profile.pipeline_parallel_size)
    fp16 = memory.weight_bytes(parameters=source.parameter_count, linear_parameters=source.linear_parameter_count,
                               precision="fp16") / devices
    budget = gpu_bytes * profile.gpu_memory_utilization
    if fp16 + memory.RUNTIME_RESERVE_BYTES > AWQ_SPARE_SHARE * budget:
        return None
    return Recommendation(
        rule="awq_spare_memory", severity="info", key=f"deployment:{deployment.pk}",
        title=f"{profile.name} serves 4-bit AWQ on a GPU with memory to spare",
        evidence=[f"{gpu_name}: {_gib(gpu_bytes)} per GPU; the engine's budget is "
                  f"{profile.gpu_memory_utilization:.2f} × {_gib(gpu_bytes)} = {_gib(budget)}",
                  f"the FP16 weights would take {_gib(fp16)} per GPU ({_percent(fp16 / budget)} of the budget)"],
        fix="Benchmark the FP16 (or FP8) model against this deployment on the same workload (Benchmarks). "
            "Weight-only INT4 dequantizes weights inside every matrix multiply: on a GPU with memory to spare "
            "and at large batches it can be slower than FP16 or FP8. Keep AWQ only if it wins, or if the "
            "memory goes to a larger KV cache.",
        link=reverse("deployment_detail", args=[deployment.pk]), link_label=f"deployment #{deployment.pk}")


def canary_rolled_back(*, route):
    """Not one of the issue's eight: a canary that tripped its guards, with why, until a new one starts."""
    if route.canary_state != "rolled_back":
        return None
    candidate = route.canary_channel.name if route.canary_channel else "the candidate"
    return Recommendation(
        rule="canary_rolled_back", severity="problem", key=f"route:{route.pk}",
        title=f"The canary of {candidate} on {route.model_name} was rolled back",
        evidence=[route.canary_reason or "a guard tripped"],
        fix="Fix the candidate before the next canary (for JSON failures after AWQ: quantize with group size 128 "
            "and a calibration set from your domain, or serve FP8), then start again at 5%.",
        link=reverse("route_detail", args=[route.pk]), link_label=f"route {route.model_name}")
