"""Benchmark runs: launch, execute (the load runs in a thread, the calling thread heartbeats the row), cancel,
compare."""
import asyncio
import json
import threading
import time

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.benchmarks import runner, spend, workload
from panel.benchmarks.models import WORKLOAD_FIELDS, BenchmarkRun, TargetKind, WorkloadKind
from panel.channels.diagnosis import redact
from panel.channels.models import Channel, CredentialError, Route, order_channels
from panel.core import outbound
from panel.jobs.models import JobState
from panel.jobs.queues import LONG_QUEUE, long_run_admit
from panel.jobs.services import (
    job_cancel,
    job_cancelled,
    job_claim,
    job_created,
    job_enqueue,
    job_fail,
    job_heartbeat,
    job_succeed,
)
from panel.serving.models import Deployment, DeploymentState

LIMITS = {"requests": (1, 10_000), "warmup_requests": (0, 100), "concurrency": (1, 1024),
          "input_tokens": (1, 32_768), "output_tokens": (1, 8192)}
MAX_REQUEST_RATE = 1000.0


class TargetError(Exception):
    """The target cannot be benchmarked now; the message says why in words."""


class BudgetSpent(TargetError):
    """The team's monthly budget is spent: a benchmark does not start."""


def workload_check(values):
    """Validate the workload values (a dict of WORKLOAD_FIELDS); ValidationError listing every problem."""
    problems = {}
    for name, (low, high) in LIMITS.items():
        value = values.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            problems[name] = f"{name.replace('_', ' ').capitalize()} must be a whole number from {low} to {high:,}."
    rate = values.get("request_rate")
    if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= MAX_REQUEST_RATE):
        problems["request_rate"] = f"Request rate must be more than 0 and at most {MAX_REQUEST_RATE:g} per second."
    for key in ("ttft", "tpot", "e2el"):
        slo = values.get(f"slo_{key}_ms")
        if slo is not None and not (isinstance(slo, (int, float)) and not isinstance(slo, bool)
                                    and 0 < slo <= 3_600_000):
            problems[f"slo_{key}_ms"] = f"The {key.upper()} SLO must be more than 0 and at most 3,600,000 ms."
    kind = values.get("workload")
    if kind not in WorkloadKind.values:
        problems["workload"] = f"Workload must be one of {', '.join(WorkloadKind.values)}."
    elif kind == WorkloadKind.FILE and not values.get("prompts"):
        problems["prompts_file"] = "Upload a prompt file (JSONL or one prompt per line) for this workload."
    if problems:
        raise ValidationError(problems)


def workload_values(**given):
    """The workload fields with the model defaults filled in."""
    values = {name: BenchmarkRun._meta.get_field(name).get_default() for name in WORKLOAD_FIELDS}
    values.update({name: value for name, value in given.items() if name in WORKLOAD_FIELDS})
    return values


def target_of(*, team, target_kind, target_id):
    """(field name, object, label) for a team's deployment, channel or route; ValidationError otherwise."""
    models = {TargetKind.DEPLOYMENT: Deployment, TargetKind.CHANNEL: Channel, TargetKind.ROUTE: Route}
    if target_kind not in models:
        raise ValidationError({"target": "Pick a deployment, a channel or a route to benchmark."})
    target = models[target_kind].objects.filter(team=team, pk=target_id).first()
    if target is None:
        raise ValidationError({"target": f"No such {target_kind} in this team."})
    if target_kind == TargetKind.DEPLOYMENT and target.state != DeploymentState.READY:
        raise ValidationError({"target": f"Deployment {target} is {target.get_state_display().lower()}, not ready: "
                                         "start it first."})
    if target_kind == TargetKind.CHANNEL and not target.enabled:
        raise ValidationError({"target": f"Channel {target.name} is disabled."})
    label = {TargetKind.DEPLOYMENT: f"deployment {target}", TargetKind.CHANNEL: f"channel {target}",
             TargetKind.ROUTE: f"route {target}"}[target_kind]
    return target_kind, target, label


