"""Owns one vLLM server for the life of a deployment: start it in its own process group, watch its log, say
when it is ready (GET /v1/models lists the served model), heartbeat, stop it on request, classify a crash, and
optionally restart it with backoff. Runs inside the GPU worker's task; the panel never imports vLLM."""
import logging
import re
import socket
import time
from dataclasses import dataclass, field

import httpx

from workers import diagnosis, processes

log = logging.getLogger(__name__)

# vLLM prints its resolved engine configuration once at start-up, e.g.
# "Initializing a V1 LLM engine (v0.32.0) with config: model='...', quantization=awq, ...,
#  enable_prefix_caching=True, enable_chunked_prefill=True, ..."
CONFIG_LINE = re.compile(r"with config: (.*)")
CONFIG_FIELDS = ("quantization", "enable_prefix_caching", "enable_chunked_prefill", "dtype", "max_seq_len",
                 "tensor_parallel_size", "kv_cache_dtype")
KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens(?:, Maximum concurrency for ([\d,]+) tokens per "
                           r"request: ([\d.]+)x)?")
VERSION_LINE = re.compile(r"Initializing a V\d LLM engine \(v([^)]+)\)")


def free_port():
    """A TCP port that is free now on 127.0.0.1 (the engine binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class EngineLog:
    """What the engine's start-up log says it actually applied."""

    applied: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)

    def take(self, line):
        self.lines.append(line)
        match = CONFIG_LINE.search(line)
        if match:
            for name in CONFIG_FIELDS:
                found = re.search(rf"\b{name}=([^,]+)", match.group(1))
                if found:
                    self.applied[name] = found.group(1).strip().strip("'")
        version = VERSION_LINE.search(line)
        if version:
            self.applied["vllm_version"] = version.group(1)
        kv = KV_CACHE_LINE.search(line)
        if kv:
            self.applied["kv_cache_tokens"] = int(kv.group(1).replace(",", ""))
            if kv.group(3):
                self.applied["max_concurrency"] = float(kv.group(3))

    def drain(self):
        lines, self.lines = self.lines, []
        return lines


def verify_startup(applied, *, wanted_quantization, wanted_prefix_caching):
    """Compare what the profile asked for with what the engine's log says it applied (the seeds' §4.1 check).
    Returns {"quantization": ..., "prefix_caching": ..., "problems": [...]}."""
    problems = []
    got_quantization = (applied.get("quantization") or "None").lower()
    got_quantization = "none" if got_quantization in ("none", "null", "") else got_quantization
    if wanted_quantization and wanted_quantization != "none" and wanted_quantization not in got_quantization:
        problems.append(f"asked for {wanted_quantization} but the engine loaded the weights as {got_quantization}: "
                        "the --quantization flag was not applied, so memory did not go down")
    got_prefix = str(applied.get("enable_prefix_caching", "")).lower() == "true"
    if "enable_prefix_caching" in applied and wanted_prefix_caching and not got_prefix:
        problems.append("asked for prefix caching but the engine started without it")
    if "enable_prefix_caching" not in applied:
        problems.append("the engine's configuration line was not found in its log; nothing could be verified")
    return {"quantization": got_quantization, "prefix_caching": got_prefix, "problems": problems,
            "applied": applied}


def is_ready(port, served_model_name, *, timeout=2.0):
    """Ready means GET /v1/models answers and lists the served model (/health stays 200 after some faults)."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=timeout)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    try:
        names = [entry.get("id") for entry in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return False
    return served_model_name in names


@dataclass
class RunOutcome:
    stopped: bool
    returncode: int | None
    tail: list
    became_ready: bool


class Hooks:
    """What the supervisor tells the deployment row; implemented by the serving service."""

    def started(self, pid):
        ...

    def ready(self, verification):
        ...

    def beat(self, log_lines):
        """Heartbeat with new log lines; returns True when a stop was requested."""
        return False

    def stop_requested(self):
        return False


def run_server(argv, *, env, port, served_model_name, hooks, log_path, wanted_quantization, wanted_prefix_caching,
               check_every=1.0, beat_every=5.0, grace_seconds=15.0):
    """Run the engine until it exits or a stop is requested. Returns a RunOutcome."""
    engine_log = EngineLog()
    state = {"ready": False, "last_beat": 0.0}

    def tick():
        now = time.monotonic()
        if not state["ready"] and is_ready(port, served_model_name):
            state["ready"] = True
            hooks.beat(engine_log.drain())  # whoever sees "ready" sees the start-up log that led to it
            hooks.ready(verify_startup(engine_log.applied, wanted_quantization=wanted_quantization,
                                       wanted_prefix_caching=wanted_prefix_caching))
        if now - state["last_beat"] >= beat_every or engine_log.lines:
            state["last_beat"] = now
            return hooks.beat(engine_log.drain())
        return hooks.stop_requested()

    outcome = processes.run_streaming(argv, env=env, on_line=engine_log.take, tick=tick, tick_every=check_every,
                                      log_path=log_path, on_start=hooks.started, grace_seconds=grace_seconds,
                                      tail_lines=300)
    hooks.beat(engine_log.drain())
    return RunOutcome(stopped=outcome.stopped, returncode=outcome.returncode, tail=outcome.tail,
                      became_ready=state["ready"])


def classify_crash(outcome):
    """(kind, reason) for an engine that died."""
    return diagnosis.classify_engine(outcome.tail, outcome.returncode, became_ready=outcome.became_ready)
