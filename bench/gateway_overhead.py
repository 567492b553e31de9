"""What the gateway costs a user, in one run, each figure side by side with calling the upstream directly (not a
test; results in docs/benchmarks.md):

  .venv/bin/python bench/gateway_overhead.py [--requests 400] [--seconds 8] [--rounds 2] [--chunk-delay 0.01]
                                            [--spaced 60] [--gap 1.5] [--only-spaced]

1. CPU per request of the whole gateway process (every thread, from /proc via psutil) for 20- and 200-chunk streams
   at concurrency 16 against an unpaced fake upstream: the fixed cost and the cost per chunk (a line through both).
2. Added TTFT at concurrency 1: time to the first content event of a 20-chunk stream, directly, through a bare proxy
   on the gateway's own server and client stack (bench/bare_proxy.py: the floor any Python proxy process adds here)
   and through the gateway, the paths alternating for --rounds rounds (the median of each path's p50s).
3. Requests per second at concurrency 16, directly and through the gateway, alternating for --rounds rounds: 20-chunk
   streams paced at --chunk-delay seconds between events (0.01: 100 tokens a second, a real decode's pace), read to
   their end by a load generator in a process of its own.
4. Added TTFT at a person's pace: --spaced requests, one every --gap seconds (1.5: someone at a chat window, an agent
   between tool calls), directly and through the gateway by turns (the median of each). A gateway that checks a
   cache on the request's path when it is over half a second old shows it here, not in 2.

Goals (issue 29): at most 1.5 ms fixed + 0.02 ms per chunk; at least 95% of the direct requests per second; at most
1.0 ms of added TTFT. The fake upstreams, the gateway and the load generator share this machine's cores."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from gateway_bench import BODY, free_port, load, prepare_panel, start, stop, ttft
from gateway_cpu_bench import line_through, measure

BENCH = Path(__file__).resolve().parent
GOALS = {"fixed_ms": 1.5, "ms_per_chunk": 0.02, "rps_share": 0.95, "added_ttft_ms": 1.0}
SERVER = ["-m", "uvicorn", "panel.asgi:application", "--loop", "uvloop", "--http", "httptools", "--no-access-log",
          "--log-level", "warning"]


def upstream(chunks, delay):
    """A fake upstream serving `fake-model` (the gateway's channel) and `chat` (the name the direct calls use)."""
    port = free_port()
    process = start([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(port), "--chunks",
                     str(chunks), "--chunk-delay", str(delay), "--decode-pace", "--model", "fake-model",
                     "--model", "chat"],
                    ready_url=f"http://127.0.0.1:{port}/v1/models")
    return process, f"http://127.0.0.1:{port}/v1"


def gateway_to(upstream_url):
    env, key = prepare_panel(Path(tempfile.mkdtemp(prefix="tokenwise-overhead-")), upstream_url)
    port = free_port()
    process = start([sys.executable, *SERVER, "--port", str(port)], env=env,
                    ready_url=f"http://127.0.0.1:{port}/login/")
    return process, f"http://127.0.0.1:{port}/v1", key


def cpu_cost(args):
    """1.: the gateway process's CPU per request, fixed and per chunk."""
    fake, fake_url = upstream(200, 0.0)
    try:
        gateway, url, key = gateway_to(fake_url)
        try:
            options = argparse.Namespace(requests=args.requests, concurrency=16)
            runs = [line_through(*(measure(gateway.pid, f"{url}/chat/completions", key, options, chunks)
                                   for chunks in (20, 200))) for _ in range(args.rounds)]
        finally:
            stop(gateway)
    finally:
        stop(fake)
    return {"runs": runs, "fixed_ms": statistics.median(run["fixed_ms_per_request"] for run in runs),
            "ms_per_chunk": statistics.median(run["ms_per_chunk"] for run in runs)}


def bare_proxy_to(upstream_url, app="bare_proxy", **env):
    """bench/bare_proxy.py (or `app`, another bench relay, with `env`) on the gateway's server flags: the floor of
    any Python proxy on this stack."""
    port = free_port()
    process = start([sys.executable, *SERVER[:2], f"{app}:application", "--app-dir", str(BENCH), *SERVER[3:],
                     "--port", str(port)], env=dict(os.environ, UPSTREAM=upstream_url, **env))
    return process, relaying(port, lambda: "the bare proxy did not start")


def relaying(port, failure):
    """The base URL of a relay on `port`, once it relays a stream; SystemExit(failure()) after about 10 s."""
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(100):
        try:
            httpx.post(f"{url}/chat/completions", timeout=5, json={
                "model": "chat", "stream": True, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            return url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(failure())


NGINX = "/usr/sbin/nginx"
NGINX_CONF = """daemon off; worker_processes 1; pid {folder}/nginx.pid; error_log {folder}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off; client_body_temp_path {folder}/body; proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi; uwsgi_temp_path {folder}/uwsgi; scgi_temp_path {folder}/scgi;
  upstream fake {{ server {upstream}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port};
    location /v1/ {{ proxy_pass {upstream_path}; proxy_http_version 1.1; proxy_set_header Connection "";
                    proxy_buffering off; }}
  }}
}}
"""


def nginx_to(upstream_url, folder):
    """nginx (Debian's package: `apt-get install nginx-light`), one worker, streaming through unbuffered with pooled
    upstream connections: what a relay written in C costs per chunk on this machine, the floor any proxy shares."""
    port, parts = free_port(), urlsplit(upstream_url)
    folder = Path(folder) / "nginx"
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(folder=folder, port=port, upstream=parts.netloc,
                                      upstream_path=f"http://fake{parts.path}/"))
    process = start([NGINX, "-c", str(conf), "-p", str(folder)])
    return process, relaying(port, lambda: f"nginx did not start: {(folder / 'error.log').read_text()[-500:]}")


def side_by_side(args):
    """2. and 3.: TTFT at concurrency 1 (direct, through the bare proxy, through the gateway) and requests per second
    at concurrency 16 (direct against the gateway)."""
    fake, fake_url = upstream(20, args.chunk_delay)
    try:
        gateway, url, key = gateway_to(fake_url)
        bare, bare_url = bare_proxy_to(fake_url)
        paths = {"direct": (f"{fake_url}/chat/completions", "unused"), "gateway": (f"{url}/chat/completions", key)}
        ttfts = {name: [] for name in (*paths, "bare_proxy")}
        rates = {name: [] for name in paths}
        try:
            for _ in range(args.rounds):
                for name, (target, token) in {**paths, "bare_proxy": (f"{bare_url}/chat/completions", "-")}.items():
                    ttfts[name].append(ttft(target, {"Authorization": f"Bearer {token}"}, args.requests // 2))
                for name, (target, token) in paths.items():
                    rates[name].append(load(target, token, 16, args.seconds))
        finally:
            stop(gateway)
            stop(bare)
    finally:
        stop(fake)
    p50 = {name: statistics.median(run["p50_ms"] for run in runs) for name, runs in ttfts.items()}
    rps = {name: statistics.median(run["rps"] for run in runs) for name, runs in rates.items()}
    return {"chunk_delay_s": args.chunk_delay, "ttft": ttfts, "rps_runs": rates, "ttft_p50_ms": p50,
            "added_ttft_ms": p50["gateway"] - p50["direct"],
            "bare_proxy_added_ttft_ms": p50["bare_proxy"] - p50["direct"],
            "gateway_over_bare_proxy_ms": p50["gateway"] - p50["bare_proxy"],
            "rps": rps, "rps_share": rps["gateway"] / rps["direct"]}


def spaced(args):
    """4.: TTFT at a person's pace, one request every --gap seconds per path, the paths by turns."""
    fake, fake_url = upstream(20, args.chunk_delay)
    try:
        gateway, url, key = gateway_to(fake_url)
        paths = {"direct": (f"{fake_url}/chat/completions", "unused"), "gateway": (f"{url}/chat/completions", key)}
        times = {name: [] for name in paths}
        clients = {name: httpx.Client(timeout=30) for name in paths}
        try:
            for index in range(args.spaced + 5):  # the first five warm up
                for name, (target, token) in paths.items():
                    time.sleep(args.gap / len(paths))
                    first = first_event_ms(clients[name], target, token)
                    if index >= 5:
                        times[name].append(first)
        finally:
            stop(gateway)
            for client in clients.values():
                client.close()
    finally:
        stop(fake)
    p50 = {name: statistics.median(values) for name, values in times.items()}
    return {"gap_s": args.gap, "requests": args.spaced, "ttft_p50_ms": p50,
            "ttft_mean_ms": {name: statistics.mean(values) for name, values in times.items()},
            "added_ttft_ms": p50["gateway"] - p50["direct"]}


def first_event_ms(client, url, token):
    started = time.perf_counter()
    first = None
    with client.stream("POST", url, json=BODY, headers={"Authorization": f"Bearer {token}"}) as response:
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = (time.perf_counter() - started) * 1000
    return first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk-delay", type=float, default=0.01)
    parser.add_argument("--spaced", type=int, default=60, help="requests per path at a person's pace (4.)")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between a path's requests (4.)")
    parser.add_argument("--only-spaced", action="store_true", help="measure 4. alone")
    args = parser.parse_args()
    if args.only_spaced:
        print(json.dumps(spaced(args), indent=2), flush=True)
        return
    results = {"cpu": cpu_cost(args), **side_by_side(args), "spaced": spaced(args)}
    results["goals"] = {name: {"goal": goal, "measured": results["cpu"][name] if name in results["cpu"]
                               else results[name]} for name, goal in GOALS.items()}
    for name, row in results["goals"].items():
        higher_is_better = name == "rps_share"
        row["met"] = row["measured"] >= row["goal"] if higher_is_better else row["measured"] <= row["goal"]
    print(json.dumps(results, indent=2), flush=True)


if __name__ == "__main__":
    main()
