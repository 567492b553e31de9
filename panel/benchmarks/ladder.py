"""The config ladder and the max_num_seqs sweep: jobs on the default queue that, step after step, create a serving
profile, launch its deployment (the GPU worker runs it), benchmark it with the job's workload, and stop it.

Only one deployment of a ladder or sweep is up at a time, so every step gets the whole host."""
import json
import logging
import time
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections, transaction

from panel.benchmarks import ladder_table as table
from panel.benchmarks import services
from panel.benchmarks.ladder_table import (  # noqa: F401  (re-exported for the ladder's callers)
    cost_per_million,
    ladder_figure,
    ladder_price,
    step_quality,
)
from panel.benchmarks.models import BenchmarkRun, Ladder, StepProfile, Sweep, TargetKind
from panel.hosts.models import WorkerHost
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
from panel.registry.schemes import SCHEMES, host_serves
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, DeploymentState, ServingProfile
from panel.serving.services import (
    deployment_launch,
    deployment_stop,
    host_facts,
    host_pick,
    profile_check,
    profile_values,
)

log = logging.getLogger(__name__)

MAX_SWEEP_VALUES = 8
MAX_REPEATS = 10

# The usual order of tuning work, each step adding one thing to the one before it; then FP8 instead of the
# quantized weights, and speculative decoding, each measured where the host's engine can serve it.
STEPS = (
    ("baseline", "FP16 baseline", "no prefix caching, small max_num_seqs", "precision-sensitive traffic"),
    ("awq", "+ quantized", "the best quantized child this host serves (AWQ INT4 on a GPU, W8A8 on a CPU)",
     "large models, many users per card"),
    ("prefix", "+ prefix caching", "reuses the KV cache of a shared system prompt", "agents, shared system prompts"),
    ("batching", "+ larger max_num_seqs, chunked prefill", "more sequences per step; long prompts in chunks",
     "batch jobs, throughput first"),
    ("fp8", "FP8 instead", "the model's FP8 child with the step above's settings", "Hopper/Ada GPUs, near-FP16 "
     "quality"),
    ("ngram", "+ n-gram speculative decoding", "drafts tokens from the prompt itself (no draft model)",
     "answers that repeat their input: extraction, code edits"),
)
# The order the quantized step prefers a child in: smallest first where a GPU serves it; W8A8 first on a CPU host
# (its int8 kernel runs on AVX2 and AVX-512 alike, and it keeps the most quality).
GPU_PREFERENCE = ("w4a16-awq", "w4a16-gptq", "mixed", "w8a8-int8", "fp8-dynamic")
CPU_PREFERENCE = ("w8a8-int8", "w4a16-awq", "w4a16-gptq", "mixed")
NGRAM_CONFIG = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'


class Cancelled(Exception):
    """The user cancelled the ladder or sweep."""


def awq_child(model):
    """The newest AWQ model quantized from `model`, or None."""
    children = [child for child in model.children.order_by("-created_at")
                if str((child.quantization or {}).get("method", "")).lower() == "awq"]
    return children[0] if children else None


def child_scheme(child):
    quantization = child.quantization or {}
    if quantization.get("scheme"):
        return quantization["scheme"]
    return "w4a16-awq" if str(quantization.get("method", "")).lower() == "awq" else None


def quantized_child(model, host, *, schemes=None):
    """(child, scheme) of `model`'s newest quantized child that `host`'s engine serves, best scheme first; or
    (None, the best scheme the host would serve)."""
    engine = (host_facts(host) or {}).get("engine") or {}
    order = schemes or (GPU_PREFERENCE if host is not None and host.gpus else CPU_PREFERENCE)
    served = [key for key in order if host_serves(key, engine).answer]
    children = list(model.children.order_by("-created_at"))
    for key in served:
        for child in children:
            if child_scheme(child) == key and (child.quantization or {}).get("bits") not in (2, 3):
                return child, key
    return None, served[0] if served else None


