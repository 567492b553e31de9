"""A model checked as a model, not as files: engine/model_check.py loads the checkpoint and measures its perplexity on
held-out text and one greedy chat answer; the verdict here (the bounds a working chat model meets) sets it ready or
broken. It runs after every GGUF import, after a folder of 100 M parameters or more is registered, and again on
request (the model page's Re-check), each time as a ModelCheckJob on a GPU worker."""
from collections import Counter
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.jobs import diagnosis, processes
from panel.jobs.runner import run_job
from panel.jobs.services import job_created, job_enqueue
from panel.registry.inspection import CHECK_MIN_PARAMETERS  # the check's bounds hold from here up
from panel.registry.models import ModelCheckJob, ModelState, RegisteredModel

CHECK_TIME_LIMIT_SECONDS = 600


def check_verdict(figures):
    """(state, problems in words) for the check's figures: a working chat model of 100 M parameters or more has a
    perplexity under TOKENWISE_GGUF_MAX_PERPLEXITY on the held-out text (SmolLM2-135M: 10.5) and answers a short
    question with words, not one token over and over."""
    problems = []
    missing = figures.get("missing_weights") or 0
    if missing:
        examples = ", ".join(figures.get("missing_examples") or [])
        problems.append(f"{missing} of {figures.get('weight_tensors', '?')} weight tensors are missing from its files "
                        f"(e.g. {examples}): they were filled with random values")
    perplexity = figures.get("perplexity")
    if not isinstance(perplexity, (int, float)) or perplexity != perplexity:  # missing or NaN
        problems.append("its perplexity could not be measured")
    elif perplexity > settings.GGUF_MAX_PERPLEXITY:
        problems.append(f"perplexity {perplexity:,.1f} on held-out text, above the bound of "
                        f"{settings.GGUF_MAX_PERPLEXITY} a working model meets")
    ids = figures.get("answer_token_ids") or []
    if not ids or not (figures.get("answer") or "").strip():
        problems.append("its greedy answer is empty")
    else:
        token, count = Counter(ids).most_common(1)[0]
        if len(ids) >= 3 and count * 2 > len(ids):
            problems.append(f"its greedy answer repeats one token ({count} of {len(ids)} tokens): "
                            f"{figures.get('answer', '')[:80]!r}")
    return (ModelState.BROKEN if problems else ModelState.READY), problems


def model_check_refusal(model):
    """Why `model` cannot be checked as a model (again), or None."""
    if model.is_quantized:
        return (f"{model.name} is quantized: its check is its quality report against its parent (Quality, on its "
                "page).")
    if not model.check_figures and model.parameter_count < CHECK_MIN_PARAMETERS:
        return (f"{model.name} has {model.parameter_count:,} parameters: the check's bounds are those of a working "
                "chat model of 100 M parameters or more, so it would call a working smaller model broken.")
    if ModelCheckJob.objects.filter(model=model, state__in=list(ModelCheckJob.ACTIVE_STATES)).exists():
        return f"{model.name} is being checked already: its page shows the outcome when that check ends."
    return None


def model_check_launch(*, team, user, model, enqueue=True):
    """Queue a check of `model` as a model on a GPU worker (the check after an import, run again: once its files
    were fixed, or on a worker with another engine). Returns the job; ValidationError, saving nothing, when the
    model cannot be checked or a check of it is on its way."""
    refusal = model_check_refusal(model)
    if refusal:
        raise ValidationError(refusal)
    with transaction.atomic():
        job = ModelCheckJob.objects.create(team=team, created_by=user, model=model, queue="gpu")
        job_created(job, actor=user, reason=f"check of {model.name} as a model requested (it is "
                                            f"{model.get_state_display().lower()} now)")
        if enqueue:
            job_enqueue(job, "panel.registry.tasks.run_model_check")
    return job


def model_check_execute(*, job_id, worker):
    """Body of the check task: engine/model_check.py on the model's folder, in the engine venv; the verdict sets
    the model ready or broken. A check that does not run (files that do not load, a lost worker) fails the job in
    words and leaves the model as it was."""
    job = ModelCheckJob.objects.select_related("model").get(pk=job_id)
    argv = processes.engine_argv(settings.ENGINE_PYTHON, "model_check", "--model", job.model.path)
    log_path = Path(settings.JOBS_DIR) / f"model-check-{job.pk}.log"
    return run_job(job, argv, worker=worker, classify=diagnosis.classify, time_limit=CHECK_TIME_LIMIT_SECONDS,
                   log_path=log_path, on_success=model_check_record)


def model_check_record(job, figures):
    """Record the check's figures and its verdict on the model. Returns the result the job keeps."""
    state, problems = check_verdict(figures)
    figures = dict(figures, problems=problems, max_perplexity=settings.GGUF_MAX_PERPLEXITY)
    previous = job.model.state
    RegisteredModel.objects.filter(pk=job.model_id).update(state=state, check_figures=figures)
    job.model.state, job.model.check_figures = state, figures
    return dict(figures, model_state=state, previous_state=previous)