def benchmark_launch(*, team, user, target_kind, target_id, name="", ladder=None, sweep=None, step="", enqueue=True,
                     **workload_given):
    """Validate the target and the workload, insert a pending run and (on commit) queue it on the long queue;
    LongRunsFull while the team has as many long runs as it may (a ladder's or sweep's step is part of its run)."""

    field, target, label = target_of(team=team, target_kind=target_kind, target_id=target_id)
    values = workload_values(**workload_given)
    workload_check(values)
    # A ladder's or sweep's step runs inside its task, never queued; its later runs are stopped when they start
    # instead of refused here.
    step_of = ladder or sweep
    if step_of is None:
        spend.launch_check(team.pk)
    with transaction.atomic():
        if step_of is None:
            long_run_admit(team)
        run = BenchmarkRun.objects.create(team=team, created_by=user, name=name[:200], target_kind=target_kind,
                                          target_label=label[:300], queue="" if step_of else LONG_QUEUE,
                                          ladder=ladder, sweep=sweep, step=step, **{field: target}, **values)
        job_created(run, actor=user, reason=f"benchmark of {label} requested")
        if enqueue:
            job_enqueue(run, "panel.benchmarks.tasks.run_benchmark")
    return run


def run_prompts(run):
    """The message lists the run sends, cycled over its requests."""
    if run.workload == WorkloadKind.FILE:
        return run.prompts
    if run.workload == WorkloadKind.SYNTHETIC:
        return workload.synthetic_prompts(count=run.requests + run.warmup_requests, input_tokens=run.input_tokens,
                                          shared_system_prompt=run.shared_system_prompt)
    return workload.builtin_prompts()


def _channel_endpoint(channel):
    if not channel.enabled:
        raise TargetError(f"channel {channel.name} is disabled")
    if channel.misconfigured:
        raise TargetError(f"channel {channel.name} is misconfigured: {channel.misconfigured}")
    refusal = outbound.static_refusal(channel.base_url, loopback_ok=channel.is_engine_channel)
    if refusal:
        raise TargetError(f"channel {channel.name}: the panel does not call its base URL: {refusal}")
    try:
        key = channel.api_key()
    except CredentialError as error:
        raise TargetError(f"channel {channel.name} has no usable key: {error}") from None
    return runner.Endpoint(base_url=channel.base_url, api_key=key, model=channel.model_id, vllm=channel.is_local,
                           label=channel.name)


def run_picker(run):
    """A function giving the Endpoint of each request, read from the database once, before the load starts."""
    if run.target_kind == TargetKind.DEPLOYMENT:
        deployment = Deployment.objects.filter(pk=run.deployment_id).first()
        if deployment is None or deployment.state != DeploymentState.READY:
            state = deployment.get_state_display().lower() if deployment else "deleted"
            raise TargetError(f"the deployment is {state}, not ready")
        try:
            key = deployment.engine_key() or "EMPTY"
        except CredentialError as error:
            raise TargetError(f"the deployment's engine key cannot be read: {error}") from None
        endpoint = runner.Endpoint(base_url=deployment.base_url, api_key=key, model=deployment.served_model_name,
                                   vllm=True, label=str(deployment))
        return lambda: endpoint
    if run.target_kind == TargetKind.CHANNEL:
        if run.channel is None:
            raise TargetError("the channel was deleted")
        endpoint = _channel_endpoint(run.channel)
        return lambda: endpoint
    if run.route is None:
        raise TargetError("the route was deleted")
    # A route spreads requests over its channels the way the gateway orders them (strategy, weights, local
    # first); each request goes to the channel that comes first for it.
    entries = [entry for entry in run.route.entries() if entry.channel.enabled]
    endpoints = {}
    for entry in entries:
        try:
            endpoints[entry.channel.pk] = _channel_endpoint(entry.channel)
        except TargetError:
            continue
    entries = [entry for entry in entries if entry.channel.pk in endpoints]
    if not entries:
        raise TargetError(f"route {run.route} has no enabled channel with a usable key")
    strategy = run.route.strategy
    return lambda: endpoints[order_channels(strategy, entries)[0].pk]


