"""Quality reports: a model measured as vLLM serves it (engine/evaluate.py, on a GPU worker, in the engine venv),
compared with its parent and its siblings on the same inputs; or a LoRA adapter, measured on the model it runs on,
compared with that model alone.

A model is measured once per set of inputs ("builtin", or a prompt file's digest): a second report against the
same parent reuses the parent's numbers, so every sibling (AWQ, W8A8, FP8 of one model) is compared with the same
parent measurement. A model with an adapter applied is a measurement of its own (ModelEvaluation.adapter), never
taken for the model's."""
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.core.safejson import loads as safe_loads
from panel.hosts.models import WorkerHost
from panel.jobs import diagnosis, processes
from panel.jobs.runner import run_job
from panel.jobs.services import job_claim, job_created, job_enqueue, job_succeed
from panel.registry.models import EvaluationJob, ModelEvaluation, RegisteredModel
from panel.registry.schemes import SCHEMES, host_serves

log = logging.getLogger(__name__)

BUILTIN = "builtin-tasks"  # the built-in inputs; measurements of older built-in inputs are not compared with these
MAX_PROMPT_FILE_BYTES = 2 * 1024 * 1024
MAX_PROMPTS = 200


# --- the prompt file ----------------------------------------------------------------------------------------

def prompt_file_check(data):
    """The number of prompts in an uploaded evaluation file (JSONL: {"prompt"} or {"messages"}, optionally
    "expected" and "json"), or ValidationError naming the first bad line."""
    if not data.strip():
        raise ValidationError("The evaluation file is empty.")
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise ValidationError(f"The evaluation file is larger than {MAX_PROMPT_FILE_BYTES // 2**20} MB.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValidationError(f"The evaluation file is not UTF-8 text (bad byte at position {error.start}).") \
            from None
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = safe_loads(line)
        except ValueError as error:
            raise ValidationError(f"Line {number} is not JSON: {error}") from None
        if not isinstance(item, dict) or not (isinstance(item.get("prompt"), str)
                                              or isinstance(item.get("messages"), list)):
            raise ValidationError(f"Line {number} needs \"prompt\" (text) or \"messages\" (a list of chat "
                                  f"messages).")
        if "expected" in item and not isinstance(item["expected"], str):
            raise ValidationError(f"Line {number}: \"expected\" must be text.")
        count += 1
        if count > MAX_PROMPTS:
            raise ValidationError(f"The evaluation file has more than {MAX_PROMPTS} prompts.")
    if not count:
        raise ValidationError("The evaluation file holds no prompts.")
    return count


def prompt_file_store(*, team, data):
    """Save a checked evaluation file under the data dir; returns (path, inputs key)."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = Path(settings.DATA_DIR) / "evaluation" / str(team.pk)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.jsonl"
    path.write_bytes(data)
    return path, f"file:{digest}"


# --- launching ----------------------------------------------------------------------------------------------

def engine_of(host):
    check = host.latest_engine_check() if host is not None else None
    return check.result if check else {}


def serving_refusal(model, host):
    """Why `host`'s engine cannot load `model` as vLLM would serve it, or None (also when nobody checked)."""
    scheme = (model.quantization or {}).get("scheme")
    method = (model.quantization or {}).get("method")
    if not scheme and method == "awq":
        scheme = "w4a16-awq"
    if not scheme or host is None:
        return None
    if (model.quantization or {}).get("bits") in (2, 3):
        return None  # vLLM cannot load it anywhere: engine/evaluate.py measures it with transformers
    verdict = host_serves(scheme, engine_of(host), keep_as=(model.quantization or {}).get("keep_as", "bf16"))
    if verdict.answer is False:
        return f"{host.host} cannot serve {model.name}: {verdict.reason}."
    return None


def unmeasured(models, inputs_key, adapter=None):
    """Those of `models` not measured on `inputs_key` yet: alone, or with `adapter` applied when one is given (the
    two are different measurements)."""
    return [model for model in models
            if not ModelEvaluation.objects.filter(model=model, adapter=adapter, inputs_key=inputs_key).exists()]


def adapter_refusal(adapter, *, team, model, baseline):
    """Why a report of `adapter` on `model` cannot be queued, or None."""
    if adapter.team_id != team.pk:
        return "The adapter must belong to this team."
    if adapter.base_id not in model.adapter_bases:
        return (f"The adapter {adapter.name} was registered on {adapter.base.name}: it runs on that model or a "
                f"quantized copy of it, not on {model.name}.")
    if baseline is not None and baseline.pk != model.pk:
        return (f"An adapter is compared with the model it runs on ({model.name}) alone: leave out the model to "
                f"compare with.")
    if (model.quantization or {}).get("bits") in (2, 3):
        return f"vLLM cannot load {model.name} (2- or 3-bit weights): an adapter cannot be measured on it."
    return None


def report_baseline(*, team, model, baseline=None, adapter=None, host=None):
    """The model a report of `model` is compared with (`baseline`, default its parent; None for an adapter's report,
    compared with `model` alone), or ValidationError when a model or the adapter is another team's, the two models
    are one, the adapter does not run on `model`, or the host cannot serve a model."""
    if model.team_id != team.pk:
        raise ValidationError("Both models must belong to this team.")
    if adapter is not None:
        refusal = adapter_refusal(adapter, team=team, model=model, baseline=baseline)
        if refusal:
            raise ValidationError(refusal)
        baseline = None
    else:
        baseline = baseline if baseline is not None else model.parent
    if baseline is not None and baseline.team_id != team.pk:
        raise ValidationError("Both models must belong to this team.")
    if baseline is not None and baseline.pk == model.pk:
        raise ValidationError("Compare the model with another model, not with itself.")
    for candidate in (model, baseline):
        refusal = serving_refusal(candidate, host) if candidate is not None else None
        if refusal:
            raise ValidationError(refusal)
    return baseline


def evaluation_launch(*, team, user, model, baseline=None, adapter=None, host=None, prompt_file="",
                      prompt_file_name="", inputs_key=BUILTIN, enqueue=True):
    """Queue a quality report of `model` against `baseline` (default: its parent), or, with a LoRA `adapter`, of
    `model` with the adapter applied against `model` alone. Raises ValidationError (report_baseline's), saving
    nothing."""
    baseline = report_baseline(team=team, model=model, baseline=baseline, adapter=adapter, host=host)
    measured = unmeasured([m for m in (baseline, model) if m is not None], inputs_key)
    with transaction.atomic():
        job = EvaluationJob.objects.create(
            team=team, created_by=user, model=model, baseline=baseline, adapter=adapter, host=host,
            prompt_file=str(prompt_file), prompt_file_name=prompt_file_name[:255], inputs_key=inputs_key,
            measured=[m.pk for m in measured], queue=host.host_queue if host else "gpu")
        job_created(job, actor=user, reason=f"{job} requested")
        if enqueue:
            job_enqueue(job, "panel.registry.tasks.run_evaluation")
    return job


def evaluation_audit_name(job):
    """How a quality report is named in the audit log, by the pages and the API alike."""
    if job.adapter_id:
        return f"quality report #{job.pk} of the adapter {job.adapter.served_name} on {job.model.name}"
    return f"quality report #{job.pk}"


def evaluation_after_quantization(*, job, model):
    """The quality report every quantization job gets, on the host that quantized it (its files are there).
    Returns what to add to the quantization's result: the report's job id, or why none was queued."""
    host = WorkerHost.objects.filter(name=job.worker).first()
    try:
        # From the terminal (manage.py quantize) the command runs the report itself: no broker needed.
        report = evaluation_launch(team=job.team, user=job.created_by, model=model, baseline=job.source,
                                   host=host, enqueue=job.worker != "terminal")
    except ValidationError as error:
        return {"quality_report": None, "quality_report_refused": " ".join(error.messages)}
    return {"quality_report": report.pk}


# --- running ------------------------------------------------------------------------------------------------

def adapter_due(job):
    """Whether the job's model still has to be measured with the job's adapter applied."""
    return job.adapter_id is not None and bool(unmeasured([job.model], job.inputs_key, job.adapter))


def evaluation_argv(job):
    """The engine's command: each model of `job.measured` alone and, where the job's adapter is still to be
    measured, the job's model (the first --model) with it applied (--lora; --lora-only when the model alone was
    measured before)."""
    models = RegisteredModel.objects.in_bulk(job.measured)
    paths = [models[model_id].path for model_id in job.measured]
    lora = []
    if adapter_due(job):
        lora = ["--lora", job.adapter.path] + ([] if job.model_id in job.measured else ["--lora-only"])
        paths = [job.model.path] + [path for path in paths if path != job.model.path]
    argv = processes.engine_argv(settings.ENGINE_PYTHON, "evaluate")
    for path in paths:
        argv += ["--model", path]
    argv += lora
    if job.prompt_file:
        argv += ["--file", job.prompt_file]
    return argv


def evaluation_execute(*, job_id, worker):
    """Body of the evaluation task: measure, in the engine venv, what job `job_id` asks for that is not measured
    yet (its models alone, its model with its adapter)."""
    job = EvaluationJob.objects.select_related("model", "baseline", "adapter").get(pk=job_id)
    job.measured = [m.pk for m in unmeasured(RegisteredModel.objects.filter(pk__in=job.measured),
                                             job.inputs_key)]
    if not job.measured and not adapter_due(job):  # measured meanwhile (by another report): nothing to run
        if job_claim(job, worker=worker):
            job_succeed(job, result={"models": [], "reused": True})
        return True
    EvaluationJob.objects.filter(pk=job.pk).update(measured=job.measured)
    log_path = Path(settings.JOBS_DIR) / f"evaluation-{job.pk}.log"
    return run_job(job, evaluation_argv(job), worker=worker, classify=diagnosis.classify, log_path=log_path,
                   time_limit=settings.EVALUATION_TIME_LIMIT_SECONDS, on_success=evaluation_record)


def same_folder(measured_path, stored_path):
    return bool(measured_path) and (measured_path == stored_path
                                    or Path(measured_path).resolve() == Path(stored_path).resolve())


def measured_subject(job, measured, by_path):
    """(model, adapter) of one measurement in the engine's result, or ValueError for one the job did not ask for."""
    path, adapter_path = measured.get("path"), measured.get("adapter")
    if adapter_path:
        if job.adapter_id is None or not same_folder(adapter_path, job.adapter.path) \
                or not same_folder(path, job.model.path):
            raise ValueError(f"the evaluation measured {path} with the adapter {adapter_path}, which this job did "
                             "not ask for")
        return job.model, job.adapter
    model = by_path.get(path) or by_path.get(str(Path(path or "").resolve()))
    if model is None:
        raise ValueError(f"the evaluation measured {path}, which this job did not ask for")
    return model, None


def evaluation_record(job, result):
    """One ModelEvaluation per measurement (a model alone, or the job's model with the job's adapter), in one
    transaction with nothing else: the report reads them."""
    by_path = {model.path: model for model in RegisteredModel.objects.filter(pk__in=job.measured)}
    with transaction.atomic():
        for measured in result.get("models") or []:
            model, adapter = measured_subject(job, measured, by_path)
            json_right, json_total = ((measured.get("tasks") or {}).get("kinds") or {}).get("json", [0, 0])
            ModelEvaluation.objects.create(
                model=model, adapter=adapter, job=job, inputs_key=job.inputs_key, perplexity=measured["perplexity"],
                tokens_scored=measured["tokens_scored"], json_valid=json_right, json_total=json_total,
                size_bytes=measured["size_bytes"],
                details={key: measured.get(key) for key in ("argmax", "greedy", "tasks", "speed", "file", "seconds",
                                                            "quantization", "engine", "int8_error")})
    return {"models": [{key: value for key, value in measured.items() if key not in ("argmax", "greedy", "tasks")}
                       | {"tasks": (measured.get("tasks") or {}).get("kinds")}
                       for measured in result.get("models") or []]}


# --- the report ---------------------------------------------------------------------------------------------

INT8_EXACT_ERROR = 1e-3  # engine/engine_probe.py's bound (the panel does not import the engine package)


@dataclass
class Comparison:
    """A model's measurement next to its baseline's: the numbers the model page shows, the flags and the verdict."""

    evaluation: ModelEvaluation
    baseline: ModelEvaluation | None
    perplexity_change: float | None = None  # percent
    token_agreement: float | None = None  # percent of held-out positions with the same most likely token
    greedy_agreement: float | None = None  # percent of prompts with the same greedy continuation
    json_drop: float | None = None  # points of the JSON tasks answered right
    task_drop: float | None = None  # points of the other tasks answered right
    same_answers: float | None = None  # percent of the task set answered word for word as the baseline did
    # Points of the evaluation file's expected answers gained (the user's own prompts: shown, not judged; an
    # adapter is meant to change them).
    file_gain: float | None = None
    size_ratio: float | None = None
    flags: tuple = ()
    verdict: str = ""  # "safe", "check" or "reject" (not for production); "" without a baseline
    words: str = ""  # the verdict in a sentence a user acts on


def percent_same(mine, theirs):
    pairs = list(zip(mine or [], theirs or []))
    return 100.0 * sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def same_task_answers(evaluation, baseline):
    mine = [text.strip() for text in (evaluation.details.get("tasks") or {}).get("answers") or []]
    theirs = [text.strip() for text in (baseline.details.get("tasks") or {}).get("answers") or []]
    return percent_same(mine, theirs)


def drop(mine, theirs):
    return theirs - mine if mine is not None and theirs is not None else None


def compare(evaluation, baseline):
    """Compare two measurements of the same inputs: every column counts toward the flags and the verdict."""
    result = Comparison(evaluation=evaluation, baseline=baseline)
    if baseline is None or baseline.pk == evaluation.pk:
        return result
    result.perplexity_change = 100.0 * (evaluation.perplexity / baseline.perplexity - 1)
    result.token_agreement = percent_same(evaluation.details.get("argmax"), baseline.details.get("argmax"))
    result.greedy_agreement = percent_same(evaluation.details.get("greedy"), baseline.details.get("greedy"))
    result.json_drop = drop(evaluation.json_percent, baseline.json_percent)
    result.task_drop = drop(evaluation.task_percent, baseline.task_percent)
    result.same_answers = same_task_answers(evaluation, baseline)
    result.file_gain = drop(baseline.file_percent, evaluation.file_percent)
    if baseline.size_bytes:
        result.size_ratio = evaluation.size_bytes / baseline.size_bytes
    result.flags, severe = judge(result)
    result.verdict = "reject" if severe else "check" if result.flags else "safe"
    result.words = verdict_words(result) + (saturation_note(evaluation) if result.verdict != "safe" else "")
    return result


def saturation_note(evaluation):
    """Where an int8 model lost quality measured on a CPU whose int8 products saturate, the report says that the loss
    is partly the processor's (engine/engine_probe.int8_product_error); a verdict of "safe" needs no excuse."""
    error = evaluation.details.get("int8_error")
    if not error or error < INT8_EXACT_ERROR or (evaluation.model.quantization or {}).get("scheme") != "w8a8-int8":
        return ""
    return (f" Measured on a CPU whose int8 products saturate (no VNNI: {100 * error:.0f}% error in a test product): "
            "part of this loss is the processor's, and a GPU or a CPU with AVX512-VNNI or AMX loses less.")


def judge(result):
    """(flags, severe): what crossed a limit, and whether anything crossed three times its limit."""
    limits = settings
    checks = [  # (value, limit, crossed, three times over, words)
        (result.perplexity_change, limits.QUALITY_PERPLEXITY_RISE_PERCENT, lambda v, lim: v > lim,
         lambda v, lim: v > 3 * lim, lambda v, lim: f"perplexity up {v:.1f}% (more than {lim}%)"),
        (result.json_drop, limits.QUALITY_JSON_DROP_POINTS, lambda v, lim: v > lim, lambda v, lim: v > 3 * lim,
         lambda v, lim: f"JSON answers down {v:.1f} points (more than {lim})"),
        (result.task_drop, limits.QUALITY_TASK_DROP_POINTS, lambda v, lim: v > lim, lambda v, lim: v > 3 * lim,
         lambda v, lim: f"task answers down {v:.1f} points (more than {lim})"),
        (result.token_agreement, limits.QUALITY_TOKEN_AGREEMENT_MIN_PERCENT, lambda v, lim: v < lim,
         lambda v, lim: 100 - v > 3 * (100 - lim), lambda v, lim: f"next-token agreement {v:.1f}% (under {lim}%)"),
        (result.greedy_agreement, limits.QUALITY_GREEDY_AGREEMENT_MIN_PERCENT, lambda v, lim: v < lim,
         lambda v, lim: False, lambda v, lim: f"same greedy answer in {v:.0f}% of prompts (under {lim}%)"),
    ]
    flags, severe = [], False
    for value, limit, crossed, far, words in checks:
        if value is not None and crossed(value, limit):
            flags.append(words(value, limit))
            severe = severe or far(value, limit)
    return tuple(flags), severe


def verdict_words(result):
    """e.g. "W8A8 INT8: perplexity +3.9%, keeps every JSON answer and 13 of 14 task answers: safe to serve."."""
    model, adapter = result.evaluation.model, result.evaluation.adapter
    label = adapter.name if adapter else model.quantization_label if model.is_quantized else model.name
    reference = "base" if adapter else "parent"
    if result.verdict == "reject":
        return f"{label}: {'; '.join(result.flags)}: not for production."
    if result.verdict == "check":
        return f"{label}: {'; '.join(result.flags)}: check its answers before serving it."
    mine, theirs = result.evaluation, result.baseline
    json_words = ("keeps every JSON answer" if mine.json_valid >= theirs.json_valid
                  else f"{mine.json_valid} of {mine.json_total} JSON answers ({reference} {theirs.json_valid})")
    right, total = mine.task_counts
    change = round(result.perplexity_change, 1) or 0.0  # not "-0.0%"
    return f"{label}: perplexity {change:+.1f}%, {json_words} and {right} of {total} other task answers: safe to serve."


def latest_evaluation(model, inputs_key=BUILTIN):
    """`model`'s latest measurement on `inputs_key` alone (not with an adapter)."""
    return ModelEvaluation.objects.filter(model=model, adapter=None, inputs_key=inputs_key).first()


def adapter_reports(model, adapters):
    """The model page's report of each LoRA adapter of `adapters` (those that run on `model`) against the base: its
    latest measurement on `model`, on whichever inputs, compared with `model`'s own on the same inputs, and its
    latest report. [{"adapter", "comparison" (None until measured), "inputs" (words), "job"}]."""
    rows = []
    for adapter in adapters:
        evaluation = (ModelEvaluation.objects.filter(model=model, adapter=adapter).select_related("job", "adapter")
                      .first())
        comparison = compare(evaluation, latest_evaluation(model, evaluation.inputs_key)) if evaluation else None
        rows.append({"adapter": adapter, "comparison": comparison, "inputs": inputs_words(evaluation),
                     "job": adapter.evaluation_jobs.filter(model=model).first()})
    return rows


def inputs_words(evaluation):
    if evaluation is None or evaluation.inputs_key == BUILTIN:
        return "the built-in set"
    name = evaluation.job.prompt_file_name if evaluation.job else ""
    return f"{name or 'your prompts'} and the built-in set"


def quality_report(model, inputs_key=BUILTIN):
    """The model page's report: rows for the parent (or the model itself when it has none) and every derived
    model of that parent, each compared with the parent. {"rows", "root", "subject", "thresholds"}."""
    root = model.parent or model
    family = [root] + list(root.children.filter(team=model.team).order_by("name"))
    root_evaluation = latest_evaluation(root, inputs_key)
    rows = []
    for member in family:
        evaluation = latest_evaluation(member, inputs_key)
        rows.append({"model": member, "is_subject": member.pk == model.pk, "is_root": member.pk == root.pk,
                     "comparison": compare(evaluation, root_evaluation) if evaluation else None,
                     "job": None if evaluation else member.evaluation_jobs.filter(adapter=None).first()})
    safe = [row for row in rows if row["comparison"] and row["comparison"].verdict == "safe"]
    recommended = min(safe, key=lambda row: row["comparison"].evaluation.size_bytes) if safe else None
    for row in rows:
        row["recommended"] = row is recommended
    best = best_by_bits(rows)
    return {"rows": rows, "root": root, "root_evaluation": root_evaluation,
            "subject": next(row for row in rows if row["is_subject"]), "recommended": recommended, "best": best,
            "thresholds": {"perplexity": settings.QUALITY_PERPLEXITY_RISE_PERCENT,
                           "json": settings.QUALITY_JSON_DROP_POINTS, "tasks": settings.QUALITY_TASK_DROP_POINTS,
                           "agreement": settings.QUALITY_TOKEN_AGREEMENT_MIN_PERCENT,
                           "greedy": settings.QUALITY_GREEDY_AGREEMENT_MIN_PERCENT}}


VERDICT_ORDER = {"safe": 0, "check": 1, "reject": 2}


def weight_bits(model):
    """The bits a quantized model stores its linear weights in (8 or 4; a round-to-nearest child says its own)."""
    quantization = model.quantization or {}
    scheme = quantization.get("scheme")
    if scheme in SCHEMES and scheme != "w4a16-rtn":
        return SCHEMES[scheme].weight_bits
    return quantization.get("bits")


def best_by_bits(rows):
    """Which scheme keeps most of the parent at each weight size, where two or more children of that size were
    measured: the best verdict first, then the smallest perplexity rise. Marks the row (`best_bits`) and returns
    [{"bits", "row", "others"}], 8 bits before 4. A report that only said which child passes would not say that
    on a real model AWQ keeps twice as much as GPTQ at 4 bits, nor which to try when none passes."""
    classes = {}
    for row in rows:
        comparison = row["comparison"]
        if row["is_root"] or comparison is None or comparison.perplexity_change is None:
            continue
        bits = weight_bits(row["model"])
        if bits:
            classes.setdefault(bits, []).append(row)
    best = []
    for bits, members in sorted(classes.items(), reverse=True):
        if len(members) < 2:
            continue
        ranked = sorted(members, key=lambda row: (VERDICT_ORDER.get(row["comparison"].verdict, 3),
                                                  row["comparison"].perplexity_change))
        ranked[0]["best_bits"] = bits
        best.append({"bits": bits, "row": ranked[0], "others": ranked[1:]})
    return best


def quality_verdict(model):
    """`model`'s builtin report against its parent (a Comparison), or None when either is not measured."""
    if model.parent is None:
        return None
    evaluation, parent = latest_evaluation(model), latest_evaluation(model.parent)
    if evaluation is None or parent is None:
        return None
    return compare(evaluation, parent)


def quality_flags(model):
    """The flags of `model`'s builtin report against its parent ([] when not measured or not flagged)."""
    verdict = quality_verdict(model)
    return list(verdict.flags) if verdict else []


def evaluation_from_form(*, team, user, model, form):
    """Launch the report a valid EvaluationForm describes (storing its prompt file first, once the report is known
    to be allowed)."""
    data = form.cleaned_data
    report_baseline(team=team, model=model, baseline=data["baseline"], adapter=data.get("adapter"), host=data["host"])
    prompt_file, inputs_key = "", BUILTIN
    if form.prompt_data is not None:
        prompt_file, inputs_key = prompt_file_store(team=team, data=form.prompt_data)
    return evaluation_launch(team=team, user=user, model=model, baseline=data["baseline"],
                             adapter=data.get("adapter"), host=data["host"], prompt_file=prompt_file,
                             inputs_key=inputs_key,
                             prompt_file_name=data["prompt_file"].name if data["prompt_file"] else "")


def served_model_quality(channel):
    """For the canary's JSON guard: the model a local channel's deployment serves and its report against its
    parent ({"model", "evaluation", "flags"}), or None for a remote channel."""
    deployment = getattr(channel, "deployment", None) if channel is not None else None
    if deployment is None:
        return None
    model = deployment.profile.model
    return {"model": model, "evaluation": latest_evaluation(model), "flags": quality_flags(model)}
