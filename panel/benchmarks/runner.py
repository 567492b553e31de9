"""Load generation for a benchmark run: plain asyncio + aiohttp, no Django. Every request streams, so the first
chunk with tokens gives TTFT and the chunks after it the per-token gaps (panel/benchmarks/metrics.py: the figures
in `vllm bench serve`'s terms).

`run_load` sends warm-up requests first (not counted: a cold engine's first requests are slow), then the measured
ones, either closed-loop (`concurrency` requests in flight) or open-loop (`request_rate` new requests per second,
Poisson arrivals, at most `concurrency` in flight). `summarize` turns the samples into the figures a run records
(metrics.summarize)."""
import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from panel.benchmarks import metrics
from panel.core import outbound, safejson


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
    ttft: float | None = None  # seconds to the first chunk that carries tokens
    latency: float | None = None  # seconds to the last chunk with choices (vLLM's end-to-end latency)
    itl: list = field(default_factory=list)  # per-token gaps (metrics.chunk_itls)
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
        # vLLM's extension: every chunk carries the running completion_tokens, so a chunk's token count is exact
        body["stream_options"]["continuous_usage_stats"] = True
    return body


class StreamReader:
    """Turns network reads of an SSE stream into chunk arrivals: every read that brings content is one arrival,
    with the tokens it brought (from the running completion_tokens when the server sends it with each chunk, else
    one per content event)."""

    def __init__(self):
        self.buffer = b""
        self.arrivals = []  # (seconds, tokens)
        self.last_choice_at = None
        self.completion_tokens = None  # the server's running count, when it sends one
        self.counted = 0  # tokens attributed to arrivals so far
        self.prompt_tokens = 0
        self.events = 0
        self.done = False

    def feed(self, data, at):
        """Add the bytes of one read, received `at` seconds after sending. Returns an error string or ""."""
        self.buffer += data
        content_events, usage_seen = 0, False
        while b"\n" in self.buffer:
            raw, self.buffer = self.buffer.split(b"\n", 1)
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                self.done = True
                break
            try:
                event = safejson.loads(payload)
            except ValueError:
                return "malformed stream event"
            if not isinstance(event, dict):
                return "malformed stream event"
            if "error" in event:
                return f"error event: {str(event['error'])[:200]}"
            usage = event.get("usage") or {}
            if usage:
                self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                if usage.get("completion_tokens") is not None:
                    self.completion_tokens = int(usage["completion_tokens"])
                    usage_seen = True
            choices = event.get("choices") or []
            if choices:
                self.last_choice_at = at
            for choice in choices:
                if (choice.get("delta") or {}).get("content"):
                    content_events += 1
        if content_events:
            self.events += content_events
            if usage_seen and self.completion_tokens is not None and self.completion_tokens > self.counted:
                tokens = self.completion_tokens - self.counted
            else:
                tokens = content_events
            self.counted += tokens
            self.arrivals.append((at, tokens))
        return ""


async def one_request(session, endpoint, messages, max_tokens, timeout):
    """Send one streaming chat completion and time it. Never raises: a failure is a Sample with ok=False."""
    sample = Sample(ok=False, target=endpoint.label)
    headers = {"Authorization": f"Bearer {endpoint.api_key}", "Content-Type": "application/json",
               "X-Tokenwise-Hop": "1"}  # the gateway refuses it: a target that is the panel itself cannot loop
    started = time.perf_counter()
    reader = StreamReader()
    try:
        async with session.post(endpoint.base_url.rstrip("/") + "/chat/completions",
                                json=request_body(endpoint, messages, max_tokens), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as response:
            if 300 <= response.status < 400:  # never followed: it would take the body and the key elsewhere
                sample.error = f"HTTP {response.status}: a redirect; benchmarks do not follow redirects"
                return sample
            if response.status != 200:
                text = (await response.text())[:300]
                sample.error = f"HTTP {response.status}: {text}"
                return sample
            async for data in response.content.iter_any():
                error = reader.feed(data, time.perf_counter() - started)
                if error:
                    sample.error = error
                    return sample
                if reader.done:
                    break
    except asyncio.TimeoutError:
        sample.error = f"timed out after {timeout:g} s"
        return sample
    except (aiohttp.ClientError, OSError) as error:
        sample.error = f"connection error: {type(error).__name__}: {error}"[:300]
        return sample
    if not reader.arrivals:
        sample.error = "the stream ended without any content"
        return sample
    sample.ttft = reader.arrivals[0][0]
    sample.latency = max(reader.last_choice_at or 0.0, reader.arrivals[-1][0])
    sample.itl = metrics.chunk_itls(reader.arrivals)
    sample.prompt_tokens = reader.prompt_tokens
    # upstreams without usage: one content event ~ one token
    sample.output_tokens = reader.completion_tokens or reader.counted
    sample.ok = True
    return sample


async def run_load(*, pick, prompts, max_tokens, requests, warmup=0, concurrency=1, request_rate=None,
                   timeout=300.0, progress=None, seed=0, engine_hosts=()):
    """Send `warmup` then `requests` streaming requests. `pick()` returns the Endpoint for the next request (a route
    spreads them over its channels); `prompts` is a list of message lists, cycled. Returns (samples, seconds) for
    the measured requests only. Stops early (without sending more) when `progress.stop` is set."""
    progress = progress or Progress()
    progress.total, progress.warmup = requests, warmup
    # Every address connected to is checked by the outbound policy (panel/core/outbound.py); `engine_hosts`: the
    # names of the panel's own engines, which may be local.
    connector = outbound.PolicyConnector(engine_hosts=engine_hosts, limit=max(concurrency, 1) + 4,
                                         force_close=False)
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


percentile = metrics.percentile


def summarize(samples, seconds, slo=None):
    return metrics.summarize(samples, seconds, slo)