def quantized_fields(child):
    """The profile fields that serve a quantized child."""
    method = str((child.quantization or {}).get("method") or "").lower()
    return dict(model=child, quantization=method, quantization_bits=(child.quantization or {}).get("bits"))


def _block_size(host):
    # vLLM 0.32's CPU attention needs a multiple of 32 (panel.serving.rules); 16 is a GPU value.
    return 32 if host is not None and not host.gpus else 16


def awq_skip_reason(ladder, host, fields):
    """Why the quantized step cannot run on `host` ("" when it can; then `fields` is updated to serve the best
    quantized child the host serves). What the hardware can do is asked first: a CPU engine without a kernel dies
    at the first request, and an unknown answer is not a yes."""
    facts = host_facts(host) or {}
    if facts.get("kind") == "cpu" and facts.get("serves_awq") is None:
        return (f"Whether {host.host}'s CPU engine can serve quantized weights (AWQ, W8A8) is not known yet: run "
                "its engine check (Workers → Check engine), then start the ladder again. The next steps keep the "
                "FP16 weights.")
    child, scheme = quantized_child(ladder.model, host)
    if child is None and scheme is not None and scheme != "w4a16-awq":
        return (f"{ladder.model.name} is not quantized in a scheme {host.host} serves: Quantize it first (Models → "
                f"{ladder.model.name} → Quantize; {SCHEMES[scheme].label} serves here). The next steps keep the "
                "FP16 weights.")
    if child is None:  # the rules word it: no AWQ checkpoint, or a host that cannot serve AWQ
        fields.update(model=awq_child(ladder.model) or ladder.model, quantization="awq", quantization_bits=4)
    else:
        fields.update(quantized_fields(child))
    verdict = profile_check(ServingProfile(team=ladder.team, name="check", **fields), host)
    if verdict.ok:
        return ""
    reasons = [message for messages in verdict.errors.values() for message in messages]
    return " ".join(reasons) + " The next steps keep the FP16 weights."


def fp8_skip_reason(ladder, host, fields):
    """Why the FP8 step cannot run ("" when it can; then `fields` serve the FP8 child)."""
    engine = (host_facts(host) or {}).get("engine") or {}
    verdict = host_serves("fp8-dynamic", engine)
    if not verdict.answer:
        return f"FP8 is not served on {host.host}: {verdict.reason}."
    child, _ = quantized_child(ladder.model, host, schemes=("fp8-dynamic",))
    if child is None:
        return (f"{ladder.model.name} has no FP8 child: Quantize it first (Models → {ladder.model.name} → Quantize "
                "→ FP8 dynamic: no calibration text, seconds).")
    fields.update(quantized_fields(child))
    return ""


def ngram_skip_reason(host):
    """Why the n-gram speculative decoding step cannot run on `host` ("" when it can)."""
    engine = (host_facts(host) or {}).get("engine") or {}
    if not engine:
        return (f"Whether {host.host}'s engine supports speculative decoding is not known yet: run its engine "
                "check first.")
    if engine.get("speculative_ngram") is False:
        return (f"{host.host}'s engine does not run n-gram speculative decoding: "
                f"{engine.get('speculative_ngram_reason') or 'its engine check says so'}.")
    return ""


def ladder_profiles(ladder, host):
    """The ladder's steps: (key, label, what, use, profile fields or None, skip reason)."""
    base = dict(dtype="auto", quantization="none", quantization_bits=None, max_model_len=ladder.max_model_len,
                enable_prefix_caching=False, block_size=_block_size(host), gpu_memory_utilization=0.90,
                max_num_seqs=ladder.small_max_num_seqs, max_num_batched_tokens=max(ladder.max_model_len,
                                                                                   ladder.small_max_num_seqs),
                enable_chunked_prefill=False, extra_args=ladder.extra_args, model=ladder.model)
    plans = []
    current = dict(base)
    for key, label, what, use in STEPS:
        fields, skip = dict(current), ""
        if key == "awq":
            skip = awq_skip_reason(ladder, host, fields)
        elif key == "prefix":
            fields.update(enable_prefix_caching=True)
        elif key == "batching":
            fields.update(max_num_seqs=ladder.large_max_num_seqs, enable_chunked_prefill=True,
                          max_num_batched_tokens=max(ladder.max_model_len, ladder.large_max_num_seqs))
        elif key == "fp8":
            skip = fp8_skip_reason(ladder, host, fields)
            plans.append((key, label, what, use, None if skip else fields, skip))
            continue  # a side step: the next step builds on the one before it
        elif key == "ngram":
            skip = ngram_skip_reason(host)
            fields["extra_args"] = " ".join(part for part in (fields.get("extra_args") or "",
                                                              f"--speculative-config '{NGRAM_CONFIG}'") if part)
        if not skip:
            current = fields
        plans.append((key, label, what, use, None if skip else fields, skip))
    return plans


