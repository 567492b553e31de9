"""Load generation for a benchmark run: plain asyncio + aiohttp, no Django. Every request streams, so the first
content byte gives TTFT and the gaps between content chunks give the inter-token latency.

`run_load` sends warm-up requests first (not counted: a cold engine's first requests are slow), then the measured ones, either
closed-loop (`concurrency` requests in flight) or open-loop (`request_rate` new requests per second, Poisson
arrivals, at most `concurrency` in flight). `summarize` turns the samples into the figures a run records."""
import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from panel.core import safejson

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Endpoint:
    """Where one request goes: an OpenAI-compatible base URL (ending in /v1), its key and model name.
    `vllm`: the upstream is a vLLM server, which takes `ignore_eos` (so the output length is the one asked for)."""

    base_url: str
    api_key: str
    model: str
    vllm: bool = False
    label: str = ""


@dataclass
class Sample:
    ok: bool
    error: str = ""
    ttft: float | None = None  # seconds to the first content chunk
    e2e: float | None = None  # seconds to the end of the stream
    gaps: list = field(default_factory=list)  # seconds between successive content chunks
    prompt_tokens: int = 0
    output_tokens: int = 0
    target: str = ""


@dataclass
class Progress:
    """Shared with the thread that heartbeats: plain counters, read without locks (ints are atomic enough)."""

    total: int = 0
    warmup: int = 0
    done: int = 0
    warmup_done: int = 0
    errors: int = 0
    stop: bool = False
    # (endpoint label, prompt tokens, output tokens) of each finished request, warm-up included, for the budget
    # counting of the heartbeat thread (panel/benchmarks/spend.py)
    spent: deque = field(default_factory=deque)


def request_body(endpoint, messages, max_tokens):
    body = {"model": endpoint.model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    if endpoint.vllm:
        body["ignore_eos"] = True  # vLLM's extension: produce exactly max_tokens, as the workload asked
    return body


async def one_request(session, endpoint, messages, max_tokens, timeout):
    """Send one streaming chat completion and time it. Never raises: a failure is a Sample with ok=False."""
    sample = Sample(ok=False, target=endpoint.label)
    headers = {"Authorization": f"Bearer {endpoint.api_key}", "Content-Type": "application/json",
               "X-Tokenwise-Hop": "1"}  # the gateway refuses it: a target that is the panel itself cannot loop
    started = time.perf_counter()
    last = None
    chunks = 0
    try:
        async with session.post(endpoint.base_url.rstrip("/") + "/chat/completions",
                                json=request_body(endpoint, messages, max_tokens), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                text = (await response.text())[:300]
                sample.error = f"HTTP {response.status}: {text}"
                return sample
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = safejson.loads(data)
                except ValueError:
                    sample.error = "malformed stream event"
                    return sample
                if "error" in event:
                    sample.error = f"error event: {str(event['error'])[:200]}"
                    return sample
                usage = event.get("usage") or {}
                if usage:
                    sample.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    sample.output_tokens = int(usage.get("completion_tokens") or 0)
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if last is None:
                            sample.ttft = now - started
                        else:
                            sample.gaps.append(now - last)
                        last = now
                        chunks += 1
    except asyncio.TimeoutError:
        sample.error = f"timed out after {timeout:g} s"
        return sample
    except (aiohttp.ClientError, OSError) as error:
        sample.error = f"connection error: {type(error).__name__}: {error}"[:300]
        return sample
    sample.e2e = time.perf_counter() - started
    if sample.ttft is None:
        sample.error = "the stream ended without any content"
        return sample
    sample.output_tokens = sample.output_tokens or chunks  # upstreams without usage: one chunk ~ one token
    sample.ok = True
    return sample


async def run_load(*, pick, prompts, max_tokens, requests, warmup=0, concurrency=1, request_rate=None,
                   timeout=300.0, progress=None, seed=0, resolver=None):
    """Send `warmup` then `requests` streaming requests. `pick()` returns the Endpoint for the next request (a route
    spreads them over its channels); `prompts` is a list of message lists, cycled. Returns (samples, seconds) for
    the measured requests only. Stops early (without sending more) when `progress.stop` is set."""
    progress = progress or Progress()
    progress.total, progress.warmup = requests, warmup
    # `resolver`: the outbound policy's (panel/core/outbound.py), so every resolved address is checked.
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, force_close=False, resolver=resolver)
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(max(concurrency, 1))

        async def send(index):
            async with gate:
                if progress.stop:
                    return None
                endpoint = pick()
                sample = await one_request(session, endpoint, prompts[index % len(prompts)], max_tokens, timeout)
                progress.spent.append((endpoint.label, sample.prompt_tokens, sample.output_tokens))
                return sample

        # Warm-up: the same kind of requests, awaited and thrown away (first-request compilation, cold caches).
        async def warm(index):
            await send(index)
            progress.warmup_done += 1

        await asyncio.gather(*(warm(index) for index in range(warmup)))
        samples = []

        async def measured(index):
            sample = await send(warmup + index)
            if sample is not None:
                samples.append(sample)
                progress.done += 1
                progress.errors += 0 if sample.ok else 1

        started = time.perf_counter()
        if request_rate:
            rng = random.Random(seed)
            tasks = []
            for index in range(requests):
                if progress.stop:
                    break
                tasks.append(asyncio.create_task(measured(index)))
                await asyncio.sleep(rng.expovariate(request_rate))
            await asyncio.gather(*tasks)
        else:
            await asyncio.gather(*(measured(index) for index in range(requests)))
        return samples, time.perf_counter() - started


def percentile(values, p):
    """Linear interpolation between closest ranks (numpy's default), so p50 <= p95 <= p99 always holds."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms_percentiles(name, values):
    return {f"{name}_p{p}_ms": (None if percentile(values, p) is None else round(percentile(values, p) * 1000, 3))
            for p in PERCENTILES}


def summarize(samples, seconds):
    """The figures a run records, from its measured samples and wall time."""
    ok = [sample for sample in samples if sample.ok]
    errors = [sample for sample in samples if not sample.ok]
    seconds = max(seconds, 1e-9)
    output_tokens = sum(sample.output_tokens for sample in ok)
    prompt_tokens = sum(sample.prompt_tokens for sample in ok)
    error_kinds = {}
    for sample in errors:
        kind = sample.error.split(":")[0]
        error_kinds[kind] = error_kinds.get(kind, 0) + 1
    targets = {}
    for sample in samples:
        if sample.target:
            targets[sample.target] = targets.get(sample.target, 0) + 1
    summary = {
        "requests": len(samples), "ok": len(ok), "errors": len(errors),
        "error_rate": round(len(errors) / len(samples), 4) if samples else 0.0,
        "error_kinds": error_kinds, "first_error": errors[0].error if errors else "",
        "seconds": round(seconds, 3),
        "request_throughput": round(len(ok) / seconds, 3),
        "output_tokens_per_s": round(output_tokens / seconds, 2),
        "total_tokens_per_s": round((output_tokens + prompt_tokens) / seconds, 2),
        "output_tokens": output_tokens, "prompt_tokens": prompt_tokens,
        "mean_prompt_tokens": round(prompt_tokens / len(ok), 1) if ok else 0,
        "mean_output_tokens": round(output_tokens / len(ok), 1) if ok else 0,
        "targets": targets,
    }
    summary.update(_ms_percentiles("ttft", [sample.ttft for sample in ok]))
    summary.update(_ms_percentiles("itl", [gap for sample in ok for gap in sample.gaps]))
    summary.update(_ms_percentiles("e2e", [sample.e2e for sample in ok]))
    return summary