BUDGET_CHECK_SECONDS = 1.0  # how often a running benchmark counts its spend and checks the team's budget


def run_load_in_thread(*, pick, run, progress, on_beat, beat_seconds):
    """Run the asyncio load in its own thread (its own event loop, no ORM) while this thread calls `on_beat`
    every `beat_seconds` (heartbeats, cancel checks: they use the ORM). Returns (samples, seconds)."""
    outcome = {}

    prompts = run_prompts(run)

    async def load():
        # Every address is checked; the engines' own host name (the operator's setting) may be local.
        return await runner.run_load(
            pick=pick, prompts=prompts, max_tokens=run.output_tokens, requests=run.requests,
            warmup=run.warmup_requests, concurrency=run.concurrency, request_rate=run.request_rate,
            timeout=settings.BENCHMARK_REQUEST_TIMEOUT_SECONDS, progress=progress, seed=run.pk or 0,
            engine_hosts={settings.ENGINE_ADVERTISE_HOST})

    def body():
        try:
            outcome["value"] = asyncio.run(load())
        except BaseException as error:  # reported to the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=body, name=f"benchmark-{run.pk}", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(beat_seconds)
        on_beat()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def progress_phase(progress):
    if progress.warmup_done < progress.warmup:
        return f"warm-up {progress.warmup_done} of {progress.warmup}"
    errors = f", {progress.errors} errors" if progress.errors else ""
    return f"request {progress.done} of {progress.total}{errors}"


def benchmark_measure(run, *, on_beat=None):
    """Run the load of a claimed run and return its summary (no state change). `on_beat(progress)` is called
    about every heartbeat; it may set `progress.stop`."""
    pick = run_picker(run)
    progress = runner.Progress()
    budget = spend.RunSpend(run)
    if budget.check():
        raise BudgetSpent(budget.refusal)  # not a single request

    last_beat = [time.monotonic()]

    def beat():  # every second: the budget; every heartbeat period: the caller's beat
        budget.flush(progress)  # counts against the team's budget; stops the load once it is spent
        if on_beat and time.monotonic() - last_beat[0] >= settings.JOB_HEARTBEAT_SECONDS - 0.01:
            last_beat[0] = time.monotonic()
            on_beat(progress)

    samples, seconds = run_load_in_thread(pick=pick, run=run, progress=progress, on_beat=beat,
                                          beat_seconds=min(settings.JOB_HEARTBEAT_SECONDS, BUDGET_CHECK_SECONDS))
    budget.flush(progress)
    progress.budget_refusal = budget.refusal
    return summary_redacted(runner.summarize(samples, seconds, run.goodput_slo)), progress


def summary_redacted(summary):
    """A run's summary as stored: its upstream words through the same redaction as the channel Test's."""
    summary["first_error"] = redact(summary.get("first_error") or "")
    return summary


def benchmark_execute(*, run_id, worker):
    """Body of the benchmark task: claim the run, send its load, record the figures."""
    run = BenchmarkRun.objects.select_related("channel", "route", "deployment").get(pk=run_id)
    if not job_claim(run, worker=worker):
        return False
    return benchmark_perform(run)


