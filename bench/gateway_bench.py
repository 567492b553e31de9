"""Gateway overhead against a fake streaming upstream on this machine (not a test; results in docs/benchmarks.md).

  .venv/bin/python bench/gateway_bench.py [--requests 300] [--seconds 10] [--litellm /path/to/venv/bin/litellm]
                                          [--messages-only]

1. TTFT at concurrency 1: time to the first content event of a 20-chunk stream, calling the fake upstream
   directly and through the gateway (p50/p95, and the difference = what the gateway adds).
2. Requests per second at concurrency 16 with 20-chunk streams (wrk), directly, through the gateway and, when
   --litellm is given, through LiteLLM's proxy configured for the same upstream.
3. The Messages row: TTFT (to the first text delta) of an Anthropic Messages stream through the gateway to the same
   chat-only upstream, translated both ways, at concurrency 1 and 16, beside the chat stream directly and through
   the gateway at the same concurrency. --messages-only runs this part alone (no wrk needed).
4. --throughput: requests per second at concurrency 16 and 64 through the web server as `make run` starts it
   (panel/web.py) with 1 and --processes N processes (TOKENWISE_WEB_PROCESSES), 20-chunk streams read to the end.
   The load generator is this file's own (`--load`, aiohttp, one process); it reports its own CPU time over the
   wall time, the share of a core it took from the gateway and the upstream on the same machine. No wrk needed.
Each server runs as its own process with one worker; the load generator runs on the same 2 cores."""
import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": "chat", "stream": True, "max_tokens": 64,
        "messages": [{"role": "user", "content": "tell me about prefix caching in one paragraph"}]}
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
"""


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(argv, env=None, ready_url=None, seconds=60):
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + seconds
    while ready_url and time.monotonic() < deadline:
        try:
            httpx.get(ready_url, timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.2)
    if ready_url:
        raise SystemExit(f"{argv[:3]} did not start")
    return process


def stop(process):
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=20)


def ttft(url, headers, count):
    """Seconds to the first content event, for `count` sequential streams on one keep-alive connection."""
    times = []
    with httpx.Client(timeout=30) as client:
        for index in range(count + 20):
            started = time.perf_counter()
            with client.stream("POST", url, json=BODY, headers=headers) as response:
                first = None
                for line in response.iter_lines():
                    if first is None and line.startswith("data: ") and '"content"' in line:
                        first = time.perf_counter() - started
            if index >= 20:  # warm-up first
                times.append(first)
    times.sort()
    return {"p50_ms": statistics.median(times) * 1000, "p95_ms": times[int(len(times) * 0.95)] * 1000}


MESSAGES_BODY = {"model": "chat", "stream": True, "max_tokens": 64,
                 "messages": [{"role": "user", "content": "tell me about prefix caching in one paragraph"}]}


async def _ttft_concurrent(url, headers, body, marker, count, concurrency):
    times = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def one():
            started = time.perf_counter()
            first = None
            async with client.stream("POST", url, json=body, headers=headers) as response:
                async for line in response.aiter_lines():
                    if first is None and marker in line:
                        first = time.perf_counter() - started
                if first is None:
                    raise SystemExit(f"{url} answered {response.status_code} with no {marker}")
            return first

        async def worker(requests):
            for _ in range(requests):
                times.append(await one())

        await asyncio.gather(*(one() for _ in range(concurrency * 2)))  # warm-up: connections open
        await asyncio.gather(*(worker(max(1, count // concurrency)) for _ in range(concurrency)))
    times.sort()
    return {"p50_ms": statistics.median(times) * 1000, "p95_ms": times[int(len(times) * 0.95)] * 1000}


def messages_rows(upstream_url, gateway_url, key, count):
    """TTFT at concurrency 1 and 16: chat directly, chat through the gateway, Messages through the gateway
    (translated to the chat-only upstream and back)."""
    auth = {"Authorization": f"Bearer {key}"}
    rows = {}
    for concurrency in (1, 16):
        direct = dict(BODY, model="fake-model")
        rows[f"c{concurrency}"] = {
            "direct_chat": asyncio.run(_ttft_concurrent(f"{upstream_url}/chat/completions", {}, direct, '"content"',
                                                        count, concurrency)),
            "gateway_chat": asyncio.run(_ttft_concurrent(f"{gateway_url}/v1/chat/completions", auth,
                                                         dict(BODY, model="chat"), '"content"', count, concurrency)),
            "gateway_messages": asyncio.run(_ttft_concurrent(f"{gateway_url}/v1/messages", {"x-api-key": key},
                                                             MESSAGES_BODY, "text_delta", count, concurrency))}
        row = rows[f"c{concurrency}"]
        row["added_by_messages_p50_ms"] = row["gateway_messages"]["p50_ms"] - row["direct_chat"]["p50_ms"]
        row["translation_over_chat_p50_ms"] = row["gateway_messages"]["p50_ms"] - row["gateway_chat"]["p50_ms"]
    return rows


def rps(url, key, seconds, connections=16):
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (json.dumps(BODY), key))
    output = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
                            capture_output=True, text=True, timeout=seconds + 30).stdout
    requests = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {"rps": requests, "non_2xx": int(errors.group(1)) if errors else 0}


async def _load(url, key, concurrency, seconds, warmup=2.0, max_tokens=None):
    """Streams sent by `concurrency` clients for `warmup` + `seconds`; what the last `seconds` gave. `max_tokens`
    (the fake upstream's piece count) replaces BODY's when given."""
    import aiohttp

    request = BODY if max_tokens is None else dict(BODY, max_tokens=max_tokens)
    body, headers = json.dumps(request).encode(), {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    counts = {"ok": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + warmup
    until = measure_from + seconds

    async def client(session):
        while (now := loop.time()) < until:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
            if now >= measure_from:
                counts["ok" if response.status == 200 else "failed"] += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.sleep(0)
        cpu_before = time.process_time()
        wall_before = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    return {"concurrency": concurrency, "rps": counts["ok"] / seconds, "failed": counts["failed"],
            "load_generator_cpu_share": round(cpu / wall, 3)}


def load(url, key, concurrency, seconds, max_tokens=None):
    """The load generator as a process of its own, so its CPU is its own and not the gateway's."""
    output = subprocess.run([sys.executable, __file__, "--load", url, key, str(concurrency), str(seconds),
                             *([str(max_tokens)] if max_tokens else [])],
                            cwd=ROOT, capture_output=True, text=True, check=True, timeout=seconds + 120).stdout
    return json.loads(output.strip().splitlines()[-1])


def throughput(upstream_url, env, key, processes, seconds):
    """Requests per second at concurrency 16 and 64 through panel/web.py with 1 and `processes` processes."""
    rows = []
    for count in sorted({1, processes}):
        port = free_port()
        server = start([sys.executable, "-m", "panel.web", "--host", "127.0.0.1", "--port", str(port),
                        "--log-level", "warning"], env=dict(env, TOKENWISE_WEB_PROCESSES=str(count)),
                       ready_url=f"http://127.0.0.1:{port}/login/")
        try:
            for concurrency in (16, 64):
                row = load(f"http://127.0.0.1:{port}/v1/chat/completions", key, concurrency, seconds)
                rows.append({"web_processes": count, **row})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            stop(server)
    return rows


def prepare_panel(data_dir, upstream_url, root=ROOT):
    """A fresh database with one team, a channel to the fake upstream, a route `chat` and a key (migrated and made
    by the code of `root`)."""
    env = dict(os.environ, TOKENWISE_DATA_DIR=str(data_dir), SECRET_KEY=secrets.token_urlsafe(50),
               TOKENWISE_ENCRYPTION_KEYS=__import__("cryptography.fernet").fernet.Fernet.generate_key().decode(),
               REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/9"),
               DJANGO_SETTINGS_MODULE="panel.settings",
               TOKENWISE_OUTBOUND_ALLOW="127.0.0.0/8")  # the fake upstream is on loopback
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, env=env, check=True)
    code = f"""
from panel.accounts.models import Team
from panel.channels.models import Channel, Route, RouteChannel
from panel.accounts.keys import key_issue
team = Team.objects.create(name="bench")
channel = Channel.objects.create(team=team, name="fake", kind="remote", base_url={upstream_url!r},
                                 model_id="fake-model", credential_kind="none", timeout_seconds=30, max_retries=0)
route = Route.objects.create(team=team, model_name="chat")
RouteChannel.objects.create(route=route, channel=channel, position=1)
print(key_issue(team=team, user=None, name="bench")[1])
"""
    key = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=root, env=env, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return env, key


