"""Scale on queue, measured through the real panel (issue 28; a script, not a test; results in docs/benchmarks.md).

A private panel as the test run sets one up (tests/support/bench_panel.py): two GPU workers named host-a and host-b,
a default worker and beat (scraping every 2 s, the scaler deciding after each scrape), the demo model on the CPU
engine with a batch of 2, launched with one replica that may scale to two (add after 10 s of waiting requests,
remove after 30 quiet seconds). Measured from the client's side, through the gateway:
- the burst: 8 clients sending back to back; the time from its start to the scaler's decision, and to the second
  replica serving (the burst pauses while it starts: on two cores it would starve that start); each request's
  end-to-end time on one replica, and in the same burst again on two;
- the quiet: the time from the burst's end to the drain, a long request running on the drained replica (answered
  whole), and the drain's time to the engine's stop;
- requests cut: any request that did not end with its whole answer (must be 0).

    SCALE_BENCH_OUT=/tmp/scale-bench.json flock /tmp/tw-heavy.lock .venv/bin/python -m bench.scale_bench
"""
import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import httpx

from tests.support.bench_panel import bench_panel, django_setup

django_setup()  # before the panel's models are imported

from panel.accounts.keys import key_issue  # noqa: E402
from panel.channels.models import Channel, Route  # noqa: E402
from panel.hosts.models import WorkerHost  # noqa: E402
from panel.jobs.models import JobEvent  # noqa: E402
from panel.registry.demo_model import build_demo_model  # noqa: E402
from panel.registry.services import model_register  # noqa: E402
from panel.serving.models import Deployment, DeploymentState, ScalePolicy, ServingProfile  # noqa: E402
from panel.serving.services import deployment_launch, deployment_stop  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

S = DeploymentState
SERVED = "tiny-chat"
EVERY = "2"  # seconds between scrapes (the scaler decides after each)
OUTPUT_TOKENS = 512  # long enough that the engine, not the gateway, is what the clients wait for


def ask(gateway, raw, system, text, max_tokens):
    """(sent at, seconds to the whole answer, whole) of one request: whole = 200 with every asked token."""
    sent = time.monotonic()
    try:
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=300,
                           headers={"Authorization": f"Bearer {raw}"},
                           json={"model": SERVED, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                                 "messages": [{"role": "system", "content": system},
                                              {"role": "user", "content": text}]})
        whole = reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == max_tokens
    except httpx.HTTPError:
        whole = False
    return sent, time.monotonic() - sent, whole


def event_at(deployment, to_state):
    event = JobEvent.objects.filter(job_type=Deployment.job_type(), job_id=deployment.pk, to_state=to_state).first()
    return event.at.timestamp() if event else None