def ladder_launch(*, team, user, model, host=None, small_max_num_seqs=8, large_max_num_seqs=64, max_model_len=2048,
                  extra_args="", gpu_price_per_hour=Decimal(0), repeats=3, enqueue=True, **workload_given):
    """Validate and queue a ladder for `model` (an unquantized model of the team)."""

    problems = {}
    if model.is_quantized:
        problems["model"] = (f"{model.name} is already quantized ({model.quantization_label}): the ladder starts "
                             "from FP16 weights. Pick its parent; its AWQ child is used for the AWQ step.")
    if not 1 <= small_max_num_seqs < large_max_num_seqs <= 65536:
        problems["large_max_num_seqs"] = ("The larger max_num_seqs must be above the small one (and at most "
                                          "65,536); the small one at least 1.")
    if not 16 <= max_model_len <= model.max_position_embeddings:
        problems["max_model_len"] = (f"Max model length must be from 16 to {model.max_position_embeddings:,} "
                                     f"(what {model.name} was trained for).")
    if gpu_price_per_hour is None or gpu_price_per_hour < 0:
        problems["gpu_price_per_hour"] = "The price per GPU hour cannot be negative."
    if not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        problems["repeats"] = f"Repeats must be a whole number from 1 to {MAX_REPEATS}."
    values = services.workload_values(**workload_given)
    try:
        services.workload_check(values)
    except ValidationError as error:
        problems.update({key: " ".join(messages) for key, messages in error.message_dict.items()})
    if problems:
        raise ValidationError(problems)
    ladder = Ladder(team=team, created_by=user, model=model, small_max_num_seqs=small_max_num_seqs,
                    large_max_num_seqs=large_max_num_seqs, max_model_len=max_model_len, extra_args=extra_args,
                    gpu_price_per_hour=gpu_price_per_hour, repeats=repeats, queue=LONG_QUEUE, **values)
    host = host or ladder_host(ladder)
    refusal = slots_refusal(host)
    if refusal:
        raise ValidationError(refusal)
    with transaction.atomic():
        long_run_admit(team)
        ladder.host = host
        ladder.save()
        job_created(ladder, actor=user, reason=f"config ladder of {model.name} on {host.host} requested")
        if enqueue:
            job_enqueue(ladder, "panel.benchmarks.tasks.run_ladder")
    return ladder


def ladder_host(ladder):
    """The online GPU worker host where the ladder's baseline fits (its block size depends on the host)."""
    reasons = []
    for host in WorkerHost.objects.filter(kind="gpu"):
        if not host.is_online:
            continue
        verdict = profile_check(ServingProfile(team=ladder.team, name="check", **ladder_profiles(ladder, host)[0][4]),
                                host)
        if verdict.ok:
            return host
        reasons.append(f"{host.host}: " + " ".join(m for messages in verdict.errors.values() for m in messages))
    if not reasons:
        raise ValidationError("No GPU worker is online: start one (make run, or python -m workers.start gpu).")
    raise ValidationError("No online worker can run the ladder's baseline. " + " ".join(reasons))


