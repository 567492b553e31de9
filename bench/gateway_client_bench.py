"""What the gateway costs as a client sees it, with the web server started as `make run` starts it, side by side with
calling the upstream directly and with LiteLLM's proxy, in one run (not a test; results in docs/benchmarks.md):

  .venv/bin/python bench/gateway_client_bench.py [--rounds 3] [--requests 100] [--rps-rounds 2] [--seconds 8]
                                                 [--cpu-requests 400] [--cpu-concurrency 8] [--cpu-rounds 1]
                                                 [--chunk-delay 0.005] [--idle-seconds 5]
                                                 [--litellm /tmp/litellm-venv/bin/litellm] [--parts ttft,rps,cpu]
                                                 [--gateways make-run,one-worker,two-workers,single,bare-proxy,
                                                             lean-relay,lean-parse,nginx]
                                                 [--celery] [--limited-key] [--interleave] [--profile FILE]

Every piece runs in a process of its own: the fake upstream (tests/support/fake_upstream.py: content pieces
--chunk-delay apart, the end at once), a Redis of the bench's own (started by the launcher's `start_redis`, with a
password, as `make run` does), the web server started as the launcher starts it (`python -m panel.web --host H --port
P`: TOKENWISE_WEB_PROCESSES uvicorn workers, by default one per core but one, under uvicorn's supervisor when more
than one, the Prometheus folder, DEBUG off), LiteLLM's proxy (one worker) on the same upstream, and each client.

1. TTFT at concurrency 1, direct / gateway / LiteLLM in blocks of --requests sequential streams (after 5 warm-up
   ones), the paths' order turning every round: the time to the first event with content (a non-empty delta: the
   role event that comes with the headers does not count) and to the first event of any kind. The figure is the
   median of the rounds' p50s; what a path adds is that less the direct call's.
2. Requests per second at concurrency 16, 20-chunk streams read to their end, by turns for --rps-rounds rounds
   (gateway_bench.load: aiohttp in a process of its own).
3. CPU per request of the server, as a client's operator pays it: utime + stime of every process of it (the uvicorn
   supervisor and every worker, every thread, from /proc/<pid>/stat through psutil; LiteLLM's whole tree), read
   before and after --cpu-requests streams at --cpu-concurrency, for 20 and for 200 chunks; a line through both gives
   the fixed cost and the cost per chunk. Reported as measured (idle time included, the reviewer's way) and less the
   server's idle rate measured just before (over --idle-seconds); the upstream's own CPU per request beside it.

Options to find why two measures differ: --gateways make-run,one-worker,two-workers,single,bare-proxy measures, beside
the gateway as `make run` starts it, the same with one or two workers (TOKENWISE_WEB_PROCESSES), one uvicorn process as
bench/gateway_overhead.py starts it (no supervisor, no Prometheus folder) and bench/bare_proxy.py (uvicorn in, the
gateway's HTTP client out, nothing else: the floor of a Python proxy on this stack), bench/lean_relay.py (each block
written as it came from the upstream connection's callback; lean-parse: the same with the answer parsed by httptools and
framed again) and nginx (Debian's nginx-light, one worker, unbuffered: what a relay written in C pays on this machine),
each a path of its own in the same turns; --celery also starts the Celery processes `make run` starts (the default, long
and GPU workers and beat) beside the web server; --limited-key adds a path through the first gateway with a second key
that has a requests-per-minute limit and a monthly token budget (admitted from its web process's advance once it is
busy, else by a Redis call before the upstream call; its budget is counted after; the bench's own key has neither, as a
new key made on the keys page); --interleave sends the TTFT streams one per path in turn instead of in blocks, so that
the machine's busy spells fall on every path alike (others' work on a shared machine); --chunk-delay 0 serves every
stream at once; --cpu-concurrency 16 as the older benches; --cpu-rounds N measures CPU N times by turns and reports
medians, and beside the bare proxy each path's cost per chunk less the bare proxy's of the same round. The CPU measure
also says which threads spent it (the supervisor, the workers' event loops, their other threads), user and system apart.
--profile FILE adds a pass of 20-chunk streams through one gateway process whose event loop runs under cProfile on its
CPU clock (bench/gateway_cpu_bench.py's --serve-profiled) and writes the report to FILE. The whole run prints the
machine's busy CPU over it and the share of it that was not the bench's (others' work)."""
import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from gateway_bench import ROOT, free_port, litellm_start, load, prepare_panel, start, stop
from gateway_overhead import SERVER, bare_proxy_to, nginx_to, upstream

