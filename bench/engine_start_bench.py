"""An engine's start on a CPU host: vLLM's defaults against how the panel starts it there (decision 0074; a script,
not a test; results in docs/benchmarks.md, "An engine's start on a CPU host").

The demo model (or --model DIR), the same profile, the same argv from the panel's `launch_argv`, started in turns:
- "vLLM's defaults": the argv and environment a GPU host gets (vLLM picks the multiprocess executor on a CPU, and
  its ahead-of-time compile cache);
- "the older compile cache": the same, with VLLM_USE_AOT_COMPILE=0;
- "and one worker in the engine's process": `cpu_host=True` and CPU_ENGINE_ENV as well (the "uni" executor).
Each start is measured from the client's side: seconds from the process's start to /v1/models listing the model,
then three streamed requests (512 tokens forced), one after another: the median time to the first token and
to the last; and what the
whole process tree cost (CPU seconds of every process and thread until ready, resident memory of all of them once
ready). The first start of each variant fills the compile caches; every start is reported.

    ENGINE_START_ROUNDS=3 ENGINE_START_OUT=/tmp/engine-start.json \
    flock /tmp/tw-heavy.lock .venv/bin/python -m bench.engine_start_bench
"""
import json
import os
import platform
import secrets
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from tests.support.bench_panel import django_setup

django_setup()  # before the panel's models are imported

from django.conf import settings  # noqa: E402

from panel.jobs import processes  # noqa: E402
from panel.registry.demo_model import build_demo_model  # noqa: E402
from panel.registry.models import RegisteredModel  # noqa: E402
from panel.serving import supervisor  # noqa: E402
from panel.serving.models import ServingProfile  # noqa: E402
from panel.serving.services import CPU_ENGINE_ENV, launch_argv  # noqa: E402

SERVED = "tiny-chat"
PROFILE = {"name": "bench", "served_model_name": SERVED, "max_model_len": 1024, "max_num_seqs": 4, "block_size": 32,
           "enable_prefix_caching": True}
VARIANTS = {"vLLM's defaults": (False, {}),
            "the older compile cache": (False, {"VLLM_USE_AOT_COMPILE": "0"}),
            "and one worker in the engine's process": (True, CPU_ENGINE_ENV)}
DECODE_TOKENS = 512
DECODE_REQUESTS = 3  # per start, one after another; the median is reported


def tree(process):
    return [process, *process.children(recursive=True)]


def tree_cpu_seconds(process):
    total = 0.0
    for member in tree(process):
        try:
            times = member.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def tree_rss_mib(process):
    total = 0
    for member in tree(process):
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2 ** 20)


def streamed(port, key):
    """(seconds to the first token, seconds to the last) of one streamed completion of DECODE_TOKENS: vLLM's
    multiprocess executor at times sends a whole answer in one burst at its end here, so the time to the last
    token is the decode figure, not the rate between the first and the last."""
    sent = time.monotonic()
    first = last = None
    with httpx.stream("POST", f"{supervisor.engine_root(port)}/v1/completions", timeout=300,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": SERVED, "prompt": "the cat sat on", "max_tokens": DECODE_TOKENS,
                            "min_tokens": DECODE_TOKENS, "temperature": 0, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                first = first if first is not None else now
                last = now
    return round(first - sent, 3), round(last - sent, 3)


def start_once(model_path, cpu_host, extra_env):
    profile = ServingProfile(model=RegisteredModel(name="tiny", path=str(model_path)), **PROFILE)
    port, key = supervisor.free_port(), secrets.token_urlsafe(32)
    argv = launch_argv(profile, port=port, cpu_host=cpu_host)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(settings.CPU_KVCACHE_GIB), "VLLM_API_KEY": key, **extra_env}
    started = time.monotonic()
    log = open(Path(settings.DATA_DIR) / "engine-start-bench.log", "ab")
    process = subprocess.Popen(argv, env=processes.engine_environment(env), cwd=settings.BASE_DIR, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    watched = psutil.Process(process.pid)
    cpu = 0.0
    try:
        while not supervisor.is_ready(port, SERVED, api_key=key):
            if process.poll() is not None:
                raise SystemExit(f"the engine exited with {process.returncode}: {argv}")
            cpu = max(cpu, tree_cpu_seconds(watched))
            time.sleep(0.2)
        ready = round(time.monotonic() - started, 1)
        cpu = round(max(cpu, tree_cpu_seconds(watched)), 1)
        rss = tree_rss_mib(watched)
        asked = [streamed(port, key) for _ in range(DECODE_REQUESTS)]
        return {"ready_s": ready, "cpu_s_to_ready": cpu, "rss_mib": rss, "processes": len(tree(watched)),
                "ttft_s": statistics.median(ttft for ttft, _ in asked),
                "seconds_512": statistics.median(whole for _, whole in asked)}
    finally:
        processes.stop_group(process.pid)
        process.wait(timeout=60)


def main():
    rounds = int(os.environ.get("ENGINE_START_ROUNDS", "3"))
    model_path = Path(os.environ.get("ENGINE_START_MODEL") or Path(settings.DATA_DIR) / "bench-engine-start-tiny")
    if not (model_path / "config.json").exists():
        build_demo_model(model_path)
    results = {name: [] for name in VARIANTS}
    for number in range(rounds):
        for name, (cpu_host, extra_env) in VARIANTS.items():
            line = start_once(model_path, cpu_host, extra_env)
            results[name].append(line)
            print(f"round {number + 1}, {name}: {line}", flush=True)
    summary = {"machine": {"processor": platform.processor() or cpu_model(), "cores": psutil.cpu_count(),
                           "memory_gib": round(psutil.virtual_memory().total / 2 ** 30)},
               "model": str(model_path), "profile": PROFILE, "rounds": results}
    out = os.environ.get("ENGINE_START_OUT")
    if out:
        Path(out).write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    main()