class StepRunner:
    """Launches one deployment at a time for a ladder or sweep `job`, benchmarks it, stops it; heartbeats the job
    all the while and raises Cancelled when its user cancels."""

    def __init__(self, job, *, worker):
        self.job, self.worker = job, worker

    def beat(self, phase, progress=None):
        if job_heartbeat(self.job, phase=phase, progress=progress) == JobState.CANCELLING:
            raise Cancelled()

    def measure(self, *, profile, step, progress):
        """Deploy `profile`, benchmark it `job.repeats` times, stop it. Returns (runs, reason when a measurement
        is missing); each repeat is its own run (warm-up included), so the step's figure comes with a spread."""
        if self.job.host is None:
            return [], "Not launched: the worker host was removed."
        try:
            self.job.host.refresh_from_db()  # its last_seen: an old copy would look offline after a long step
            deployment = deployment_launch(team=self.job.team, user=self.job.created_by, profile=profile,
                                           host=self.job.host)
        except ValidationError as error:
            return [], "Not launched: " + " ".join(error.messages)
        runs = []
        try:
            reason = self._wait_ready(deployment, step, progress)
            if reason:
                return [], reason
            repeats = max(getattr(self.job, "repeats", 1) or 1, 1)
            for repeat in range(repeats):
                label = f"{step} ({repeat + 1} of {repeats})" if repeats > 1 else step
                run = services.benchmark_launch(
                    team=self.job.team, user=self.job.created_by, target_kind=TargetKind.DEPLOYMENT,
                    target_id=deployment.pk, name=f"{self.job} · {label}", step=step, enqueue=False,
                    **{type(self.job)._meta.model_name: self.job}, **self.job.workload_fields())
                job_claim(run, worker=self.worker)
                self._measure(run, label, progress)
                run.refresh_from_db()
                runs.append(run)
                if run.state != JobState.SUCCEEDED:
                    return runs, f"The benchmark failed: {run.failure_reason}"
            return runs, ""
        finally:
            self._stop(deployment, step)

    def _wait_ready(self, deployment, step, progress):
        deadline = time.monotonic() + settings.BENCHMARK_DEPLOYMENT_READY_SECONDS
        while time.monotonic() < deadline:
            deployment.refresh_from_db()
            if deployment.state == DeploymentState.READY:
                return ""
            if deployment.state in (DeploymentState.FAILED, DeploymentState.STOPPED):
                return f"The deployment did not start: {deployment.failure_kind or deployment.state}: " \
                       f"{deployment.failure_reason}".strip()
            self.beat(f"{step}: starting deployment #{deployment.pk} ({deployment.get_state_display().lower()})"
                      + _waiting_for(deployment), progress)
            time.sleep(1)
        return f"The deployment was not ready after {settings.BENCHMARK_DEPLOYMENT_READY_SECONDS} s."

    def _measure(self, run, step, progress):
        cancelled = []

        def beat(load):
            job_heartbeat(run, progress=99 * (load.done + load.warmup_done) // max(load.total + load.warmup, 1),
                          phase=services.progress_phase(load))
            try:
                self.beat(f"{step}: {services.progress_phase(load)}", progress)
            except Cancelled:
                load.stop = True
                cancelled.append(True)

        try:
            summary, load = services.benchmark_measure(run, on_beat=beat)
        except services.TargetError as error:
            job_fail(run, kind="target_unavailable", reason=str(error))
            return
        if cancelled:
            job_cancel(run, actor=None)
            job_cancelled(run)
            raise Cancelled()
        if summary["completed"] == 0:
            services.benchmark_fail_all_requests(run, summary)
            return
        job_succeed(run, result=summary)

    def _stop(self, deployment, step):
        deployment_stop(deployment=deployment, reason=f"{self.job} finished {step}")
        deadline = time.monotonic() + settings.DEPLOYMENT_STOP_GRACE_SECONDS + 30
        while time.monotonic() < deadline:
            if Deployment.objects.get(pk=deployment.pk).is_final:
                return
            job_heartbeat(self.job, phase=f"{step}: stopping deployment #{deployment.pk}")
            time.sleep(1)