LITELLM = "/tmp/litellm-venv/bin/litellm"
PROMPT = [{"role": "user", "content": "tell me about prefix caching in one paragraph"}]
CELERY_KINDS = ("default", "long", "gpu", "beat")  # panel/launcher.py's CELERY_PROCESSES
GOALS = {"added_ttft_ms": 1.0, "fixed_ms": 1.5, "ms_per_chunk": 0.02}


def request_body(chunks):
    """A chat stream of `chunks` content pieces (the fake upstream serves as many as max_tokens asks)."""
    return {"model": "chat", "stream": True, "max_tokens": chunks, "messages": PROMPT}


def own_redis(folder):
    """A Redis with a password on a free port, started as `make run` starts its own. Returns (process, URL)."""
    sys.path.insert(0, str(ROOT))
    from panel.launcher import start_redis

    port, password = free_port(), secrets.token_urlsafe(24)
    process = start_redis(port=port, data_dir=Path(folder) / "redis", password=password)
    return process, f"redis://:{password}@127.0.0.1:{port}/0"


GATEWAYS = {"make-run": "gateway", "one-worker": "gateway_one_worker", "two-workers": "gateway_two_workers",
            "single": "gateway_single", "bare-proxy": "bare_proxy",
            "lean-relay": "lean_relay", "lean-parse": "lean_parse", "nginx": "nginx"}


def web_server(env, kind):
    """The web server as `make run` starts it (`kind` "make-run": panel/web.py with the launcher's options and
    environment; "one-worker", "two-workers": the same with TOKENWISE_WEB_PROCESSES=1, 2) or as
    bench/gateway_overhead.py does
    ("single": one uvicorn process, no supervisor, no Prometheus folder). Returns (process, base URL)."""
    port = free_port()
    env = dict(env, PYTHONUNBUFFERED="1", TOKENWISE_METRICS_TOKEN=secrets.token_urlsafe(32))
    if kind == "single":
        argv = [sys.executable, *SERVER, "--port", str(port)]
    else:
        argv = [sys.executable, "-m", "panel.web", "--host", "127.0.0.1", "--port", str(port)]
        env["PROMETHEUS_MULTIPROC_DIR"] = str(Path(env["TOKENWISE_DATA_DIR"]) / f"prometheus-{kind}")  # its own
        if kind in ("one-worker", "two-workers"):
            env["TOKENWISE_WEB_PROCESSES"] = "1" if kind == "one-worker" else "2"
    process = start(argv, env=env, ready_url=f"http://127.0.0.1:{port}/login/", seconds=120)
    return process, f"http://127.0.0.1:{port}/v1"


def celery_processes(env):
    """The Celery processes `make run` starts once the panel answers."""
    return [start([sys.executable, "-m", "workers.start", kind], env=dict(env, PYTHONUNBUFFERED="1"))
            for kind in CELERY_KINDS]


LIMITED_KEY = """
from panel.accounts.keys import key_issue
from panel.accounts.models import Team
from panel.budgets.services import budget_set
team = Team.objects.get(name="bench")
key, raw = key_issue(team=team, user=None, name="limited", rpm_limit=1_000_000)
budget_set(team=team, key=key, tokens_per_month=10**12)
print(raw)
"""


def limited_key(env):
    """A second key of the bench's team with a requests-per-minute limit and a monthly token budget (each too high
    to refuse): its admission asks Redis before the upstream call, and its budget is counted after."""
    output = subprocess.run([sys.executable, "manage.py", "shell", "-c", LIMITED_KEY], cwd=ROOT, env=env,
                            check=True, capture_output=True, text=True).stdout
    return output.strip().splitlines()[-1]


