"""The gateway's own CPU cost per proxied request, against a fake streaming upstream (not a test; results in
docs/benchmarks.md).

  .venv/bin/python bench/gateway_cpu_bench.py [--requests 400] [--concurrency 4] [--profile out.txt]

The gateway runs as one uvicorn process on a fresh database with one key and one route to the fake upstream. For
streams of 20 and of 200 chunks (max_tokens picks the count), it sends `--requests` streams at `--concurrency` and
reads the serving process's CPU time (user + system, every thread: the usage writer included) before and after:
CPU ms per request. The fixed cost and the cost per chunk come from the two sizes (a straight line through both).
The upstream and the load generator run in other processes and are not counted.

--repeats N measures both sizes N times, alternately, and reports the medians (the machine is shared).

--profile runs the gateway under pyinstrument (`pip install pyinstrument`) for a separate pass of 20-chunk streams
and writes its text report (the event loop's thread; wall-clock samples) to the file given. --py-spy BIN (with
--profile) samples the measured gateway with py-spy instead: on-CPU samples of every thread, so awaited time is not
counted, summed per function (inclusive and self) into the report; the raw stacks go beside it (.raw). --cprofile
(with --profile) runs that pass under cProfile timed by the event loop thread's CPU clock: every call counted, none
of the time spent waiting (py-spy's idle detection misses uvloop's wait, which is C), at cProfile's own overhead."""
import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
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


def loop_thread_seconds(process):
    """The CPU time of the process's main thread, which runs the event loop (the rest is the usage writer's and
    the other helper threads')."""
    return next(thread.user_time + thread.system_time for thread in process.threads() if thread.id == process.pid)


def measure(gateway_pid, url, key, args, chunks):
    process = psutil.Process(gateway_pid)
    asyncio.run(send(url, key, 40, args.concurrency, chunks))  # warm-up: connections, caches, JIT-free paths
    time.sleep(1)  # let the usage writer drain
    before, loop_before = cpu_seconds(process), loop_thread_seconds(process)
    started = time.perf_counter()
    asyncio.run(send(url, key, args.requests, args.concurrency, chunks))
    wall = time.perf_counter() - started
    loop = loop_thread_seconds(process) - loop_before
    time.sleep(1)  # the usage writer's work for these requests counts too
    spent = cpu_seconds(process) - before - 1 * idle_cpu_per_second(process)
    return {"chunks": chunks, "cpu_ms_per_request": spent * 1000 / args.requests,
            "event_loop_ms_per_request": loop * 1000 / args.requests, "requests_per_second": args.requests / wall}


def line_through(small, large):
    """The fixed cost and the cost per chunk of a straight line through the two sizes' CPU per request."""
    per_chunk = (large["cpu_ms_per_request"] - small["cpu_ms_per_request"]) / (large["chunks"] - small["chunks"])
    return {"rows": [small, large], "fixed_ms_per_request": small["cpu_ms_per_request"] - per_chunk * small["chunks"],
            "ms_per_chunk": per_chunk}


def idle_cpu_per_second(process, seconds=2.0):
    before = cpu_seconds(process)
    time.sleep(seconds)
    return (cpu_seconds(process) - before) / seconds