def main():
    out = Path(os.environ.get("SCALE_BENCH_OUT", "/tmp/scale-bench.json"))
    with bench_panel() as lab:
        team = lab.teams["team_a"]
        gateway = lab.start_gateway()
        path = lab.tmp_path / "tiny"
        build_demo_model(path)
        model = model_register(team=team, user=None, source=str(path), name="tiny")
        profile = ServingProfile.objects.create(team=team, model=model, name="tiny-cpu", served_model_name=SERVED,
                                                max_model_len=2048, block_size=32, max_num_seqs=2,
                                                max_num_batched_tokens=2048, enable_prefix_caching=True,
                                                extra_args="--enforce-eager")
        beat_env = {"TOKENWISE_SCRAPE_EVERY_SECONDS": EVERY}
        lab.start_worker("gpu", TOKENWISE_HOST_NAME="host-a")
        lab.start_worker("gpu", TOKENWISE_HOST_NAME="host-b")
        lab.start_worker("default", **beat_env)
        lab.start_worker("beat", **beat_env)
        wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).count() == 2,
                   message="both GPU workers")
        launched = time.monotonic()
        head = deployment_launch(team=team, user=None, profile=profile, replicas=1, max_replicas=2)
        ScalePolicy.objects.filter(deployment=head).update(up_after_seconds=10, down_after_seconds=30)
        wait_until(lambda: Deployment.objects.get(pk=head.pk).state == S.READY, seconds=300, interval=0.2,
                   message="ready")
        results = {"cold_start_s": round(time.monotonic() - launched, 2), "cut": 0}
        _, raw = key_issue(team=team, user=None, name="bench")
        # A queue of long answers: the defaults (15 s without a byte, 10 s to the first) are too short for it.
        Channel.objects.filter(team=team).update(first_byte_timeout_seconds=120, idle_timeout_seconds=120)
        Route.objects.filter(team=team, model_name=SERVED).update(deadline_seconds=120)
        try:
            stop, records = threading.Event(), []

            def client(number):
                while not stop.is_set():
                    records.append(ask(gateway, raw, f"You are burst client {number}.", "Count.", OUTPUT_TOKENS))

            burst_start = time.monotonic()
            wall_start = time.time()
            threads = [threading.Thread(target=client, args=(number,)) for number in range(8)]
            for thread in threads:
                thread.start()
            wait_until(lambda: len(head.replicas()) == 2, seconds=180, interval=0.2, message="the scaler's decision")
            decided = time.monotonic() - burst_start
            # The burst pauses while the second engine starts: on two cores it would starve that start, which on
            # two real hosts does not compete with it. Then the same burst again, on two replicas.
            stop.set()
            for thread in threads:
                thread.join(timeout=300)
            one_replica = list(records)
            second = head.replicas()[1]
            wait_until(lambda: Deployment.objects.get(pk=second.pk).state == S.READY, seconds=300, interval=0.2,
                       message="the second replica")
            serving = time.monotonic() - burst_start
            Channel.objects.filter(team=team).update(first_byte_timeout_seconds=120,
                                                     idle_timeout_seconds=120)  # the new replica's too
            stop.clear()
            threads = [threading.Thread(target=client, args=(number,)) for number in range(8)]
            for thread in threads:
                thread.start()
            time.sleep(45)
            stop.set()
            for thread in threads:
                thread.join(timeout=300)
            burst_end = time.monotonic()
            two_replicas = records[len(one_replica):]
            before = [seconds for _, seconds, _ in one_replica]
            after = [seconds for _, seconds, _ in two_replicas]
            results["burst"] = {
                "clients": 8, "output_tokens": OUTPUT_TOKENS, "requests": len(records),
                "to_decision_s": round(decided, 2), "to_second_replica_serving_s": round(serving, 2),
                "second_replica_start_s": round(serving - decided, 2), "host": second.host.host,
                "e2e_p50_one_replica_s": round(statistics.median(before), 2) if before else None,
                "e2e_p50_two_replicas_s": round(statistics.median(after), 2) if after else None,
                "requests_one_replica": len(before), "requests_two_replicas": len(after)}
            results["cut"] += sum(1 for _, _, whole in records if not whole)
            print(f"burst: {results['burst']}", flush=True)

            # Quiet: a long request on the second replica's tenant just before the drain is due.
            time.sleep(max(0.0, 30 - (time.monotonic() - burst_end) - 2))
            system = next(f"You are the assistant of tenant {n}. " * 30 for n in range(200)
                          if _home(head, f"You are the assistant of tenant {n}. " * 30) == second.pk)
            long = {}
            thread = threading.Thread(target=lambda: long.setdefault("r", ask(gateway, raw, system, "A story.", 1500)))
            thread.start()
            wait_until(lambda: Deployment.objects.get(pk=second.pk).state != S.READY, seconds=120, interval=0.2,
                       message="the drain")
            drained_at = time.monotonic()
            was_running = thread.is_alive()
            thread.join(timeout=300)
            wait_until(lambda: Deployment.objects.get(pk=second.pk).state == S.STOPPED, seconds=180, interval=0.2,
                       message="the drained replica stopped")
            draining, stopped = event_at(second, S.DRAINING), event_at(second, S.STOPPED)
            _, long_seconds, whole = long["r"]
            results["cut"] += 0 if whole else 1
            results["hosts"] = [replica.host.host for replica in head.replicas()]
            results["quiet"] = {"burst_end_to_drain_s": round(drained_at - burst_end, 2),
                                "long_request_running_at_drain": was_running, "long_request_whole": whole,
                                "long_request_s": round(long_seconds, 2),
                                "drain_to_stopped_s": round(stopped - draining, 2) if stopped and draining else None,
                                "last_decision": ScalePolicy.objects.get(deployment=head).last_decision}
            print(f"quiet: {results['quiet']}", flush=True)
            results["since"] = wall_start
        finally:
            deployment_stop(deployment=Deployment.objects.get(pk=head.pk))
            wait_until(lambda: all(r.state in (S.STOPPED, S.FAILED) for r in head.replicas()), seconds=120,
                       message="stopped")
        with open("/proc/cpuinfo") as handle:
            results["cpu"] = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
        results["cores"] = os.cpu_count()
        out.write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        shutil.rmtree(lab.tmp_path, ignore_errors=True)


def _home(head, system):
    """The replica (deployment id) whose channel the gateway's prefix-aware balancing picks for `system`."""
    from types import SimpleNamespace

    from panel.channels.models import Route
    from panel.gateway.balancing import prefix_digest, prefix_text, rendezvous

    route = Route.objects.get(team=head.team, model_name=SERVED)
    links = list(route.routechannel_set.filter(channel__enabled=True).order_by("position")
                 .values_list("channel_id", "channel__deployment_id"))
    pool = [SimpleNamespace(id=channel) for channel, _ in links]
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": ""}]}
    return links[rendezvous(prefix_digest(prefix_text(body)), pool)[0]][1]


if __name__ == "__main__":
    main()