def benchmark_perform(run):
    """Measure a running (claimed) run and end it succeeded, failed or cancelled."""
    started = time.monotonic()

    def beat(progress):
        total = progress.total + progress.warmup
        done = progress.done + progress.warmup_done
        state = job_heartbeat(run, progress=99 * done // max(total, 1), phase=progress_phase(progress))
        if state == JobState.CANCELLING:
            progress.stop = True

    try:
        summary, progress = benchmark_measure(run, on_beat=beat)
    except BudgetSpent as error:
        job_fail(run, kind="budget_exceeded", reason=f"not started: {error}; benchmarks count against the team's "
                                                     "budget")
        return False
    except TargetError as error:
        job_fail(run, kind="target_unavailable", reason=str(error))
        return False
    except Exception as error:  # the run must not stay "running" until the reaper finds it
        job_fail(run, kind="internal_error", reason=f"{type(error).__name__}: {error}")
        raise
    if progress.budget_refusal:
        summary["wall_seconds"] = round(time.monotonic() - started, 1)
        with transaction.atomic():
            job_fail(run, kind="budget_exceeded", reason=f"stopped after {summary['requests']} requests: "
                                                         f"{progress.budget_refusal}; benchmarks count against the "
                                                         "team's budget")
            BenchmarkRun.objects.filter(pk=run.pk).update(result=summary)
        return False
    if progress.stop:
        job_cancelled(run)
        return False
    summary["wall_seconds"] = round(time.monotonic() - started, 1)
    if summary["completed"] == 0:
        benchmark_fail_all_requests(run, summary)
        return False
    return job_succeed(run, result=summary)


def benchmark_fail_all_requests(run, summary):
    """Fail a run none of whose requests succeeded, with the summary of its errors in the same transaction: the
    page never shows the failure without the errors that explain it."""
    with transaction.atomic():
        job_fail(run, kind="all_requests_failed",
                 reason=f"all {summary['requests']} requests failed; the first: {summary['first_error']}")
        BenchmarkRun.objects.filter(pk=run.pk).update(result=summary)


def benchmark_cancel(*, run, user):
    return job_cancel(run, actor=user)


METRICS = (  # (result key, label, unit, higher is better): vLLM's names for the figures
    ("request_throughput", "Request throughput", "req/s", True),
    ("request_goodput", "Request goodput", "req/s", True),
    ("output_throughput", "Output token throughput", "tok/s", True),
    ("mean_ttft_ms", "Mean TTFT", "ms", False), ("median_ttft_ms", "Median TTFT", "ms", False),
    ("p99_ttft_ms", "P99 TTFT", "ms", False),
    ("mean_tpot_ms", "Mean TPOT", "ms", False), ("median_tpot_ms", "Median TPOT", "ms", False),
    ("p99_tpot_ms", "P99 TPOT", "ms", False),
    ("mean_itl_ms", "Mean ITL", "ms", False), ("median_itl_ms", "Median ITL", "ms", False),
    ("p99_itl_ms", "P99 ITL", "ms", False),
    ("mean_e2el_ms", "Mean E2EL", "ms", False), ("median_e2el_ms", "Median E2EL", "ms", False),
    ("p99_e2el_ms", "P99 E2EL", "ms", False),
    ("failed", "Failed requests", "", False),
)


def runs_compare(runs):
    """Rows for the side-by-side table: each metric with every run's value and which run is best."""
    rows = []
    for key, label, unit, higher in METRICS:
        values = [run.result.get(key) for run in runs]
        present = [value for value in values if value is not None]
        best = (max(present) if higher else min(present)) if present and len(runs) > 1 else None
        rows.append({"label": label, "unit": unit,
                     "cells": [{"value": value, "best": value is not None and value == best} for value in values]})
    return rows


def runs_compare_figures(runs):
    """Plotly figures (as JSON strings) comparing the runs: throughput, and latency percentiles per run."""
    import plotly.graph_objects as go

    names = [f"#{run.pk} {run.name or run.target_label}"[:40] for run in runs]
    throughput = go.Figure(go.Bar(x=names, y=[run.result.get("output_throughput") for run in runs],
                                  marker_color="#2f6fed"))
    throughput.update_layout(title="Output token throughput", yaxis_title="tok/s", height=320,
                             margin=dict(l=50, r=20, t=50, b=80))
    latency = go.Figure()
    for family, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        for stat in ("median", "p99"):
            latency.add_trace(go.Bar(name=f"{stat.capitalize()} {title}", x=names,
                                     y=[run.result.get(f"{stat}_{family}_ms") for run in runs]))
    latency.update_layout(title="Latency percentiles", yaxis_title="ms", yaxis_type="log", barmode="group",
                          height=380, margin=dict(l=50, r=20, t=50, b=80))
    return [json.loads(throughput.to_json()), json.loads(latency.to_json())]