def py_spy_profile(py_spy, pid, url, key, args, report):
    """A pass of 20-chunk streams while py-spy samples the gateway process; the per-function summary to `report`."""
    raw = Path(report).with_suffix(".raw")
    recorder = subprocess.Popen([py_spy, "record", "--pid", str(pid), "--format", "raw", "--function", "--rate",
                                 "1000", "--nonblocking", "--output", str(raw)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached before the first request
    asyncio.run(send(url, key, args.requests, args.concurrency, 20))
    recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    recorder.wait(timeout=60)
    Path(report).write_text(summary(raw.read_text(), args.requests))


def summary(collapsed, requests, top=40):
    """Per function: samples anywhere in the stack (inclusive) and on top of it (self), from py-spy's collapsed
    stacks ("frame;frame;... count"); at 1,000 samples a second one sample is 1 ms of CPU."""
    inclusive, own, total = {}, {}, 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        frames, count = stack.split(";"), int(count)
        total += count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
    lines = [f"{total} samples (ms of CPU) for {requests} requests: {total / requests:.2f} ms per request",
             "", "inclusive ms/request  self ms/request  function"]
    for frame, count in sorted(inclusive.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{count / requests:10.3f} {own.get(frame, 0) / requests:10.3f}  {frame}")
    lines += ["", "the panel's own functions, inclusive:"]
    for frame, count in sorted(inclusive.items(), key=lambda item: -item[1]):
        if "panel/" in frame and count / requests >= 0.02:
            lines.append(f"{count / requests:10.3f} {own.get(frame, 0) / requests:10.3f}  {frame}")
    lines += ["", "top self:"]
    for frame, count in sorted(own.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{count / requests:10.3f}  {frame}")
    return "\n".join(lines) + "\n"


def serve_profiled(port, report, kind="pyinstrument"):
    """The gateway as one uvicorn process under pyinstrument (wall-clock samples) or cProfile (`kind` "cprofile":
    every call, timed by the event loop thread's CPU clock, so awaited time counts nowhere), until SIGTERM; then the
    report of the event loop's thread. (uvicorn re-raises the signal it caught once it has shut down, which would
    end the process before the report is written: the signal is handled here instead.)"""
    import contextlib
    import signal

    import uvicorn

    server = uvicorn.Server(uvicorn.Config("panel.asgi:application", port=port, loop="uvloop", http="httptools",
                                           access_log=False, log_level="warning"))
    server.capture_signals = contextlib.nullcontext
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    if kind == "cprofile":
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile(timer=time.thread_time)
        # Enabled by SIGUSR1, after the start-up and the warm-up requests (the handler runs on the main thread).
        signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
        server.run()
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(r"panel/|redis/|aiohttp/client|httptools_impl|json/", 45)
        Path(report).write_text(out.getvalue())
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    server.run()
    profiler.stop()
    Path(report).write_text(profiler.output_text(show_all=False))


def main():
    if sys.argv[1:2] == ["--serve-profiled"]:
        serve_profiled(int(sys.argv[2]), sys.argv[3], *sys.argv[4:5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", help="write a pyinstrument text report of the gateway to this file")
    parser.add_argument("--py-spy", help="the py-spy command: profile with it (on-CPU samples) instead")
    parser.add_argument("--cprofile", action="store_true",
                        help="profile with cProfile on the event loop thread's CPU clock instead (every call)")
    args = parser.parse_args()
    up_port = free_port()
    upstream = start([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(up_port), "--chunks",
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
            runs = [[measure(gateway.pid, url, key, args, chunks) for chunks in (20, UPSTREAM_CHUNKS)]
                    for _ in range(args.repeats)]
            if args.profile and args.py_spy:
                py_spy_profile(args.py_spy, gateway.pid, url, key, args, Path(args.profile).resolve())
        finally:
            stop(gateway)
        results = {"runs": [line_through(small, large) for small, large in runs], "requests": args.requests,
                   "concurrency": args.concurrency}
        for name in ("fixed_ms_per_request", "ms_per_chunk"):
            results[f"median_{name}"] = statistics.median(run[name] for run in results["runs"])
        print(json.dumps(results, indent=2), flush=True)
        if args.profile and not args.py_spy:
            gw_port = free_port()
            report = Path(args.profile).resolve()
            gateway = start([sys.executable, __file__, "--serve-profiled", str(gw_port), str(report),
                             *(["cprofile"] if args.cprofile else [])],
                            env=dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))),
                            ready_url=f"http://127.0.0.1:{gw_port}/login/")
            try:
                profiled_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
                if args.cprofile:
                    asyncio.run(send(profiled_url, key, 40, args.concurrency, 20))  # warm-up, not profiled
                    gateway.send_signal(signal.SIGUSR1)
                    time.sleep(0.5)
                asyncio.run(send(profiled_url, key, args.requests, args.concurrency, 20))
            finally:
                stop(gateway)
            print(f"profile written to {report}")
    finally:
        stop(upstream)


if __name__ == "__main__":
    main()
