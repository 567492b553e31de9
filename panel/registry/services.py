"""Registering models and running quantization jobs (llm-compressor or AutoAWQ)."""
import logging
import os
import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from panel.hosts.services import gpu_hosts_online
from panel.jobs import diagnosis, processes
from panel.jobs.runner import run_job
from panel.jobs.services import job_cancel, job_created, job_enqueue
from panel.registry.hub import NotInCache, hub_cache_dir, looks_like_hub_id, resolve_hub_id
from panel.registry.inspection import CheckpointError, inspect_checkpoint
from panel.registry.model_check import model_check_launch, model_check_refusal
from panel.registry.models import CalibrationSource, ModelState, QuantizationJob, RegisteredModel
from panel.registry.quality import engine_of, evaluation_after_quantization
from panel.registry.schemes import (
    AUTOAWQ,
    COMPARISON_ONLY,
    DEFAULT_SCHEME,
    SCHEMES,
    SERVABLE_BITS,
    group_size_default,
    group_size_refusal,
    scheme_table,
)

log = logging.getLogger(__name__)

MAX_CALIBRATION_BYTES = 20 * 1024 * 1024
MIN_CALIBRATION_CHARACTERS = 2000


def resolve_source(source):
    """(folder, hub_id) for what the user typed: a local path, or a hub id already in the local cache."""
    source = source.strip()
    if not source:
        raise ValidationError("Give a local folder path or a hub id (org/name).")
    if looks_like_hub_id(source) and not Path(source).exists():
        try:
            return resolve_hub_id(source), source
        except NotInCache as error:
            raise ValidationError(str(error)) from None
    folder = Path(source).expanduser()
    if not folder.is_absolute():
        raise ValidationError(f"{source!r} is neither an absolute path nor a hub id (org/name).")
    return folder, ""


def model_roots():
    """The folders models may be registered from: TOKENWISE_MODEL_ROOTS and the Hugging Face hub cache."""
    return [Path(os.path.realpath(root)) for root in [*settings.MODEL_ROOTS, str(hub_cache_dir())]]


def folder_check(folder, *, team):
    """Refuse a folder outside the model roots, or one another team registered, in words that say nothing about
    whether it exists (the same for any path outside)."""
    real = Path(os.path.realpath(folder))
    roots = model_roots()
    if not any(real == root or root in real.parents for root in roots):
        raise ValidationError(f"{folder} is outside the folders models are registered from "
                              f"({', '.join(str(root) for root in roots)}): put the model there, or ask the "
                              "operator to add its folder to TOKENWISE_MODEL_ROOTS.")
    # Resolved on both sides: a symlink (or `..`) names another team's folder under a new string, and a team's
    # stored path may itself be a link. A folder inside another team's, or holding one, is refused too.
    for path in RegisteredModel.objects.exclude(team=team).values_list("path", flat=True).distinct().iterator():
        theirs = Path(os.path.realpath(path))
        if real == theirs or theirs in real.parents or real in theirs.parents:
            raise ValidationError(f"{folder} does not exist")  # another team's model: the words of a missing folder


def model_register(*, team, user, source, name=""):
    """Inspect the checkpoint at `source` and register it for `team`, then queue its check as a model where the
    check's bounds apply (an unquantized model of 100 M parameters or more: files that inspect well can still hold
    a model that does not work). Raises ValidationError, saving nothing."""
    folder, hub_id = resolve_source(source)
    folder_check(folder, team=team)
    try:
        facts = inspect_checkpoint(folder)
    except CheckpointError as error:
        raise ValidationError(str(error)) from None
    name = (name or "").strip() or (hub_id or folder.name)
    model = model_create(team=team, user=user, name=name, folder=folder, hub_id=hub_id, facts=facts)
    if model_check_refusal(model) is None:
        model_check_launch(team=team, user=user, model=model)
    return model


def model_create(*, team, user, name, folder, facts, hub_id="", parent=None, **fields):
    """Insert the model (`fields`: more of its columns, such as an import's provenance); ValidationError when the
    team already has one of that name."""
    try:
        with transaction.atomic():
            return RegisteredModel.objects.create(team=team, created_by=user, name=name[:200], path=str(folder),
                                                  hub_id=hub_id, parent=parent, **facts.as_dict(), **fields)
    except IntegrityError:
        raise ValidationError(f"This team already has a model named {name!r}; pick another name.") from None


