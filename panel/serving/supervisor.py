"""Owns one vLLM server for the life of a deployment: start it in its own process group, watch its log, say
when it is ready (GET /v1/models lists the served model), heartbeat, stop it on request, classify a crash, and
optionally restart it with backoff. Runs inside the GPU worker's task; the panel never imports vLLM."""
import ipaddress
import logging
import re
import socket
import time
from dataclasses import dataclass, field

import httpx
from django.conf import settings

from panel.jobs import diagnosis, processes
from panel.serving.configfile import KEY_GUARD

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


def engine_host():
    """The address this host's engines are reached at from the host itself: the one they bind
    (TOKENWISE_ENGINE_BIND: a GPU host's own address when the gateway runs elsewhere), or 127.0.0.1 when they listen
    on every interface."""
    bind = settings.ENGINE_BIND or "127.0.0.1"
    try:
        address = ipaddress.ip_address(bind)
    except ValueError:
        return bind  # a name
    if address.is_unspecified:
        return "127.0.0.1"
    return f"[{bind}]" if address.version == 6 else bind


def engine_root(port):
    """http://<engine_host()>:<port>, the root of an engine server on this host."""
    return f"http://{engine_host()}:{port}"


def free_port():
    """A TCP port that is free now where the engines listen (the engine binds it a moment later)."""
    host = engine_host().strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
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
    """Compare what the profile asked for with what the engine's log says it applied (a flag that
    was not applied leaves memory where it was).
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


def is_ready(port, served_model_name, *, api_key="", timeout=2.0):
    """Ready means GET /v1/models answers and lists the served model (/health stays 200 after some faults)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{engine_root(port)}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    try:
        names = [entry.get("id") for entry in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return False
    return served_model_name in names


def exposure_problem(argv, env):
    """Why the engine may not start as `argv` with `env`, or "": listening beyond this host (a --host other than
    loopback; without one vLLM listens everywhere) needs a key (VLLM_API_KEY) and the guard that puts every path
    behind it, not only /v1."""
    host = next((token.split("=", 1)[1] for token in argv if token.startswith("--host=")), "")
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return ""
    except ValueError:
        pass  # a name or every interface: reachable from elsewhere
    where = host or "every interface"
    if not (env or {}).get("VLLM_API_KEY"):
        return (f"the engine would listen on {where} without a key (VLLM_API_KEY): anyone on the network could "
                "use it. Bind it to 127.0.0.1 (TOKENWISE_ENGINE_BIND) or start it with a key")
    if f"--middleware={KEY_GUARD}" not in argv:
        return (f"the engine would listen on {where} with its key guarding only /v1: start it with --middleware "
                f"{KEY_GUARD}")
    return ""


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
    """Run the engine until it exits or a stop is requested. Returns a RunOutcome. The engine's key, when it has
    one, is env's VLLM_API_KEY (never in the argv, which other users of the host can read)."""
    engine_log = EngineLog()
    state = {"ready": False, "last_beat": 0.0}

    def tick():
        now = time.monotonic()
        if not state["ready"] and is_ready(port, served_model_name, api_key=(env or {}).get("VLLM_API_KEY", "")):
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
    return classify_engine(outcome.tail, outcome.returncode, became_ready=outcome.became_ready)


# What kills a vLLM server, from its log (the usual vLLM troubleshooting list and what was measured here).
ENGINE_RULES = [
    # engine/serve.py: vLLM's own parser read the command otherwise than the panel wrote it
    ("bad_config", re.compile(r"(?<=the engine was not started: ).{1,300}"), None),
    ("unsupported_quantization", re.compile(r"cpu_gemm_wna16|Unknown quantization method|quantization method .* "
                                            r"is not supported|not supported for quantization|Cannot find the "
                                            r"config file for (awq|gptq)", re.I),
     "the engine cannot run this quantization here (the CPU engine's AWQ kernel needs vLLM's AVX-512 build): "
     "serve the FP16/BF16 model on this host, or the AWQ model on a GPU host"),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                       r"insufficient memory|Cannot allocate memory|MemoryError|KV cache .* larger than the "
                       r"available", re.I),
     "out of memory: lower max_model_len or max_num_seqs, raise gpu_memory_utilization carefully, quantize the "
     "model, or use a larger GPU (on a CPU host: lower VLLM_CPU_KVCACHE_SPACE)"),
    ("port_in_use", re.compile(r"Address already in use|\[Errno 98\]", re.I),
     "the port was taken by another process: leave the port empty so the panel picks a free one"),
    ("model_not_found", re.compile(r"does not appear to have a file named config\.json|No such file or "
                                   r"directory: .*config\.json|Repository Not Found|is not a local folder and "
                                   r"is not a valid model identifier|Can't load the configuration", re.I),
     "the engine cannot find the model: check that the model's folder exists on this host"),
    ("bad_block_size", re.compile(r"No common block size for (\d+)", re.I),
     "this engine does not support the profile's block_size (the CPU engine needs a multiple of 32)"),
    ("engine_missing", re.compile(r"No module named '?vllm|ModuleNotFoundError|ImportError", re.I),
     "the engine venv cannot import vLLM: rebuild it (`make engine`) or fix ENGINE_PYTHON"),
    ("bad_config", re.compile(r"(ValueError|TypeError|argument|error): .{0,300}", re.I), None),
]


def classify_engine(tail, returncode, *, became_ready=False):
    """(kind, reason) for a vLLM server that exited with `returncode` after printing `tail`. A signal wins over
    the log (the log of a killed engine is a healthy one); a refused configuration only explains a start-up."""
    if returncode is not None and returncode < 0:
        return "killed", (f"the engine was killed by signal {-returncode} (by someone, or by the kernel's "
                          "out-of-memory killer: check the host's memory)")
    text = "\n".join(tail)
    for kind, pattern, reason in ENGINE_RULES:
        if kind == "bad_config" and became_ready:
            continue
        match = pattern.search(text)
        if match:
            if reason is None:
                return kind, f"the engine refused its configuration: {match.group(0)[:300]}"
            return kind, reason
    return diagnosis.classify(tail, returncode)
