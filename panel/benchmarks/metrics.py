"""A benchmark's figures in the terms `vllm bench serve` uses, so a Tokenwise result sits beside an upstream one.

Per successful request (vllm/benchmarks/serve.py, calculate_metrics):
- TTFT: from sending the request to the first chunk that carries tokens;
- E2EL (end-to-end latency): from sending it to the last chunk with choices;
- TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token (0 for goodput);
- ITL: the gaps between the chunks that carry tokens. A chunk that brings k tokens at once (several SSE events in
  one network read, speculative decoding, a server's stream interval) contributes k gaps of its interval / k, so
  a burst is not read as k near-zero gaps; vLLM's own openai-chat client records one gap per chunk, which is the
  same figure when every chunk carries one token (vLLM's default stream).
For each: mean, median, population std, p90 and p99 (numpy's linear percentile), in milliseconds, named as vLLM
names them (mean_ttft_ms, p99_itl_ms, ...). Request, output-token and total-token throughput over the measured
wall time; request goodput: requests per second that met every SLO the user set (TTFT, TPOT, E2EL in ms)."""
import math

from panel.core.percentiles import percentile  # noqa: F401  (the benchmarks' callers import it from here)

FAMILIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)
STATS = ("mean", "median", "std") + tuple(f"p{p}" for p in PERCENTILES)
SLO_KEYS = ("ttft", "tpot", "e2el")


def stats_ms(family, values):
    """{mean,median,std,p90,p99}_<family>_ms of `values` (seconds). Like vLLM, an empty list reads as [0]."""
    values = list(values) or [0.0]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / len(values))
    figures = {"mean": mean, "median": percentile(values, 50), "std": std}
    figures.update({f"p{p}": percentile(values, p) for p in PERCENTILES})
    return {f"{stat}_{family}_ms": round(figures[stat] * 1000, 4) for stat in STATS}


def chunk_itls(arrivals):
    """Per-token gaps from `arrivals`: (seconds since the request was sent, tokens the chunk brought) for each chunk
    that brought tokens, in order. The first chunk is the TTFT; each later chunk of k tokens adds k gaps of
    (its time - the previous chunk's time) / k."""
    gaps = []
    for (before, _), (now, tokens) in zip(arrivals, arrivals[1:]):
        if tokens > 0:
            gaps.extend([(now - before) / tokens] * tokens)
    return gaps


def request_tpot(sample):
    if sample.output_tokens > 1:
        return (sample.latency - sample.ttft) / (sample.output_tokens - 1)
    return None


def goodput_count(ok, slo):
    """Requests that met every SLO (milliseconds) in `slo` ({"ttft": .., "tpot": .., "e2el": ..}, None = unset)."""
    limits = {key: value / 1000 for key, value in (slo or {}).items() if value}
    if not limits:
        return None
    good = 0
    for sample in ok:
        measured = {"ttft": sample.ttft, "tpot": request_tpot(sample) or 0.0, "e2el": sample.latency}
        if all(measured[key] <= limit for key, limit in limits.items()):
            good += 1
    return good


def summarize(samples, seconds, slo=None):
    """The figures a run records from its measured samples and wall time: vLLM's keys first, then Tokenwise's own
    (errors by kind, the first error's words, which channels a route sent to)."""
    ok = [sample for sample in samples if sample.ok]
    errors = [sample for sample in samples if not sample.ok]
    seconds = max(seconds, 1e-9)
    total_output = sum(sample.output_tokens for sample in ok)
    total_input = sum(sample.prompt_tokens for sample in ok)
    good = goodput_count(ok, slo)
    result = {
        "duration": round(seconds, 4), "completed": len(ok), "failed": len(errors),
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": round(len(ok) / seconds, 4),
        "request_goodput": None if good is None else round(good / seconds, 4),
        "output_throughput": round(total_output / seconds, 4),
        "total_token_throughput": round((total_input + total_output) / seconds, 4),
    }
    tpots = [tpot for tpot in (request_tpot(sample) for sample in ok) if tpot is not None]
    result.update(stats_ms("ttft", [sample.ttft for sample in ok]))
    result.update(stats_ms("tpot", tpots))
    result.update(stats_ms("itl", [gap for sample in ok for gap in sample.itl]))
    result.update(stats_ms("e2el", [sample.latency for sample in ok]))
    error_kinds, targets = {}, {}
    for sample in errors:
        kind = sample.error.split(":")[0]
        error_kinds[kind] = error_kinds.get(kind, 0) + 1
    for sample in samples:
        if sample.target:
            targets[sample.target] = targets.get(sample.target, 0) + 1
    result.update({
        "requests": len(samples), "error_rate": round(len(errors) / len(samples), 4) if samples else 0.0,
        "error_kinds": error_kinds, "first_error": errors[0].error if errors else "",
        "goodput_slo": {key: value for key, value in (slo or {}).items() if value},
        "good_requests": good,
        "mean_input_tokens": round(total_input / len(ok), 1) if ok else 0,
        "mean_output_tokens": round(total_output / len(ok), 1) if ok else 0,
        "targets": targets,
    })
    return result