def tree(pid):
    """The process `pid` and every process under it (a uvicorn supervisor's workers, their helpers)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def thread_seconds(processes):
    """CPU seconds (user, system) of each process's main thread (a worker's event loop) and of its other threads
    together (the usage writer's, mostly), by pid."""
    found = {}
    for process in processes:
        try:
            threads = process.threads()
        except psutil.NoSuchProcess:
            continue
        main = [(t.user_time, t.system_time) for t in threads if t.id == process.pid]
        others = [(t.user_time, t.system_time) for t in threads if t.id != process.pid]
        found[process.pid] = {"main": [sum(column) for column in zip(*main)] or [0.0, 0.0],
                              "others": [sum(column) for column in zip(*others)] or [0.0, 0.0]}
    return found


def thread_spent(before, after, supervisor, count):
    """What each kind of thread spent between two thread_seconds readings, in ms per request, user and system:
    the supervisor (None for a server of one process), the workers' event loops, the workers' other threads."""
    spent = {"supervisor": [0.0, 0.0], "worker_event_loops": [0.0, 0.0], "worker_other_threads": [0.0, 0.0]}
    for pid, now in after.items():
        was = before.get(pid, {"main": [0.0, 0.0], "others": [0.0, 0.0]})
        for part in ("main", "others"):
            name = ("supervisor" if pid == supervisor else
                    "worker_event_loops" if part == "main" else "worker_other_threads")
            for index in (0, 1):
                spent[name][index] += (now[part][index] - was[part][index]) * 1000 / count
    return {name: {"user_ms": user, "system_ms": system} for name, (user, system) in spent.items()}


def cpu_seconds(processes):
    """utime + stime of `processes`, every thread (/proc/<pid>/stat); one that ended meanwhile counts nothing."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def machine_seconds():
    """CPU seconds the whole machine spent busy since boot (every core) and those the hypervisor took (steal), from
    /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


# The clients: each a process of its own (`--client SPEC`), printing one JSON line.

def client(spec):
    if spec["mode"] == "ttft":
        print(json.dumps(ttft_client(spec)), flush=True)
    else:
        asyncio.run(streams_client(spec))


def first_times(client, url, token, body):
    """Seconds to the first event and to the first event with content, of one stream read to its end."""
    started = time.perf_counter()
    first_event = first_content = None
    with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter() - started
            if first_event is None:
                first_event = now
            if first_content is None and has_content(line[6:]):
                first_content = now
    if response.status_code != 200 or first_content is None:
        raise SystemExit(f"{url} answered {response.status_code} with no content event")
    return first_event, first_content


def has_content(data):
    try:
        choices = json.loads(data).get("choices") or [{}]
    except ValueError:
        return False
    return bool((choices[0].get("delta") or {}).get("content") or choices[0].get("text"))


def ttft_client(spec):
    """Every round, each path's block of sequential streams on its own keep-alive connection, the paths' order
    turning; per path and round the p50, p95 and mean in ms, to the first content and to the first event."""
    paths, body = spec["paths"], request_body(spec["chunks"])
    clients = {path["name"]: httpx.Client(timeout=60) for path in paths}
    rounds = {path["name"]: [] for path in paths}
    for index in range(spec["rounds"]):
        order = paths[index % len(paths):] + paths[:index % len(paths)]
        if spec.get("interleave"):  # one request of each path in turn: the machine's moods fall on all alike
            times = {path["name"]: [] for path in paths}
            for number in range(5 + spec["requests"]):
                for path in order:
                    found = first_times(clients[path["name"]], path["url"], path["token"], body)
                    if number >= 5:
                        times[path["name"]].append(found)
        else:
            times = {}
            for path in order:
                http = clients[path["name"]]
                for _ in range(5):  # warm-up: the path was idle while the others ran
                    first_times(http, path["url"], path["token"], body)
                times[path["name"]] = [first_times(http, path["url"], path["token"], body)
                                       for _ in range(spec["requests"])]
        for name, found in times.items():
            rounds[name].append({"content": percentiles([content for _, content in found]),
                                 "first_event": percentiles([event for event, _ in found])})
    for http in clients.values():
        http.close()
    return rounds


def percentiles(seconds):
    ordered = sorted(value * 1000 for value in seconds)
    return {"p50_ms": statistics.median(ordered), "p95_ms": ordered[int(len(ordered) * 0.95)],
            "mean_ms": statistics.mean(ordered)}


async def streams_client(spec):
    """`warmup` streams, then "ready" and a wait for a line on stdin (the caller reads the server's CPU meanwhile),
    then `requests` streams at `concurrency`, each read to its end; prints what they took."""
    import aiohttp

    body = json.dumps(request_body(spec["chunks"])).encode()
    headers = {"Authorization": f"Bearer {spec['token']}", "content-type": "application/json"}
    failures = []

    async def send(session, count):
        for _ in range(count):
            async with session.post(spec["url"], data=body, headers=headers) as response:
                events = 0
                async for line in response.content:
                    events += line.startswith(b"data: ")
            if response.status != 200 or events < spec["chunks"]:
                failures.append((response.status, events))

    async def at_once(session, count):
        share, rest = divmod(count, spec["concurrency"])
        await asyncio.gather(*(send(session, share + (index < rest)) for index in range(spec["concurrency"])))

    connector = aiohttp.TCPConnector(limit=spec["concurrency"])
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        await at_once(session, spec["warmup"])
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.perf_counter()
        await at_once(session, spec["requests"])
        wall = time.perf_counter() - started
    print(json.dumps({"wall_s": wall, "failed": len(failures), "failures": failures[:3]}), flush=True)


def run_client(spec):
    output = subprocess.run([sys.executable, __file__, "--client", json.dumps(spec)], cwd=ROOT, capture_output=True,
                            text=True, timeout=1800)
    if output.returncode:
        raise SystemExit(f"the {spec['mode']} client failed: {output.stderr[-2000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


# The three measures.

def ttft_rounds(paths, args):
    """1.: per path, the rounds' figures and the median of their p50s; what each adds over the direct call."""
    rounds = run_client({"mode": "ttft", "paths": paths, "rounds": args.rounds, "requests": args.requests,
                         "chunks": 20, "interleave": args.interleave})
    result = {}
    for name, runs in rounds.items():
        result[name] = {kind: statistics.median(run[kind]["p50_ms"] for run in runs)
                        for kind in ("content", "first_event")}
        result[name]["rounds"] = runs
    for name, row in result.items():
        for kind in ("content", "first_event"):
            row[f"added_{kind}_ms"] = row[kind] - result["direct"][kind]
    return result


def rps_rounds(paths, args):
    """2.: requests per second at concurrency 16 by turns; the median of each path's rounds."""
    runs = {path["name"]: [] for path in paths}
    for index in range(args.rps_rounds):
        for path in paths[index % len(paths):] + paths[:index % len(paths)]:
            runs[path["name"]].append(load(path["url"], path["token"], 16, args.seconds, max_tokens=20))
    result = {name: {"rps": statistics.median(run["rps"] for run in values), "runs": values}
              for name, values in runs.items()}
    for row in result.values():
        row["share_of_direct"] = row["rps"] / result["direct"]["rps"]
    return result


@contextlib.contextmanager
def streams_ready(path, chunks, args):
    """A streams client for `path`, warmed up and waiting; the caller reads what it needs, then calls the yielded
    function, which sends the streams and returns what they took."""
    spec = {"mode": "streams", "url": path["url"], "token": path["token"], "chunks": chunks, "warmup": 40,
            "requests": args.cpu_requests, "concurrency": args.cpu_concurrency}
    runner = subprocess.Popen([sys.executable, __file__, "--client", json.dumps(spec)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def go():
        runner.stdin.write("go\n")
        runner.stdin.flush()
        done = json.loads(runner.stdout.readline())
        if done["failed"]:
            raise SystemExit(f"{done['failed']} streams through {path['name']} failed, e.g. {done['failures']}")
        return done

    try:
        if runner.stdout.readline().strip() != "ready":
            raise SystemExit(f"the streams client for {path['name']} did not start")
        yield go
    finally:
        runner.kill()
        runner.wait()


def cpu_per_request(path, server, fake, chunks, args):
    """3. for one path and size: CPU ms per request of the server's process tree (as measured, and less its idle
    rate) and of the upstream."""
    with streams_ready(path, chunks, args) as go:
        processes, upstream_processes = tree(server.pid), tree(fake.pid)
        idle_before = cpu_seconds(processes)
        time.sleep(args.idle_seconds)
        idle_rate = (cpu_seconds(processes) - idle_before) / args.idle_seconds
        before, upstream_before = cpu_seconds(processes), cpu_seconds(upstream_processes)
        threads_before = thread_seconds(processes)
        started = time.perf_counter()
        done = go()
        time.sleep(0.5)  # the usage writer's last batch (it writes every 0.2 s) counts too
        wall = time.perf_counter() - started
        spent = cpu_seconds(processes) - before
        upstream_spent = cpu_seconds(upstream_processes) - upstream_before
        threads_after = thread_seconds(processes)
    count = args.cpu_requests
    return {"chunks": chunks, "processes": len(processes), "ms_per_request": spent * 1000 / count,
            "less_idle_ms_per_request": (spent - idle_rate * wall) * 1000 / count,
            "idle_ms_per_s": idle_rate * 1000, "upstream_ms_per_request": upstream_spent * 1000 / count,
            "requests_per_s": count / done["wall_s"],
            "by_thread": thread_spent(threads_before, threads_after, server.pid if len(processes) > 1 else None,
                                      count)}


def profile(env, key, args):
    """A gateway worker's event loop under cProfile, timed by that thread's CPU clock (bench/gateway_cpu_bench.py's
    --serve-profiled: one uvicorn process, here with a Prometheus folder as a worker of `make run` has), through a
    pass of 20-chunk streams after a warm-up; the report goes to --profile. Returns the thread's CPU meanwhile,
    measured by /proc, to scale the profile's figures (cProfile's own overhead inflates them) by."""
    port, report = free_port(), Path(args.profile).resolve()
    folder = Path(env["TOKENWISE_DATA_DIR"]) / "prometheus-profiled"
    folder.mkdir(exist_ok=True)
    server = start([sys.executable, str(Path(__file__).with_name("gateway_cpu_bench.py")), "--serve-profiled",
                    str(port), str(report), "cprofile"],
                   env=dict(env, PROMETHEUS_MULTIPROC_DIR=str(folder), PYTHONPATH=str(ROOT)),
                   ready_url=f"http://127.0.0.1:{port}/login/", seconds=120)
    try:
        path = {"name": "profiled gateway", "url": f"http://127.0.0.1:{port}/v1/chat/completions", "token": key}
        with streams_ready(path, 20, args) as go:
            process = psutil.Process(server.pid)
            server.send_signal(signal.SIGUSR1)  # the profiler starts now, after the warm-up
            time.sleep(0.5)
            before = thread_seconds([process])[process.pid]
            go()
            after = thread_seconds([process])[process.pid]
    finally:
        stop(server)
    loop_ms = sum(after["main"]) - sum(before["main"])
    return {"event_loop_cpu_ms_per_request": loop_ms * 1000 / args.cpu_requests, "report": str(report)}


def cpu_line(small, large):
    """The line through a path's two sizes, as measured and less idle."""
    line = {}
    for measure, name in (("ms_per_request", "measured"), ("less_idle_ms_per_request", "less_idle")):
        per_chunk = (large[measure] - small[measure]) / (large["chunks"] - small["chunks"])
        line[name] = {"fixed_ms": small[measure] - per_chunk * small["chunks"], "ms_per_chunk": per_chunk}
    return line


def cpu_rows(paths, servers, fake, args):
    """3. for every path with a server of its own: both sizes and the line through them, as measured and less idle.
    With --cpu-rounds N the paths take turns N times and each figure is the median of the rounds; beside the bare
    proxy, each path's per-chunk cost less the bare proxy's of the same round (the machine's state moves between
    rounds far more than between two paths measured one after the other)."""
    measured = [path for path in paths if path["name"] in servers]
    rounds = {path["name"]: [] for path in measured}
    for _ in range(args.cpu_rounds):
        for path in measured:
            small, large = (cpu_per_request(path, servers[path["name"]], fake, chunks, args) for chunks in (20, 200))
            rounds[path["name"]].append({"rows": [small, large], **cpu_line(small, large)})
    result = {}
    for name, runs in rounds.items():
        row = dict(runs[len(runs) // 2], rounds=len(runs))
        for line in ("measured", "less_idle"):
            row[line] = {figure: statistics.median(run[line][figure] for run in runs)
                         for figure in ("fixed_ms", "ms_per_chunk")}
        if "bare_proxy" in rounds and name != "bare_proxy":
            row["per_chunk_over_bare_proxy_ms"] = [
                run["measured"]["ms_per_chunk"] - bare["measured"]["ms_per_chunk"]
                for run, bare in zip(runs, rounds["bare_proxy"])]
        result[name] = row
    return result


def report(results):
    """The figures in a few lines, beside the JSON."""
    lines = []
    for name, row in results.get("ttft", {}).items():
        lines.append(f"TTFT {name:8s} to content {row['content']:7.2f} ms (adds {row['added_content_ms']:+.2f}), "
                     f"to the first event {row['first_event']:7.2f} ms (adds {row['added_first_event_ms']:+.2f})")
    for name, row in results.get("rps", {}).items():
        lines.append(f"req/s c16 {name:8s} {row['rps']:7.1f} ({row['share_of_direct']:.1%} of direct)")
    for name, row in results.get("cpu", {}).items():
        small, large = row["rows"]
        lines.append(f"CPU {name:8s} {small['ms_per_request']:.2f} ms at 20 chunks, {large['ms_per_request']:.2f} at "
                     f"200: {row['measured']['fixed_ms']:.2f} ms + {row['measured']['ms_per_chunk']:.4f}/chunk "
                     f"(less idle {row['less_idle']['fixed_ms']:.2f} + {row['less_idle']['ms_per_chunk']:.4f}); "
                     f"upstream {small['upstream_ms_per_request']:.2f} / {large['upstream_ms_per_request']:.2f} ms")
        if "per_chunk_over_bare_proxy_ms" in row:
            over = row["per_chunk_over_bare_proxy_ms"]
            lines.append(f"    per chunk over the bare proxy of the same round: median "
                         f"{statistics.median(over):+.4f} ms ({', '.join(f'{value:+.4f}' for value in over)}; "
                         f"{row['rounds']} rounds)")
        for size in row["rows"]:
            lines.append(f"    {size['chunks']} chunks by thread, user + system ms per request: " + ", ".join(
                f"{part} {spent['user_ms']:.2f} + {spent['system_ms']:.2f}"
                for part, spent in size.get("by_thread", {}).items()))
    if "profile" in results:
        lines.append(f"profile: the event loop's CPU {results['profile']['event_loop_cpu_ms_per_request']:.2f} ms per "
                     f"request under cProfile; report in {results['profile']['report']}")
    machine = results["machine"]
    lines.append(f"machine busy {machine['busy_s']:.0f} CPU s over {machine['wall_s']:.0f} s on "
                 f"{machine['cores']} cores, not this bench's: {machine['others_s']:.0f} CPU s; "
                 f"stolen by the hypervisor: {machine['steal_s']:.0f} s")
    return "\n".join(lines)


def main():
    if sys.argv[1:2] == ["--client"]:
        client(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="TTFT rounds, the paths by turns")
    parser.add_argument("--requests", type=int, default=100, help="sequential streams per path and TTFT round")
    parser.add_argument("--seconds", type=float, default=8, help="seconds counted per requests/s round")
    parser.add_argument("--rps-rounds", type=int, default=2, help="requests/s rounds, the paths by turns")
    parser.add_argument("--cpu-requests", type=int, default=400, help="streams per CPU measure")
    parser.add_argument("--cpu-concurrency", type=int, default=8, help="concurrency of the CPU measure")
    parser.add_argument("--idle-seconds", type=float, default=5,
                        help="seconds over which each CPU measure first reads the server's idle rate (/proc counts "
                             "10 ms ticks: 2 s read 0, 5 or 10 ms a second)")
    parser.add_argument("--cpu-rounds", type=int, default=1,
                        help="CPU measures, the paths by turns; medians, and each path less the bare proxy by round")
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="seconds between the upstream's pieces")
    parser.add_argument("--litellm", default=LITELLM if Path(LITELLM).exists() else None,
                        help=f"the litellm command of a venv with litellm[proxy] (default {LITELLM} when there)")
    parser.add_argument("--gateways", default="make-run",
                        help="comma-separated: make-run (as `make run` starts it), one-worker (the same, one worker), "
                             "single (one uvicorn process, as gateway_overhead.py), bare-proxy (bench/bare_proxy.py): "
                             "each a path of its own")
    parser.add_argument("--celery", action="store_true", help="also start make run's Celery workers and beat")
    parser.add_argument("--interleave", action="store_true",
                        help="TTFT: one request of each path in turn, rather than each path's block in turn")
    parser.add_argument("--limited-key", action="store_true",
                        help="also call the first gateway with a key that has a limit and a budget")
    parser.add_argument("--parts", default="ttft,rps,cpu", help="which of ttft, rps, cpu to measure")
    parser.add_argument("--profile", help="after the measures, profile a gateway worker's event loop into this file")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    (busy_before, steal_before), wall_before = machine_seconds(), time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="tokenwise-client-bench-"))
    running = []
    try:
        fake, fake_url = upstream(200, args.chunk_delay)
        running.append(fake)
        redis_process, redis_url = own_redis(folder)
        running.append(redis_process)
        os.environ["REDIS_URL"] = redis_url  # prepare_panel hands it on to the panel's processes
        env, key = prepare_panel(folder, fake_url)
        paths = [{"name": "direct", "url": f"{fake_url}/chat/completions", "token": "unused"}]
        servers = {}
        for kind in args.gateways.split(","):
            server, url = (bare_proxy_to(fake_url, GATEWAYS[kind]) if kind in ("bare-proxy", "lean-relay")
                           else bare_proxy_to(fake_url, "lean_relay", LEAN_PARSE="1") if kind == "lean-parse"
                           else nginx_to(fake_url, folder) if kind == "nginx" else web_server(env, kind))
            running.append(server)
            servers[GATEWAYS[kind]] = server
            paths.append({"name": GATEWAYS[kind], "url": f"{url}/chat/completions", "token": key})
        if args.limited_key:  # the first gateway again, with the other key
            servers["limited_key"] = servers[paths[1]["name"]]
            paths.append({"name": "limited_key", "url": paths[1]["url"], "token": limited_key(env)})
        if args.celery:
            running += celery_processes(env)
        if args.litellm:
            litellm, litellm_url, master_key = litellm_start(args.litellm, fake_url)
            running.append(litellm)
            paths.append({"name": "litellm", "url": f"{litellm_url}/chat/completions", "token": master_key})
            servers["litellm"] = litellm
        results = {"settings": {**vars(args), "processes": {
            name: [" ".join(process.cmdline()[1:6]) for process in tree(server.pid)]
            for name, server in servers.items()}}}
        if "ttft" in parts:
            results["ttft"] = ttft_rounds(paths, args)
            print(json.dumps({"ttft": results["ttft"]}), flush=True)
        if "rps" in parts:
            results["rps"] = rps_rounds(paths, args)
            print(json.dumps({"rps": results["rps"]}), flush=True)
        if "cpu" in parts:
            results["cpu"] = cpu_rows(paths, servers, fake, args)
        if args.profile:
            results["profile"] = profile(env, key, args)
        ours = sum(cpu_seconds(tree(process.pid)) for process in running) + sum(os.times()[:4])
    finally:
        for process in reversed(running):
            stop(process)
    busy, steal = machine_seconds()
    results["machine"] = {"wall_s": time.perf_counter() - wall_before, "busy_s": busy - busy_before, "bench_s": ours,
                          "others_s": max(busy - busy_before - ours, 0.0), "steal_s": steal - steal_before,
                          "cores": os.cpu_count(), "load_average": os.getloadavg()}
    print(json.dumps(results, indent=2), flush=True)
    print(report(results), flush=True)


if __name__ == "__main__":
    main()