def main():
    if sys.argv[1:2] == ["--load"]:
        url, key, concurrency, seconds, *max_tokens = sys.argv[2:7]
        print(json.dumps(asyncio.run(_load(url, key, int(concurrency), float(seconds),
                                           max_tokens=int(max_tokens[0]) if max_tokens else None))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--litellm", help="path to the litellm command of a venv with litellm[proxy]")
    parser.add_argument("--messages-only", action="store_true", help="only the Messages row (3.)")
    parser.add_argument("--throughput", action="store_true", help="only the requests per second of panel/web.py (4.)")
    parser.add_argument("--processes", type=int, default=2, help="web processes beside 1, for --throughput")
    args = parser.parse_args()
    results = {}
    up_port, gw_port = free_port(), free_port()
    upstream = start([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(up_port), "--chunks", "20",
                      "--model", "fake-model"], ready_url=f"http://127.0.0.1:{up_port}/v1/models")
    upstream_url = f"http://127.0.0.1:{up_port}/v1"
    data_dir = Path(tempfile.mkdtemp(prefix="tokenwise-bench-"))
    env, key = prepare_panel(data_dir, upstream_url)
    gateway = start([sys.executable, "-m", "uvicorn", "panel.asgi:application", "--port", str(gw_port), "--loop",
                     "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"], env=env,
                    ready_url=f"http://127.0.0.1:{gw_port}/login/")
    auth = {"Authorization": f"Bearer {key}"}
    try:
        if args.throughput:
            print(json.dumps(throughput(upstream_url, env, key, args.processes, args.seconds), indent=2))
            return
        if args.messages_only:
            print(json.dumps(messages_rows(upstream_url, f"http://127.0.0.1:{gw_port}", key, args.requests),
                             indent=2))
            return
        results["messages"] = messages_rows(upstream_url, f"http://127.0.0.1:{gw_port}", key, args.requests)
        direct_body = dict(BODY, model="fake-model")
        BODY.update(direct_body)
        results["direct_ttft"] = ttft(f"{upstream_url}/chat/completions", {}, args.requests)
        results["direct_rps"] = rps(f"{upstream_url}/chat/completions", "none", args.seconds)
        BODY["model"] = "chat"
        results["gateway_ttft"] = ttft(f"http://127.0.0.1:{gw_port}/v1/chat/completions", auth, args.requests)
        results["gateway_rps"] = rps(f"http://127.0.0.1:{gw_port}/v1/chat/completions", key, args.seconds)
        if args.litellm:
            print(json.dumps(results), flush=True)  # the panel's numbers, before the slower LiteLLM part
            results.update(run_litellm(args, upstream_url))
    finally:
        stop(gateway)
        stop(upstream)
    results["added_ttft_p50_ms"] = results["gateway_ttft"]["p50_ms"] - results["direct_ttft"]["p50_ms"]
    print(json.dumps(results, indent=2))


def run_litellm(args, upstream_url):
    proxy, url, master_key = litellm_start(args.litellm, upstream_url)
    try:
        BODY["model"] = "chat"
        return {"litellm_ttft": ttft(f"{url}/chat/completions", {"Authorization": f"Bearer {master_key}"},
                                     args.requests),
                "litellm_rps": rps(f"{url}/chat/completions", master_key, args.seconds)}
    finally:
        stop(proxy)


def litellm_start(command, upstream_url):
    """LiteLLM's proxy (`command`: the litellm of a venv with litellm[proxy]) in one worker, serving the route `chat`
    from `upstream_url` with no retries. Returns (process, base URL ending in /v1, master key)."""
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "litellm.yaml"
    config.write_text(f"""model_list:
  - model_name: chat
    litellm_params:
      model: openai/fake-model
      api_base: {upstream_url}
      api_key: none
litellm_settings:
  num_retries: 0
""")
    master_key = "sk-" + secrets.token_hex(24)
    proxy = start([command, "--config", str(config), "--port", str(port), "--num_workers", "1"],
                  env=dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=master_key),
                  ready_url=f"http://127.0.0.1:{port}/health/readiness", seconds=180)
    return proxy, f"http://127.0.0.1:{port}/v1", master_key

if __name__ == "__main__":
    main()
