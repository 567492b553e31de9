"""bench/replica_bench.py's workload through the real panel (phase 2 of issue 19's "Numbers"; not a test of the
suite, results in docs/benchmarks.md; a script, not a test).

It sets up a private panel as the test run does (tests/support/bench_panel.py: a private Redis, an SQLite file, real
Celery workers, the gateway under uvicorn) and does what an operator does: two GPU workers with their own
TOKENWISE_HOST_NAME (host-a, host-b: two "hosts" on this one machine, each engine pinned to its own core with
VLLM_CPU_OMP_THREADS_BIND), the demo model registered, a serving profile whose extra_args cap the KV cache
(--num-gpu-blocks-override), a deployment launched with replicas=2, and the route the deployment made, whose
`balance` is set per arm. Every request goes to the gateway's
/v1/chat/completions; which replica served it is read from its usage row (x-request-id → RequestLog.channel).
The kill arm SIGKILLs one replica's engine process group mid-run and lets the supervisor restart it. Stop at the
end, then psutil: no engine process may be left.

    REPLICA_BENCH_ARGS="--kv-blocks 144 --rate 4 --seconds 90 --kill" REPLICA_BENCH_OUT=/tmp/replica-gateway.json \
    flock /tmp/tw-heavy.lock .venv/bin/python -m bench.replica_gateway_bench
"""
import asyncio
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from tests.support.bench_panel import bench_panel, django_setup

django_setup()  # before the panel's models are imported

from bench import replica_bench as rb  # noqa: E402
from panel.accounts.keys import key_issue  # noqa: E402
from panel.channels.models import Channel, Route  # noqa: E402
from panel.channels.routing import routing_changed  # noqa: E402
from panel.core import crypto  # noqa: E402
from panel.hosts.models import WorkerHost  # noqa: E402
from panel.registry.services import model_register  # noqa: E402
from panel.serving.models import Deployment, DeploymentState, ServingProfile  # noqa: E402
from panel.serving.services import deployment_launch, deployment_stop  # noqa: E402
from panel.usage.models import RequestLog  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

S = DeploymentState
SERVED = "tiny-chat"


def engine_url(replica):
    return replica.base_url.removesuffix("/v1")


def engine_headers(replica):
    return {"Authorization": f"Bearer {crypto.decrypt(replica.engine_key_ciphertext)}"}


async def engine_counters(replicas):
    out = []
    for replica in replicas:
        async with httpx.AsyncClient(timeout=10, headers=engine_headers(replica)) as client:
            out.append(await rb.counters(client, engine_url(replica)))
    return out


def renice_group(group, niceness):
    """Every thread of an engine's process group at `niceness` (the engines' compute then yields to the gateway
    and the load generator on these shared cores, as a GPU's would not take their CPU). Each thread has its own."""
    if not niceness:
        return
    for process in psutil.process_iter():
        if _pgid(process) == group:
            for thread in process.threads():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, thread.id, niceness)


def fresh(replicas):
    return [Deployment.objects.get(pk=replica.pk) for replica in replicas]


def attribute(records, channel_to_replica, seconds=30):
    """Each record's replica from its usage row (the gateway writes rows in batches, so wait for them)."""
    ids = [r["request_id"] for r in records if r.get("request_id")]
    wait_until(lambda: RequestLog.objects.filter(request_id__in=ids).count() >= len(ids), seconds=seconds,
               message="the arm's usage rows")
    rows = {row.request_id: row for row in RequestLog.objects.filter(request_id__in=ids)}
    for record in records:
        row = rows.get(record.get("request_id"))
        record["replica"] = channel_to_replica.get(row.channel_id) if row else None
        record["fell_back"] = bool(row and row.fell_back)
        record["outcome"] = row.outcome if row else None
    return rows


def main():
    with bench_panel() as lab:
        replicas_through_the_gateway(lab)


