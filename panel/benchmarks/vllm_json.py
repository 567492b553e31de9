"""A benchmark result as the JSON `vllm bench serve --save-result` writes, both ways.

Export: the run's setup keys (date, backend, label, model_id, num_prompts, request_rate, burstiness,
max_concurrency), then the figures under vLLM's keys (duration, completed, ..., mean/median/std/p90/p99 of
ttft, tpot, itl and e2el in ms). Tokenwise's own facts go under keys vLLM's --metadata would add ("tokenwise_*").

Import: such a file becomes a finished run of kind "imported", to compare with the team's own runs. Every key it
uses is checked (type, range, finite); anything wrong is refused with the key's name and nothing is written."""
import math
import re

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from panel.benchmarks.models import BenchmarkRun, TargetKind
from panel.core import safejson
from panel.jobs.models import JobState
from panel.jobs.services import job_created

MAX_IMPORT_BYTES = 5 * 1024 * 1024
# The figures every `vllm bench serve --save-result` file has (vLLM's default --percentile-metrics is
# ttft,tpot,itl; e2el only when asked for).
REQUIRED_NUMBERS = ("duration", "request_throughput", "output_throughput", "total_token_throughput",
                    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms",
                    "mean_itl_ms", "median_itl_ms", "std_itl_ms")
REQUIRED_COUNTS = ("completed", "total_input_tokens", "total_output_tokens")
METRIC_KEY = re.compile(r"^(mean|median|std|p\d{1,2}(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
SETUP_STRINGS = ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id")


def export(run):
    """The dict `vllm bench serve --save-result` would have written for this run."""
    result = run.result or {}
    finished = run.finished_at or run.created_at
    out = {"date": timezone.localtime(finished).strftime("%Y%m%d-%H%M%S"), "endpoint_type": "openai-chat",
           "backend": "openai-chat", "label": run.title, "model_id": result.get("model_id") or run.target_label,
           "tokenizer_id": result.get("tokenizer_id") or result.get("model_id") or run.target_label,
           "num_prompts": run.requests, "request_rate": run.request_rate if run.request_rate else "inf",
           "burstiness": 1.0, "max_concurrency": run.concurrency}
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "request_goodput", "output_throughput", "total_token_throughput"):
        out[key] = result.get(key)
    for key, value in result.items():
        if METRIC_KEY.match(key):
            out[key] = value
    out["tokenwise_run"] = run.pk
    out["tokenwise_target"] = run.target_label
    out["tokenwise_workload"] = run.workload_summary
    if result.get("goodput_slo"):
        out["tokenwise_goodput_slo_ms"] = result["goodput_slo"]
    return out


def _number(data, key, problems, *, required, integer=False):
    if key not in data or data[key] is None:
        if required:
            problems.append(f"“{key}” is missing.")
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        problems.append(f"“{key}” must be a {'whole number' if integer else 'number'}, not {value!r:.40}.")
        return None
    if not math.isfinite(value) or value < 0:
        problems.append(f"“{key}” must be a finite number of at least 0, not {value!r:.40}.")
        return None
    return value


def parse(data, *, name=""):
    """(result dict, setup dict) from the bytes of a `--save-result` file; ValidationError listing every problem."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ValidationError(f"The file is {len(data):,} bytes; a result file may have at most "
                              f"{MAX_IMPORT_BYTES:,}.")
    try:
        document = safejson.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ValidationError("The file is not UTF-8 text: upload the JSON `vllm bench serve --save-result` "
                              "wrote.") from None
    except ValueError as error:
        raise ValidationError(f"The file is not valid JSON ({getattr(error, 'msg', error)}).") from None
    if not isinstance(document, dict):
        raise ValidationError("The file must hold one JSON object, as `vllm bench serve --save-result` writes "
                              f"(got {type(document).__name__}).")
    problems = []
    result = {}
    for key in REQUIRED_NUMBERS:
        result[key] = _number(document, key, problems, required=True)
    for key in REQUIRED_COUNTS:
        result[key] = _number(document, key, problems, required=True, integer=True)
    result["failed"] = _number(document, "failed", problems, required=False, integer=True) or 0
    result["request_goodput"] = _number(document, "request_goodput", problems, required=False)
    for key in document:
        if METRIC_KEY.match(key) and key not in result:
            result[key] = _number(document, key, problems, required=False)
    if result.get("duration") == 0:
        problems.append("“duration” must be more than 0 seconds.")
    setup = {}
    for key in SETUP_STRINGS:
        value = document.get(key)
        if value is not None and not isinstance(value, str):
            problems.append(f"“{key}” must be text, not {value!r:.40}.")
        setup[key] = (value or "")[:200] if isinstance(value, str) else ""
    setup["num_prompts"] = _number(document, "num_prompts", problems, required=False, integer=True)
    setup["max_concurrency"] = _number(document, "max_concurrency", problems, required=False, integer=True)
    rate = document.get("request_rate", "inf")
    if rate != "inf":
        rate = _number(document, "request_rate", problems, required=False)
    setup["request_rate"] = None if rate in ("inf", 0) else rate
    if not problems and result["completed"] == 0:
        problems.append("“completed” is 0: the file records no successful request to compare.")
    if problems:
        raise ValidationError(problems)
    result = {key: value for key, value in result.items() if value is not None or key == "request_goodput"}
    completed = result["completed"]
    result.update(requests=completed + result["failed"], error_kinds={}, first_error="", targets={},
                  error_rate=round(result["failed"] / (completed + result["failed"]), 4),
                  mean_input_tokens=round(result["total_input_tokens"] / completed, 1),
                  mean_output_tokens=round(result["total_output_tokens"] / completed, 1),
                  imported_from=name[:200], model_id=setup["model_id"], tokenizer_id=setup["tokenizer_id"],
                  goodput_slo={})
    return result, setup


def import_result(*, team, user, data, name, title=""):
    """Store a `--save-result` file as a finished run of the team; ValidationError (nothing written) if it is bad."""
    result, setup = parse(data, name=name)
    label = f"imported: {setup['model_id'] or 'unknown model'}" + (f" ({setup['label']})" if setup["label"] else "")
    now = timezone.now()
    with transaction.atomic():
        run = BenchmarkRun.objects.create(
            team=team, created_by=user, name=(title or setup["label"] or name)[:200],
            target_kind=TargetKind.IMPORTED, target_label=label[:300], state=JobState.SUCCEEDED, progress=100,
            phase="imported", result=result, started_at=now, finished_at=now,
            requests=setup["num_prompts"] or result["requests"], warmup_requests=0,
            concurrency=min(setup["max_concurrency"] or 1, 1024), request_rate=setup["request_rate"])
        job_created(run, actor=user, reason=f"imported from {name[:200]} (vllm bench serve --save-result)")
    return run
