"""The gateway's own CPU cost per proxied request, against a fake streaming upstream (not a test; results in
docs/benchmarks.md).

  .venv/bin/python bench/gateway_cpu_bench.py [--requests 400] [--concurrency 4] [--profile out.txt]

The gateway runs as one uvicorn process on a fresh database with one key and one route to the fake upstream. For
streams of 20 and of 200 chunks (max_tokens picks the count), it sends `--requests` streams at `--concurrency` and
reads the serving process's CPU time (user + system, every thread: the usage writer included) before and after:
CPU ms per request. The fixed cost and the cost per chunk come from the two sizes (a straight line through both).
The upstream and the load generator run in other processes and are not counted.

--profile runs the gateway under pyinstrument (`pip install pyinstrument`) for a separate pass of 20-chunk streams
and writes its text report (the event loop's thread; wall-clock samples) to the file given."""
import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from gateway_bench import ROOT, free_port, prepare_panel, start, stop

UPSTREAM_CHUNKS = 200


async def send(url, key, requests, concurrency, chunks):
    body = {"model": "chat", "stream": True, "max_tokens": chunks,
            "messages": [{"role": "user", "content": "tell me about prefix caching in one paragraph"}]}
    headers = {"Authorization": f"Bearer {key}"}
    queue = list(range(requests))
    failures = []

    async def one_client(client):
        while queue:
            queue.pop()
            async with client.stream("POST", url, json=body, headers=headers) as response:
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data: ") and '"content"' in line
                if response.status_code != 200 or seen < chunks:
                    failures.append((response.status_code, seen))

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*[one_client(client) for _ in range(concurrency)])
    if failures:
        raise SystemExit(f"{len(failures)} of {requests} streams failed, e.g. {failures[:3]}")


def cpu_seconds(process):
    times = process.cpu_times()
    return times.user + times.system


def measure(gateway_pid, url, key, args, chunks):
    process = psutil.Process(gateway_pid)
    asyncio.run(send(url, key, 40, args.concurrency, chunks))  # warm-up: connections, caches, JIT-free paths
    time.sleep(1)  # let the usage writer drain
    before = cpu_seconds(process)
    started = time.perf_counter()
    asyncio.run(send(url, key, args.requests, args.concurrency, chunks))
    wall = time.perf_counter() - started
    time.sleep(1)  # the usage writer's work for these requests counts too
    spent = cpu_seconds(process) - before - 1 * idle_cpu_per_second(process)
    return {"chunks": chunks, "cpu_ms_per_request": spent * 1000 / args.requests,
            "requests_per_second": args.requests / wall}


def idle_cpu_per_second(process, seconds=2.0):
    before = cpu_seconds(process)
    time.sleep(seconds)
    return (cpu_seconds(process) - before) / seconds


def serve_profiled(port, report):
    """The gateway as one uvicorn process under pyinstrument, until SIGTERM; then the report of the event loop's
    thread. (uvicorn re-raises the signal it caught once it has shut down, which would end the process before the
    report is written: the signal is handled here instead.)"""
    import contextlib
    import signal

    import uvicorn
    from pyinstrument import Profiler

    server = uvicorn.Server(uvicorn.Config("panel.asgi:application", port=port, loop="uvloop", http="httptools",
                                           access_log=False, log_level="warning"))
    server.capture_signals = contextlib.nullcontext
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    profiler = Profiler(interval=0.0005)
    profiler.start()
    server.run()
    profiler.stop()
    Path(report).write_text(profiler.output_text(show_all=False))


def main():
    if sys.argv[1:2] == ["--serve-profiled"]:
        serve_profiled(int(sys.argv[2]), sys.argv[3])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--profile", help="write a pyinstrument text report of the gateway to this file")
    args = parser.parse_args()
    up_port = free_port()
    upstream = start([sys.executable, "-m", "tests.fake_upstream", "--port", str(up_port), "--chunks",
                      str(UPSTREAM_CHUNKS), "--model", "fake-model"],
                     ready_url=f"http://127.0.0.1:{up_port}/v1/models")
    data_dir = Path(tempfile.mkdtemp(prefix="tokenwise-cpu-bench-"))
    env, key = prepare_panel(data_dir, f"http://127.0.0.1:{up_port}/v1")
    server = ["-m", "uvicorn", "panel.asgi:application", "--loop", "uvloop", "--http", "httptools",
              "--no-access-log", "--log-level", "warning"]
    try:
        gw_port = free_port()
        gateway = start([sys.executable, *server, "--port", str(gw_port)], env=env,
                        ready_url=f"http://127.0.0.1:{gw_port}/login/")
        url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        try:
            rows = [measure(gateway.pid, url, key, args, chunks) for chunks in (20, UPSTREAM_CHUNKS)]
        finally:
            stop(gateway)
        small, large = rows
        per_chunk = (large["cpu_ms_per_request"] - small["cpu_ms_per_request"]) / (large["chunks"] - small["chunks"])
        results = {"rows": rows, "fixed_ms_per_request": small["cpu_ms_per_request"] - per_chunk * small["chunks"],
                   "ms_per_chunk": per_chunk, "requests": args.requests, "concurrency": args.concurrency}
        print(json.dumps(results, indent=2), flush=True)
        if args.profile:
            gw_port = free_port()
            report = Path(args.profile).resolve()
            gateway = start([sys.executable, __file__, "--serve-profiled", str(gw_port), str(report)],
                            env=dict(env, PYTHONPATH=str(ROOT)),
                            ready_url=f"http://127.0.0.1:{gw_port}/login/")
            try:
                asyncio.run(send(f"http://127.0.0.1:{gw_port}/v1/chat/completions", key, args.requests,
                                 args.concurrency, 20))
            finally:
                stop(gateway)
            print(f"profile written to {report}")
    finally:
        stop(upstream)


if __name__ == "__main__":
    main()