def replicas_through_the_gateway(lab):
    args = rb.build_parser().parse_args(shlex.split(os.environ.get("REPLICA_BENCH_ARGS", "")))
    out = Path(os.environ.get("REPLICA_BENCH_OUT", "/tmp/replica-gateway-bench.json"))
    team = lab.teams["team_a"]
    gateway = lab.start_gateway()
    path = lab.tmp_path / "tiny"
    shutil.copytree(rb.demo_model_path(), path)
    model = model_register(team=team, user=None, source=str(path), name="tiny")
    extra = f"--enforce-eager --num-gpu-blocks-override {args.kv_blocks}"
    profile = ServingProfile.objects.create(team=team, model=model, name="tiny-cpu", served_model_name=SERVED,
                                            max_model_len=args.max_model_len, block_size=32,
                                            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=2048,
                                            enable_chunked_prefill=True, enable_prefix_caching=True,
                                            extra_args=extra)
    for index, host in enumerate(("host-a", "host-b")):
        env = {"TOKENWISE_HOST_NAME": host}
        if args.pin:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(index % os.cpu_count())
        lab.start_worker("gpu", **env)
    wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).count() == 2,
               message="both GPU workers")

    launched = time.monotonic()
    head = deployment_launch(team=team, user=None, profile=profile, replicas=2)
    ready_s = {}

    def both_ready():
        for replica in head.replicas():
            if replica.state == S.READY and replica.pk not in ready_s:
                ready_s[replica.pk] = time.monotonic() - launched
            if replica.state in (S.FAILED, S.STOPPED):
                raise SystemExit(f"replica_gateway_bench: a replica ended {replica.state}: {replica.failure_reason}")
        return len(ready_s) == 2

    wait_until(both_ready, seconds=400, interval=0.5, message="both replicas")
    replicas = head.replicas()
    for replica in replicas:
        renice_group(replica.pid, args.engine_nice)
    # One replica per "host" is the set-up measured (each worker pins its engine to its own core); a run where
    # placement stacked both on one host (seen once: both on host-a, both engines on core 0) measures contention.
    if len({replica.host.host for replica in replicas}) != 2:
        raise SystemExit(f"replica_gateway_bench: both replicas were placed on one host "
                         f"({[replica.host.host for replica in replicas]}): that measures contention, not two hosts")
    results = {"machine": rb.machine(), "args": vars(args), "routing": "the gateway (route.balance)",
               "profile_extra_args": extra, "command": replicas[0].command,
               "hosts": [replica.host.host for replica in replicas],
               "ready_s": [round(ready_s[replica.pk], 1) for replica in replicas]}
    route = Route.objects.get(team=team, model_name=SERVED)
    channels = {channel.pk: index for index, replica in enumerate(replicas)
                for channel in Channel.objects.filter(deployment=replica)}
    _, raw = key_issue(team=team, user=lab.teams["alice"], name="bench")
    target = rb.ThroughGateway(rb.Gateway(gateway.url, raw))
    rb.log(f"both replicas ready ({results['ready_s']} s after launch) on {results['hosts']}; "
           f"route {route.model_name} over channels {list(channels)}")

    async def calibrate():
        replica = replicas[0]
        async with httpx.AsyncClient(timeout=60, headers=engine_headers(replica)) as client:
            sample = rb.words(random.Random(7), 2000)
            response = await client.post(f"{engine_url(replica)}/tokenize",
                                         json={"model": SERVED, "prompt": sample, "add_special_tokens": False})
            return 2000 / response.json()["count"]

    words_per_token = asyncio.run(calibrate())

    def homes_of(records, tenants):
        """Each tenant's home: the replica most of its requests went to (the prefix's held replica)."""
        seen = {}
        for record in records:
            if record.get("replica") is not None:
                seen.setdefault(record["tenant"], []).append(record["replica"])
        return [max(set(seen[t]), key=seen[t].count) if t in seen else None for t in range(tenants)]

    def arm(policy, arm_index, events, side=None):
        route.balance = policy
        route.save(update_fields=["balance"])
        routing_changed(team.pk)
        time.sleep(1.0)  # every gateway process sees the new route (routing version check)
        prompts = rb.system_prompts(args, arm_index, words_per_token)
        live = fresh(replicas)
        before = asyncio.run(engine_counters(live))
        records, wall, side_result = asyncio.run(rb.drive(args, target, prompts, events, model=SERVED, side=side))
        now = fresh(replicas)
        after = asyncio.run(engine_counters(now))
        # A restarted engine's counters begin again from zero: not comparable, left out.
        before = [b if old.pid == new.pid else None for b, old, new in zip(before, live, now)]
        rows = attribute(records, channels)
        homes = homes_of(records, len(prompts))
        result = rb.summarize(policy, records, wall, before, after, homes=homes,
                              spills=sum(1 for r in records if r.get("replica") is not None
                                         and r["replica"] != homes[r["tenant"]])
                              if policy in ("prefix_aware", "kv_events") else None)
        result["fell_back_rows"] = sum(1 for row in rows.values() if row.fell_back)
        # How the KV-event arm placed each request (its trail's first step): by an engine's events, a miss or a
        # tie left to the prefix rule, or the prefix rule because a replica's events were not heard.
        result["kv_steps"] = dict(Counter(row.attempt_trail[0]["outcome"] for row in rows.values()
                                          if row.attempt_trail and row.attempt_trail[0]["outcome"].startswith("kv_")))
        return result, records, side_result

    # Warm-up (prompts no arm uses), then the arms.
    rb.log(f"{words_per_token:.3f} words per token; warm-up")
    arm("round_robin", 99, [(0.5 * i, i % args.tenants, args.user_words, i) for i in range(8)])
    results["arms"] = []
    arm_index = 0
    for rate in [float(r) for r in (args.rates or str(args.rate)).split(",")]:
        events = rb.schedule(args, rate)
        rb.log(f"{len(events)} requests per arm over {args.seconds} s ({args.arrivals}, {rate}/s)")
        for policy in args.arms.split(","):
            result, _, _ = arm(policy, arm_index, events)
            arm_index += 1
            result["rate"] = rate
            results["arms"].append(result)
            rb.log(json.dumps({k: v for k, v in result.items() if k not in ("per_replica", "records")}))
            rb.log(json.dumps(result["per_replica"]))
            out.write_text(json.dumps(results, indent=1))

    if args.kill:
        victim = fresh(replicas)[1]
        first_ready_s = results["ready_s"][1]
        first_engine_s = (victim.ready_at - victim.started_at).total_seconds()  # claimed by its worker -> ready
        kill = {}

        async def killer(start):
            await asyncio.sleep(args.kill_at)
            url = engine_url(victim)
            async with httpx.AsyncClient(timeout=5, headers=engine_headers(victim)) as client:
                waited = time.perf_counter()
                while time.perf_counter() - waited < 15:  # kill while streams are running on it
                    text = (await client.get(f"{url}/metrics")).text
                    running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                  if line.startswith("vllm:num_requests_running"))
                    if running >= 2:
                        break
                    await asyncio.sleep(0.02)
            family = [p.pid for p in psutil.process_iter() if _pgid(p) == victim.pid]
            kill.update(running_at_kill=running, at_s=round(time.perf_counter() - start, 2), group=family)
            os.killpg(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            rb.log(f"SIGKILLed replica 1's engine group {victim.pid} ({len(family)} processes, {running:.0f} "
                   "requests running on it)")
            while time.monotonic() - killed < 10:  # out of rotation: its channel disabled for every process
                if not await asyncio.to_thread(
                        lambda: Channel.objects.filter(deployment=victim, enabled=True).exists()):
                    kill["channel_disabled_s"] = round(time.monotonic() - killed, 2)
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(max(0.0, 2 - (time.monotonic() - killed)))
            kill["left_of_group_after_2s"] = [pid for pid in family if _alive(pid)]
            while time.monotonic() - killed < 400:
                row = await asyncio.to_thread(lambda: Deployment.objects.get(pk=victim.pk))
                if row.restarts >= 1 and row.state == S.READY:
                    kill["ready_again_s"] = round(time.monotonic() - killed, 1)
                    kill["first_start_ready_s"] = first_ready_s
                    kill["new_pid"] = row.pid
                    # The supervisor's part (death seen, backoff) and the engine's (claimed again -> ready).
                    kill["restart_engine_start_s"] = round((row.ready_at - row.started_at).total_seconds(), 1)
                    kill["first_engine_start_s"] = round(first_engine_s, 1)
                    renice_group(row.pid, args.engine_nice)
                    break
                await asyncio.sleep(0.25)
            rb.log(f"replica 1 ready again {kill.get('ready_again_s')} s after the kill (first start: "
                   f"{first_ready_s} s)")
            return kill

        events = [e for e in rb.schedule(args, args.rate) if e[0] < args.kill_seconds]
        result, records, _ = arm("prefix_aware", 50, events, side=killer)
        failed = [r for r in records if r.get("error")]
        result["kill"] = dict(kill, failed=len(failed),
                              failed_on_replica=sorted({str(r.get("replica")) for r in failed}),
                              failed_had_started=sum(1 for r in failed if r.get("started_stream")),
                              failed_outcomes=sorted({str(r.get("outcome")) for r in failed}),
                              failed_errors=sorted({r["error"][:80] for r in failed})[:5])
        results["kill_arm"] = result
        rb.log(json.dumps({k: v for k, v in result.items() if k != "records"}))
        out.write_text(json.dumps(results, indent=1))

    if deployment_stop(deployment=head) is not True:
        raise SystemExit("replica_gateway_bench: the deployment did not accept the stop")
    stopped = time.monotonic()
    wait_until(lambda: {r.state for r in head.replicas()} <= {S.STOPPED, S.FAILED}, seconds=90, message="stopped")
    results["stop_s"] = round(time.monotonic() - stopped, 1)
    time.sleep(1)
    results["engine_processes_after_stop"] = [p.pid for p in psutil.process_iter(["cmdline", "status"])
                                              if p.info["status"] != psutil.STATUS_ZOMBIE
                                              and str(path) in " ".join(p.info["cmdline"] or [])]
    out.write_text(json.dumps(results, indent=1))
    print("\n" + rb.table(results))
    print(json.dumps({k: v for k, v in results.items() if k not in ("arms", "kill_arm")}
                     | {"kill": results.get("kill_arm", {}).get("kill")}, indent=1))
    if results["engine_processes_after_stop"]:
        raise SystemExit(f"replica_gateway_bench: engine processes left after the stop: "
                         f"{results['engine_processes_after_stop']}")


def _pgid(process):
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, psutil.Error):
        return None


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    main()