def calibration_text_check(data):
    """The decoded text of an uploaded calibration file, or ValidationError saying what is wrong with it."""
    if len(data) == 0:
        raise ValidationError("The calibration file is empty.")
    if len(data) > MAX_CALIBRATION_BYTES:
        raise ValidationError(f"The calibration file is larger than {MAX_CALIBRATION_BYTES // (1024 * 1024)} MB.")
    if b"\x00" in data:
        raise ValidationError("The calibration file is binary (it contains NUL bytes); upload plain UTF-8 text.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValidationError(f"The calibration file is not UTF-8 text (bad byte at position {error.start}).") \
            from None
    if len(text.strip()) < MIN_CALIBRATION_CHARACTERS:
        raise ValidationError(f"The calibration file has too little text ({len(text.strip())} characters); give at "
                              f"least {MIN_CALIBRATION_CHARACTERS} characters of your own domain's text.")
    return text


def calibration_store(*, team, data):
    """Save validated calibration text under the data dir; returns its path."""
    folder = Path(settings.DATA_DIR) / "calibration" / str(team.pk)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.txt"
    path.write_bytes(data)
    return path


def check_failed_refusal(model, *, doing):
    """Why a model that failed its check as a model cannot be `doing` ("served"), and what to do, in words."""
    problems = "; ".join((model.check_figures or {}).get("problems") or []) or "see the figures on its page"
    return (f"{model.name} failed its check as a model ({problems}): it cannot be {doing}. Re-check it "
            f"(Models → {model.name} → Re-check) once its files are fixed, or import it again.")


def quantization_refusal(model):
    """Why `model` cannot be quantized, or None."""
    if model.state == ModelState.BROKEN:
        return check_failed_refusal(model, doing="quantized: its children would copy a broken model")
    if model.is_quantized:
        return (f"{model.name} is already quantized ({model.quantization_label}); quantizing it again would stack "
                "two lossy steps. Quantize its unquantized parent instead.")
    return None


def serving_refusal(model):
    """Why vLLM cannot serve `model` at all, whatever the profile says, or None (the model page offers "Serve this
    model" only without one)."""
    if model.state == ModelState.BROKEN:
        return check_failed_refusal(model, doing="served")
    bits = (model.quantization or {}).get("bits")
    if bits and bits not in SERVABLE_BITS:
        return f"{model.name} holds {bits}-bit weights: {COMPARISON_ONLY}."
    return None


def quantization_launch(*, team, user, source, host=None, scheme=DEFAULT_SCHEME, backend=None, q_group_size=None,
                        zero_point=True, version="GEMM", w_bit=4, smoothquant=None, keep_patterns=(),
                        keep_as="bf16", calibration=CalibrationSource.BUILTIN, calibration_file="",
                        calibration_name="", max_calib_samples=32, max_calib_seq_len=256, enqueue=True):
    """Create a quantization job and send it to `host`'s queue (or any GPU worker). `backend` defaults to the
    scheme's own (llm-compressor for every scheme; AutoAWQ is the other choice for W4A16 AWQ); `q_group_size` to
    the largest the model's shapes allow. Returns the job; raises ValidationError, saving nothing, for a refused
    source, a scheme/backend that do not go together, or a group size that does not divide the model's layers."""
    refusal = quantization_refusal(source)
    if refusal:
        raise ValidationError(refusal)
    if scheme not in SCHEMES:
        raise ValidationError(f"Unknown quantization scheme {scheme!r}.")
    backend = backend or SCHEMES[scheme].backends[0]
    if backend not in SCHEMES[scheme].backends:
        raise ValidationError(f"{SCHEMES[scheme].label} is not something {backend} does; it runs on "
                              f"{' or '.join(SCHEMES[scheme].backends)}.")
    if scheme == "mixed" and not keep_patterns:
        raise ValidationError("Mixed precision needs at least one layer pattern to keep.")
    if w_bit != 4 and not (scheme == "w4a16-rtn" and w_bit in (2, 3)):
        raise ValidationError("Only round-to-nearest takes other weight bits (2 or 3, for comparison).")
    if q_group_size is None:
        q_group_size = group_size_default(source)
    if SCHEMES[scheme].weight_bits == 4 and group_size_refusal(source, q_group_size):
        raise ValidationError(group_size_refusal(source, q_group_size))
    with transaction.atomic():
        job = QuantizationJob.objects.create(
            team=team, created_by=user, source=source, host=host, backend=backend, scheme=scheme, w_bit=w_bit,
            q_group_size=q_group_size, zero_point=zero_point, version=version, smoothquant=smoothquant,
            keep_patterns=list(keep_patterns), keep_as=keep_as, calibration=calibration,
            calibration_file=str(calibration_file), calibration_name=calibration_name[:255],
            max_calib_samples=max_calib_samples, max_calib_seq_len=max_calib_seq_len,
            queue=host.host_queue if host else "gpu",
        )
        job.output_dir = str(Path(settings.MODELS_DIR) / f"{slugify(source.name)[:80]}-{output_suffix(job)}"
                                                         f"-job{job.pk}")
        job.save(update_fields=["output_dir"])
        job_created(job, actor=user, reason=f"quantization of {source.name} ({job.scheme_label}, {backend}) "
                                            f"requested")
        if enqueue:
            job_enqueue(job, "panel.registry.tasks.run_quantization")
    return job


def output_suffix(job):
    """The child model's name after its parent's: tiny-w8a8-int8, tiny-w4a16-gptq-g128, tiny-awq-w4-g128."""
    if job.backend == AUTOAWQ:
        return f"awq-w{job.w_bit}-g{job.q_group_size}"
    if SCHEMES[job.scheme].weight_bits == 4:
        scheme = job.scheme.replace("w4a16", f"w{job.w_bit}a16") if job.scheme == "w4a16-rtn" else job.scheme
        return f"{scheme}-{'g' + str(job.q_group_size) if job.q_group_size else 'channel'}"
    return job.scheme + ("-sq" if job.smoothquant is not None else "")


def quantization_argv(job):
    calibration = job.calibration_file if job.calibration == CalibrationSource.FILE else "builtin"
    common = ["--model", job.source.path, "--out", job.output_dir, "--calib", calibration,
              "--max-calib-samples", job.max_calib_samples, "--max-calib-seq-len", job.max_calib_seq_len]
    if job.backend == AUTOAWQ:
        argv = processes.engine_argv(settings.ENGINE_PYTHON, "quantize_runner", *common, "--w-bit", job.w_bit,
                                     "--group-size", job.q_group_size, "--version", job.version)
        if not job.zero_point:
            argv.append("--no-zero-point")
        return argv
    argv = processes.engine_argv(settings.ENGINE_PYTHON, "llmc_quantize", *common, "--scheme", job.scheme,
                                 "--group-size", job.q_group_size or -1, "--bits", job.w_bit)
    if job.smoothquant is not None:
        argv += ["--smoothquant", str(job.smoothquant)]
    for pattern in job.keep_patterns:
        argv += ["--keep", str(pattern)]
    if job.scheme == "mixed":
        argv += ["--keep-as", job.keep_as]
    return argv


def quantization_execute(*, job_id, worker):
    """Body of the quantization task: run the job's backend in the engine venv for job `job_id`."""
    job = QuantizationJob.objects.select_related("source", "team").get(pk=job_id)
    log_path = Path(settings.JOBS_DIR) / f"quantization-{job.pk}.log"
    return run_job(job, quantization_argv(job), worker=worker, classify=diagnosis.classify,
                   log_path=log_path, on_success=quantized_model_record, on_end=quantization_cleanup)


def quantized_model_record(job, result):
    """Register the job's output as a child of its source model and queue its quality report against the source
    (before the job reads as succeeded: whoever sees it done finds the report on its way). Returns the result."""
    folder = Path(result.get("output_path") or job.output_dir)
    facts = inspect_checkpoint(folder)
    name = f"{job.source.name}-{output_suffix(job)}"
    if RegisteredModel.objects.filter(team=job.team, name=name).exists():
        name = f"{name}-job{job.pk}"
    facts.quantization["backend"] = job.backend
    if job.backend != AUTOAWQ:  # AutoAWQ's checkpoints keep their own AWQ label
        facts.quantization.update(scheme=job.scheme, keep_as=job.keep_as if job.scheme == "mixed" else None)
    model = model_create(team=job.team, user=job.created_by, name=name, folder=folder, facts=facts,
                         parent=job.source)
    QuantizationJob.objects.filter(pk=job.pk).update(result_model=model)
    job.result_model = model
    report = evaluation_after_quantization(job=job, model=model)
    return dict(result, model_id=model.pk, model_name=model.name, **report)


def quantization_cleanup(job):
    """A failed or cancelled job leaves no half-written output behind."""
    for folder in (Path(job.output_dir), Path(job.output_dir + ".partial")):
        if job.output_dir and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


def quantization_cancel(*, job, user):
    return job_cancel(job, actor=user)


def quantization_from_form(*, team, user, model, form):
    """Launch the job a valid QuantizationForm describes (storing its calibration file first)."""
    data = form.cleaned_data
    calibration_path = ""
    if data["calibration"] == CalibrationSource.FILE:
        calibration_path = calibration_store(team=team, data=form.calibration_data)
    return quantization_launch(
        team=team, user=user, source=model, host=data["host"], scheme=data["scheme"],
        backend=data["backend"] or None, q_group_size=data["q_group_size"], zero_point=data["zero_point"],
        w_bit=data["w_bit"],
        version=data["version"], smoothquant=data["smoothquant"], keep_patterns=data["keep_patterns"],
        keep_as=data["keep_as"], calibration=data["calibration"], calibration_file=calibration_path,
        calibration_name=data["calibration_file"].name if data["calibration_file"] else "",
        max_calib_samples=data["max_calib_samples"], max_calib_seq_len=data["max_calib_seq_len"])


def quantization_choices(model, form):
    """The form's table: every scheme with what each online GPU host serves, the expected size and time."""
    hosts = gpu_hosts_online()
    samples = form["max_calib_samples"].value() or 32
    tokens = form["max_calib_seq_len"].value() or 256
    try:
        samples, tokens = int(samples), int(tokens)
    except (TypeError, ValueError):
        samples, tokens = 32, 256
    return scheme_table(model, hosts, engines={host.pk: engine_of(host) for host in hosts}, samples=samples,
                        tokens=tokens)