def _running_on(host_id, *, steps=True):
    """Ids of the active deployments on a worker host, oldest first (`steps=False`: not those of ladder and sweep
    steps)."""
    running = Deployment.objects.filter(host_id=host_id, state__in=list(ACTIVE_DEPLOYMENT_STATES))
    if not steps:
        running = running.filter(profile__benchmark_step__isnull=True)
    return list(running.order_by("pk").values_list("pk", flat=True))


def slots_refusal(host):
    """Why a ladder or sweep cannot start on `host` ("" when it can): its GPU worker's every slot is held by a
    running deployment, so each step's engine would wait until one of them stops (unknown slots: no refusal)."""
    if host is None or not host.slots:
        return ""
    held = _running_on(host.pk)
    if len(held) < host.slots:
        return ""
    return (f"{host.host}'s GPU worker runs {host.slots} jobs at once and deployments "
            f"{', '.join(f'#{pk}' for pk in held)} hold all of them: each step's engine would wait until one stops. "
            "Stop one of them, or start the GPU worker with more slots (TOKENWISE_GPU_CONCURRENCY), then start "
            "again.")


def shared_host_warning(job):
    """Words for a ladder or sweep whose host runs other deployments ("" when none): its steps wait for the GPU
    worker's slots those hold, and their figures include those engines' load."""
    if job.host_id is None:
        return ""
    others = _running_on(job.host_id, steps=False)[:5]
    if not others:
        return ""
    names = ", ".join(f"#{pk}" for pk in others)
    return (f"{job.host.host} also runs deployment{'s' if len(others) > 1 else ''} {names}: each holds one of its GPU "
            "worker's slots, so a step may wait for a free one, and they share its processors or GPUs, so the "
            "figures include their load. Stop them for figures of this configuration alone.")


def _waiting_for(deployment):
    """What a pending step deployment waits for, in words: each running deployment on its host holds one of the GPU
    worker's slots until it stops ("" once it has started, or when nothing else runs there)."""
    if deployment.state != DeploymentState.PENDING or deployment.host_id is None:
        return ""
    others = _running_on(deployment.host_id, steps=False)[:5]
    if not others:
        return ""
    held = ("deployment " if len(others) == 1 else "deployments ") + ", ".join(f"#{pk}" for pk in others)
    return (f": waiting for a free slot on {deployment.host.host}'s GPU worker, held by {held} (each running "
            "deployment holds one until it stops; stop one to go on)")


def _save_profile(job, name, fields):
    """A profile for one step (kept, so the page links to exactly what was measured), owned by the job: its
    deployment's channel and route are hidden from the team's lists and removed with the job."""
    from django.utils.text import slugify

    with transaction.atomic():
        profile = ServingProfile.objects.create(team=job.team, created_by=job.created_by, name=name[:100],
                                                served_model_name=slugify(name)[:200], **fields)
        StepProfile.objects.create(profile=profile, **{type(job)._meta.model_name: job})
    return profile


def _run_steps(job, *, worker, plan, record):
    """Measure each (step, name, fields or None, skip reason) of `plan`; `record(step, outcome)` stores progress."""
    if not job_claim(job, worker=worker):
        return False
    steps = StepRunner(job, worker=worker)
    outcomes = []
    try:
        for index, (step, name, fields, skip) in enumerate(plan):
            progress = 100 * index // len(plan)
            outcome = {"step": step, "status": "skipped", "reason": skip}
            if fields is not None:
                profile = _save_profile(job, name, fields)
                runs, reason = steps.measure(profile=profile, step=step, progress=progress)
                outcome.update(status="failed" if reason else "measured", reason=reason, profile_id=profile.pk,
                               run_id=runs[0].pk if runs else None, run_ids=[run.pk for run in runs])
            outcomes.append(outcome)
            type(job).objects.filter(pk=job.pk).update(result=record(outcomes))
            close_old_connections()
    except Cancelled:
        job_cancelled(job)
        return False
    except Exception as error:  # the job must not stay "running" until the reaper finds it
        log.exception("%s failed", job)
        job_fail(job, kind="internal_error", reason=f"{type(error).__name__}: {error}")
        raise
    job.result = record(outcomes)
    return job_succeed(job, result=job.result)


