"""Registering models and running AWQ quantization jobs."""
import logging
import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from panel.jobs import diagnosis, processes
from panel.jobs.runner import run_job
from panel.jobs.services import job_cancel, job_created, job_enqueue
from panel.registry.hub import NotInCache, looks_like_hub_id, resolve_hub_id
from panel.registry.inspection import CheckpointError, inspect_checkpoint
from panel.registry.models import CalibrationSource, QuantizationJob, RegisteredModel

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


def model_register(*, team, user, source, name=""):
    """Inspect the checkpoint at `source` and register it for `team`. Raises ValidationError, saving nothing."""
    folder, hub_id = resolve_source(source)
    try:
        facts = inspect_checkpoint(folder)
    except CheckpointError as error:
        raise ValidationError(str(error)) from None
    name = (name or "").strip() or (hub_id or folder.name)
    return model_create(team=team, user=user, name=name, folder=folder, hub_id=hub_id, facts=facts)


def model_create(*, team, user, name, folder, facts, hub_id="", parent=None):
    try:
        with transaction.atomic():
            return RegisteredModel.objects.create(team=team, created_by=user, name=name[:200], path=str(folder),
                                                  hub_id=hub_id, parent=parent, **facts.as_dict())
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


def quantization_refusal(model):
    """Why `model` cannot be quantized, or None."""
    if model.is_quantized:
        return (f"{model.name} is already quantized ({model.quantization_label}); quantizing it again would stack "
                "two lossy steps. Quantize its unquantized parent instead.")
    return None


def quantization_launch(*, team, user, source, host=None, q_group_size=128, zero_point=True, version="GEMM",
                        w_bit=4, calibration=CalibrationSource.BUILTIN, calibration_file="", calibration_name="",
                        max_calib_samples=128, max_calib_seq_len=512, enqueue=True):
    """Create a quantization job and send it to `host`'s queue (or any GPU worker). Returns the job."""
    refusal = quantization_refusal(source)
    if refusal:
        raise ValidationError(refusal)
    with transaction.atomic():
        job = QuantizationJob.objects.create(
            team=team, created_by=user, source=source, host=host, w_bit=w_bit, q_group_size=q_group_size,
            zero_point=zero_point, version=version, calibration=calibration, calibration_file=str(calibration_file),
            calibration_name=calibration_name[:255], max_calib_samples=max_calib_samples,
            max_calib_seq_len=max_calib_seq_len, queue=host.host_queue if host else "gpu",
        )
        job.output_dir = str(Path(settings.MODELS_DIR) / f"{slugify(source.name)[:80]}-awq-w{w_bit}-g{q_group_size}"
                                                         f"-job{job.pk}")
        job.save(update_fields=["output_dir"])
        job_created(job, actor=user, reason=f"quantization of {source.name} requested")
        if enqueue:
            job_enqueue(job, "panel.registry.tasks.run_quantization")
    return job


def quantization_argv(job):
    calibration = job.calibration_file if job.calibration == CalibrationSource.FILE else "builtin"
    argv = processes.engine_argv(
        settings.ENGINE_PYTHON, "quantize_runner", "--model", job.source.path, "--out", job.output_dir,
        "--w-bit", job.w_bit, "--group-size", job.q_group_size, "--version", job.version, "--calib", calibration,
        "--max-calib-samples", job.max_calib_samples, "--max-calib-seq-len", job.max_calib_seq_len)
    if not job.zero_point:
        argv.append("--no-zero-point")
    return argv


def quantization_execute(*, job_id, worker):
    """Body of the quantization task: run the AWQ runner in the engine venv for job `job_id`."""
    job = QuantizationJob.objects.select_related("source", "team").get(pk=job_id)
    log_path = Path(settings.JOBS_DIR) / f"quantization-{job.pk}.log"
    return run_job(job, quantization_argv(job), worker=worker, classify=diagnosis.classify,
                   log_path=log_path, on_success=quantized_model_record, on_end=quantization_cleanup)


def quantized_model_record(job, result):
    """Register the job's output as a child of its source model. Returns the result to store."""
    folder = Path(result.get("output_path") or job.output_dir)
    facts = inspect_checkpoint(folder)
    name = f"{job.source.name}-awq-w{job.w_bit}-g{job.q_group_size}"
    if RegisteredModel.objects.filter(team=job.team, name=name).exists():
        name = f"{name}-job{job.pk}"
    model = model_create(team=job.team, user=job.created_by, name=name, folder=folder, facts=facts,
                         parent=job.source)
    QuantizationJob.objects.filter(pk=job.pk).update(result_model=model)
    job.result_model = model
    return dict(result, model_id=model.pk, model_name=model.name)


def quantization_cleanup(job):
    """A failed or cancelled job leaves no half-written output behind."""
    for folder in (Path(job.output_dir), Path(job.output_dir + ".partial")):
        if job.output_dir and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


def quantization_cancel(*, job, user):
    return job_cancel(job, actor=user)
