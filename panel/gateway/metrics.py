"""The panel's own Prometheus metrics, for teams that already run Grafana: gateway requests, errors, fallbacks and
TTFT, counted in the process that serves /v1 and exposed at /metrics by the same process (panel.dashboards.views).
Labels are the endpoint, the outcome and the model name of a route (REFUSED for a request refused before a route
was found: a name the client made up must not grow the label set); never a key or a team's secret."""
from prometheus_client import CollectorRegistry, Counter, Histogram

from panel.usage.models import PLACEMENT_STEPS

registry = CollectorRegistry(auto_describe=True)
REFUSED = "(refused)"  # the model label of a request refused before a route was found

REQUESTS = Counter("tokenwise_gateway_requests", "Gateway requests, by endpoint, model and outcome",
                   ("endpoint", "model", "outcome"), registry=registry)
ERRORS = Counter("tokenwise_gateway_errors", "Gateway requests that ended in an error, by kind",
                 ("endpoint", "model", "kind"), registry=registry)
# Per failed upstream attempt, retried or fallen back from or not: which channel fails, and how (the channel's name,
# which its team chose; a placement step such as a spill is no attempt).
ATTEMPT_FAILURES = Counter("tokenwise_gateway_attempt_failures", "Failed upstream attempts, by channel and outcome",
                           ("channel", "outcome"), registry=registry)
FALLBACKS = Counter("tokenwise_gateway_fallbacks", "Requests answered by a later channel than the first",
                    ("endpoint", "model"), registry=registry)
TOKENS = Counter("tokenwise_gateway_tokens", "Tokens through the gateway, by direction", ("model", "direction"),
                 registry=registry)
TTFT = Histogram("tokenwise_gateway_time_to_first_token_seconds", "Time to the first content byte",
                 ("model",), registry=registry,
                 buckets=(0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60))
COST = Counter("tokenwise_gateway_cost", "What gateway requests cost, in the panel's currency (the usage rows' cost)",
               ("model",), registry=registry)
LATENCY = Histogram("tokenwise_gateway_request_latency_seconds", "Whole request, first byte in to last byte out",
                    ("model",), registry=registry,
                    buckets=(0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60))


def gateway_request_observe(*, fields, fell_back, refused=False, trail=()):
    """Count one finished gateway request (the same facts as its usage record); `refused`: it never reached a
    route (no key, a model the key may not use or no route serves), so its model name is the client's; `trail`: its
    attempt trail, whose failed attempts are counted by channel."""
    endpoint, outcome = fields.get("endpoint", ""), fields.get("outcome", "")
    model = REFUSED if refused else fields.get("model", "")[:80]
    REQUESTS.labels(endpoint, model, outcome).inc()
    if outcome == "error":
        ERRORS.labels(endpoint, model, fields.get("error_kind") or "unknown").inc()
    if fell_back:
        FALLBACKS.labels(endpoint, model).inc()
    for step in trail:
        if step.get("outcome") not in ("ok", *PLACEMENT_STEPS):
            ATTEMPT_FAILURES.labels(str(step.get("channel") or "?")[:80], step.get("outcome") or "?").inc()
    TOKENS.labels(model, "prompt").inc(fields.get("prompt_tokens") or 0)
    TOKENS.labels(model, "completion").inc(fields.get("completion_tokens") or 0)
    COST.labels(model).inc(float(fields.get("cost") or 0))
    if fields.get("ttft_ms") is not None:
        TTFT.labels(model).observe(fields["ttft_ms"] / 1000)
    LATENCY.labels(model).observe(fields.get("latency_ms", 0) / 1000)
