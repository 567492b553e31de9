"""Added TTFT of several trees in one run, for A/B comparisons on a shared machine (not a test; results in
docs/benchmarks.md). One fake upstream; per tree given, a panel (its own database, key and route) and a gateway
started from that tree; then the paths in turn, direct first, `--block` requests each, so that every tree sees the
same moments of the machine. Prints each path's TTFT p50 and mean and what each gateway adds to the direct call.

  git worktree add /tmp/before <commit>
  .venv/bin/python bench/gateway_ttft_ab.py /tmp/before $PWD [--requests 300] [--block 1] [--gap 0]

--block 1 sends one request per path in turn (each gateway idles while the others answer); --block 20 runs of
twenty back to back, as bench/gateway_overhead.py's TTFT figure does; --gap S sleeps S seconds before each request
(a person's pace). The upstream streams 20 chunks 10 ms apart, as a real decode does."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gateway_bench import free_port, prepare_panel, stop
from gateway_overhead import SERVER, first_event_ms, upstream


def gateway_of(tree, upstream_url):
    """A panel and a gateway run from `tree` (its code, this interpreter)."""
    env, key = prepare_panel(Path(tempfile.mkdtemp(prefix="tokenwise-ab-")), upstream_url, root=tree)
    port = free_port()
    process = subprocess.Popen([sys.executable, *SERVER, "--port", str(port)], cwd=tree, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/login/", timeout=1)
            return process, f"http://127.0.0.1:{port}/v1/chat/completions", key
        except httpx.HTTPError:
            time.sleep(0.2)
    stop(process)
    raise SystemExit(f"the gateway of {tree} did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--block", type=int, default=1)
    parser.add_argument("--gap", type=float, default=0.0)
    args = parser.parse_args()
    fake, fake_url = upstream(20, 0.01)
    processes = []
    paths = [("direct", f"{fake_url}/chat/completions", "unused")]
    try:
        for tree in args.trees:
            process, url, key = gateway_of(os.path.abspath(tree), fake_url)
            processes.append(process)
            paths.append((tree, url, key))
        clients = [httpx.Client(timeout=30) for _ in paths]
        times = {name: [] for name, _, _ in paths}
        warm_up = 20
        for turn in range(0, args.requests + warm_up, args.block):
            for client, (name, url, key) in zip(clients, paths):
                for index in range(turn, turn + args.block):
                    time.sleep(args.gap)
                    first = first_event_ms(client, url, key)
                    if index >= warm_up:
                        times[name].append(first)
    finally:
        for process in [fake, *processes]:
            stop(process)
    direct_p50, direct_mean = statistics.median(times["direct"]), statistics.mean(times["direct"])
    for name, values in times.items():
        p50, mean = statistics.median(values), statistics.mean(values)
        print(f"{name:40s} TTFT p50 {p50:.3f} ms (adds {p50 - direct_p50:+.3f}), mean {mean:.3f} ms "
              f"(adds {mean - direct_mean:+.3f})", flush=True)


if __name__ == "__main__":
    main()