def ladder_table(ladder):
    """The ladder's comparison table (ladder_table.py): one row per step, with its spread and noise verdict."""
    return table.ladder_table(ladder, STEPS)


def step_profile_name(ladder, key, fields):
    """A step's profile (and served) name, after what it runs: the quantized step by its child's scheme
    ("ladder 3 · w8a8-int8" where a CPU host served W8A8, not "awq")."""
    if key == "awq" and fields is not None:
        key = child_scheme(fields["model"]) or "quantized"
    return f"ladder {ladder.pk} · {key}"


def ladder_execute(*, ladder_id, worker):
    """Body of the ladder task."""
    ladder = Ladder.objects.select_related("model", "host", "team", "created_by").get(pk=ladder_id)
    plan = [(key, step_profile_name(ladder, key, fields), fields, skip)
            for key, _, _, _, fields, skip in ladder_profiles(ladder, ladder.host)]
    planned = len([step for step in plan if step[2] is not None])
    return _run_steps(ladder, worker=worker, plan=plan,
                      record=lambda outcomes: {"steps": outcomes, "planned": planned})


def sweep_values_parse(text):
    """"4, 16, 64" -> [4, 16, 64]; ValidationError for anything else."""
    try:
        values = sorted({int(part) for part in str(text).replace(" ", ",").split(",") if part.strip()})
    except ValueError:
        raise ValidationError({"values": "Values must be whole numbers separated by commas, e.g. 4, 16, 64."}) from None
    if not 2 <= len(values) <= MAX_SWEEP_VALUES or values[0] < 1 or values[-1] > 65536:
        raise ValidationError({"values": f"Give 2 to {MAX_SWEEP_VALUES} different values from 1 to 65,536."})
    return values


def sweep_launch(*, team, user, profile, values, p99_target_ms, host=None, repeats=1, enqueue=True,
                 **workload_given):
    """Validate and queue a sweep of `profile` over max_num_seqs `values` (a list or "4, 16, 64")."""

    values = values if isinstance(values, list) else sweep_values_parse(values)
    if not 1 <= len(values) <= MAX_SWEEP_VALUES:
        raise ValidationError({"values": f"Give 2 to {MAX_SWEEP_VALUES} values."})
    if not isinstance(p99_target_ms, int) or not 1 <= p99_target_ms <= 3_600_000:
        raise ValidationError({"p99_target_ms": "The P99 target must be a whole number of milliseconds, "
                                                "1 to 3,600,000."})
    if not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise ValidationError({"repeats": f"Repeats must be a whole number from 1 to {MAX_REPEATS}."})
    values_checked = services.workload_values(**workload_given)
    services.workload_check(values_checked)
    host = host or host_pick(profile)
    refusal = slots_refusal(host)
    if refusal:
        raise ValidationError(refusal)
    with transaction.atomic():
        long_run_admit(team)
        sweep = Sweep.objects.create(team=team, created_by=user, profile=profile, host=host, values=values,
                                     p99_target_ms=p99_target_ms, repeats=repeats, queue=LONG_QUEUE, **values_checked)
        job_created(sweep, actor=user, reason=f"max_num_seqs sweep of {profile.name} over {values} requested")
        if enqueue:
            job_enqueue(sweep, "panel.benchmarks.tasks.run_sweep")
    return sweep


def sweep_plan(sweep):
    """(step, profile name, fields or None, skip reason) per value."""
    source = sweep.profile
    plan = []
    for value in sweep.values:
        fields = {name: getattr(source, name) for name in profile_values(source)
                  if name not in ("model_name", "name", "served_model_name") and hasattr(source, name)}
        fields.update(model=source.model, max_num_seqs=value, port=None,
                      max_num_batched_tokens=max(source.max_num_batched_tokens, value))
        verdict = profile_check(ServingProfile(team=sweep.team, name="check", **fields), sweep.host)
        skip = "" if verdict.ok else " ".join(m for messages in verdict.errors.values() for m in messages)
        plan.append((f"max_num_seqs={value}", f"sweep {sweep.pk} · seqs {value}", None if skip else fields, skip))
    return plan


