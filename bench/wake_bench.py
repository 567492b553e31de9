"""Sleep when idle, measured through the real panel (issue 28; a script, not a test; results in docs/benchmarks.md).

A private panel as the test run sets one up (tests/support/bench_panel.py): one GPU worker, the demo model on the
CPU engine with a profile that sleeps after 6 idle seconds, its route set to wait for a waking engine. Measured, from
the client's side:
- the cold start at launch (launch -> ready), for comparison;
- per round: the deployment falls asleep and its engine's process is gone; one streamed request is sent; its time
  to the first content byte (the wake as a client sees it) and the deployment's own waking -> ready time;
- a request sent the moment the deployment falls asleep (during the drain): answered by the same engine, not cut;
- requests cut: any request that did not end with its answer (must be 0).

    WAKE_BENCH_ROUNDS=3 WAKE_BENCH_OUT=/tmp/wake-bench.json \
    flock /tmp/tw-heavy.lock .venv/bin/python -m bench.wake_bench
"""
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import psutil

from tests.support.bench_panel import bench_panel, django_setup

django_setup()  # before the panel's models are imported

from panel.accounts.keys import key_issue  # noqa: E402
from panel.channels.models import Route  # noqa: E402
from panel.hosts.models import WorkerHost  # noqa: E402
from panel.jobs.models import JobEvent  # noqa: E402
from panel.registry.demo_model import build_demo_model  # noqa: E402
from panel.registry.services import model_register  # noqa: E402
from panel.serving.models import Deployment, DeploymentState, ServingProfile  # noqa: E402
from panel.serving.services import deployment_launch, deployment_stop  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

S = DeploymentState
SERVED = "tiny-chat"


def state(deployment):
    return Deployment.objects.filter(pk=deployment.pk).values_list("state", flat=True).first()


def streamed(gateway, raw, text):
    """(seconds to the first content byte, seconds to the end, ok) of one streamed request, from the client."""
    sent = time.monotonic()
    first = None
    ok = False
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", timeout=300,
                      headers={"Authorization": f"Bearer {raw}"},
                      json={"model": SERVED, "max_tokens": 8, "stream": True,
                            "messages": [{"role": "user", "content": text}]}) as response:
        for line in response.iter_lines():
            if first is None and '"content"' in line:
                first = time.monotonic() - sent
            if line.strip() == "data: [DONE]":
                ok = response.status_code == 200
    return first, time.monotonic() - sent, ok


def last_wake_seconds(deployment):
    """The deployment's own waking -> ready time of its last wake (JobEvents)."""
    events = list(JobEvent.objects.filter(job_type=deployment.job_type(), job_id=deployment.pk)
                  .order_by("-at", "-pk").values_list("to_state", "at")[:4])
    at = {to: when for to, when in reversed(events)}
    if S.WAKING in at and S.READY in at and at[S.READY] > at[S.WAKING]:
        return (at[S.READY] - at[S.WAKING]).total_seconds()
    return None


def main():
    rounds = int(os.environ.get("WAKE_BENCH_ROUNDS", "3"))
    out = Path(os.environ.get("WAKE_BENCH_OUT", "/tmp/wake-bench.json"))
    with bench_panel() as lab:
        team = lab.teams["team_a"]
        gateway = lab.start_gateway()
        path = lab.tmp_path / "tiny"
        build_demo_model(path)
        model = model_register(team=team, user=None, source=str(path), name="tiny")
        profile = ServingProfile.objects.create(team=team, model=model, name="tiny-cpu", served_model_name=SERVED,
                                                max_model_len=2048, block_size=32, max_num_seqs=8,
                                                max_num_batched_tokens=2048, extra_args="--enforce-eager",
                                                sleep_after_minutes=0.1)
        lab.start_worker("gpu")
        wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).exists(), message="worker")
        launched = time.monotonic()
        deployment = deployment_launch(team=team, user=None, profile=profile)
        wait_until(lambda: state(deployment) == S.READY, seconds=300, interval=0.2, message="ready")
        cold_start = time.monotonic() - launched
        Route.objects.filter(team=team, model_name=SERVED).update(while_waking="wait", deadline_seconds=240)
        _, raw = key_issue(team=team, user=None, name="bench")
        results = {"cold_start_s": round(cold_start, 2), "rounds": [], "cut": 0}
        try:
            for number in range(rounds):
                wait_until(lambda: state(deployment) == S.ASLEEP, seconds=120, interval=0.2, message="asleep")
                pid = Deployment.objects.get(pk=deployment.pk).pid
                wait_until(lambda: not psutil.pid_exists(pid), seconds=180, interval=0.2, message="engine gone")
                first, total, ok = streamed(gateway, raw, f"Hello {number}")
                results["cut"] += 0 if ok else 1
                row = {"first_byte_s": round(first or -1, 2), "total_s": round(total, 2), "ok": ok,
                       "waking_to_ready_s": last_wake_seconds(Deployment.objects.get(pk=deployment.pk))}
                results["rounds"].append(row)
                print(f"round {number + 1}: {row}", flush=True)
            wait_until(lambda: state(deployment) == S.ASLEEP, seconds=120, interval=0.05, message="asleep")
            first, total, ok = streamed(gateway, raw, "During the drain")
            results["cut"] += 0 if ok else 1
            results["during_drain"] = {"first_byte_s": round(first or -1, 2), "total_s": round(total, 2), "ok": ok,
                                       "state_after": state(deployment)}
            print(f"during the drain: {results['during_drain']}", flush=True)
        finally:
            deployment_stop(deployment=Deployment.objects.get(pk=deployment.pk))
            wait_until(lambda: state(deployment) in (S.STOPPED, S.FAILED), seconds=120, message="stopped")
        with open("/proc/cpuinfo") as handle:
            results["cpu"] = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
        results["cores"] = os.cpu_count()
        out.write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        shutil.rmtree(lab.tmp_path, ignore_errors=True)


if __name__ == "__main__":
    main()