def sweep_execute(*, sweep_id, worker):
    """Body of the sweep task."""
    sweep = Sweep.objects.select_related("profile__model", "host", "team", "created_by").get(pk=sweep_id)
    return _run_steps(sweep, worker=worker, plan=sweep_plan(sweep),
                      record=lambda outcomes: sweep_result(sweep, outcomes))


def sweep_points(sweep, outcomes=None):
    """(value, run) for every measured value."""
    outcomes = outcomes if outcomes is not None else (sweep.result or {}).get("points", [])
    runs = {run.pk: run for run in BenchmarkRun.objects.filter(sweep=sweep, state=JobState.SUCCEEDED)}
    points = []
    for value, outcome in zip(sweep.values, outcomes):
        run = runs.get(outcome.get("run_id"))
        if run is not None:
            points.append((value, run))
    return points


def sweep_result(sweep, outcomes):
    """The stored result: every value's outcome and the best value within the P99 target, with why."""
    points = sweep_points(sweep, outcomes)
    best, why = sweep_best([(value, run.result) for value, run in points], sweep.p99_target_ms)
    return {"points": [dict(outcome, value=value) for value, outcome in zip(sweep.values, outcomes)],
            "best": best, "best_reason": why}


def sweep_best(points, target_ms):
    """(value, reason): the value with the highest output tokens/s whose end-to-end P99 is within `target_ms`."""
    if not points:
        return None, "No value was measured."
    within = [(value, result) for value, result in points if (result.get("p99_e2el_ms") or 0) <= target_ms]
    if not within:
        value, result = min(points, key=lambda point: point[1].get("p99_e2el_ms") or 0)
        return None, (f"No value met the P99 target of {target_ms:,} ms; the lowest P99 was "
                      f"{result['p99_e2el_ms']:,.0f} ms at max_num_seqs={value}.")
    value, result = max(within, key=lambda point: point[1].get("output_throughput") or 0)
    return value, (f"max_num_seqs={value}: {result['output_throughput']:,.1f} output tokens/s with P99 "
                   f"{result['p99_e2el_ms']:,.0f} ms, within the {target_ms:,} ms target.")


def sweep_figure(sweep):
    """Throughput against P99 latency, one point per value, the target as a vertical line."""
    import plotly.graph_objects as go

    points = sweep_points(sweep)
    best = (sweep.result or {}).get("best")
    figure = go.Figure(go.Scatter(
        x=[run.result.get("p99_e2el_ms") for _, run in points], y=[run.result.get("output_throughput")
                                                                  for _, run in points],
        mode="lines+markers+text", text=[f"max_num_seqs={value}" for value, _ in points],
        textposition="top center", marker=dict(size=[16 if value == best else 9 for value, _ in points],
                                               color=["#1a9850" if value == best else "#2f6fed"
                                                      for value, _ in points])))
    slowest = max((run.result.get("p99_e2el_ms") or 0 for _, run in points), default=0)
    if sweep.p99_target_ms <= 3 * slowest:
        figure.add_vline(x=sweep.p99_target_ms, line_dash="dash", line_color="#d73027",
                         annotation_text=f"P99 target {sweep.p99_target_ms:,} ms")
    else:  # a line that far away would squash the points against the axis
        figure.add_annotation(text=f"P99 target {sweep.p99_target_ms:,} ms: every value is well within it",
                              xref="paper", yref="paper", x=1, y=1.08, showarrow=False, font=dict(color="#d73027"))
    figure.update_layout(title="Throughput against P99 latency", xaxis_title="end-to-end P99 (ms)",
                         yaxis_title="output tokens/s", height=380, margin=dict(l=60, r=30, t=50, b=50),
                         showlegend=False)
    return json.loads(figure.to_json())
