"""Run a job's runner script (inside the engine venv) and mirror what it says onto the job row.

Runner protocol, one JSON object per stdout line, any other line is plain log:
  {"phase": "layer 3 of 24", "progress": 40}     progress 0-100, both optional
  {"log": "text"}                                  a log line
  {"result": {...}}                                the final result (once, at the end)
  {"error": {"kind": "oom", "reason": "..."}}      a failure the runner classified itself
Exit code 0 with a result is success; anything else is a failure, classified from the log."""
import json
import logging
from dataclasses import dataclass, field

from django.conf import settings

from panel.jobs import processes
from panel.jobs.models import JobState
from panel.jobs.services import job_cancelled, job_claim, job_fail, job_heartbeat, job_succeed

log = logging.getLogger(__name__)


@dataclass
class RunnerReport:
    result: dict | None = None
    error: dict | None = None
    progress: int | None = None
    phase: str | None = None
    pending_log: list = field(default_factory=list)

    def take(self, line):
        message = parse_line(line)
        if message is None:
            self.pending_log.append(line)
            return
        if "progress" in message:
            try:
                self.progress = int(float(message["progress"]))
            except (TypeError, ValueError):
                pass
        if "phase" in message:
            self.phase = str(message["phase"])
            self.pending_log.append(f"» {self.phase}")
        if "log" in message:
            self.pending_log.append(str(message["log"]))
        if isinstance(message.get("result"), dict):
            self.result = message["result"]
        if isinstance(message.get("error"), dict):
            self.error = message["error"]


def parse_line(line):
    if not line.startswith("{"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def run_for_result(argv, *, time_limit, on_message=None):
    """Run a command that speaks these JSON lines outside a job (building the demo model, training an adapter):
    (its outcome, {"result": ..., "error": ...} as far as it said them). `on_message`: each JSON line as it comes;
    other lines (library chatter) stay in the outcome's tail for errors."""
    said = {}

    def on_line(line):
        message = parse_line(line)
        if message is None:
            return
        for key in ("result", "error"):
            if isinstance(message.get(key), dict):
                said[key] = message[key]
        if on_message is not None:
            on_message(message)

    return processes.run_streaming(argv, on_line=on_line, tick=lambda: False, time_limit=time_limit), said


def run_job(job, argv, *, worker, classify, env=None, time_limit=None, log_path=None, on_success=None,
            on_end=None):
    """Claim `job`, run `argv`, keep the row's heartbeat/progress/log current, honour cancel requests and
    the time limit, and leave the job in a final state. Returns False if the job was already claimed
    (a duplicate delivery), True otherwise.

    `classify(tail_lines, returncode)` -> (kind, reason) explains a failure in words.
    `on_success(job, result)` may turn the raw result into rows (and return the result to store).
    `on_end(job)` cleans up after any ending that is not success (removes a half-written output)."""
    if not job_claim(job, worker=worker):
        log.info("%s #%s already claimed; duplicate delivery ignored", job._meta.label, job.pk)
        return False
    report = RunnerReport()

    def flush():
        lines, report.pending_log = report.pending_log, []
        state = job_heartbeat(job, progress=report.progress, phase=report.phase, log_lines=lines)
        return state != JobState.RUNNING

    limit = time_limit or settings.JOB_HARD_TIME_LIMIT
    # A cancel must land within 10 s: up to one heartbeat to notice it, then a short grace for the runner's
    # own cleanup before SIGKILL (on_end removes whatever it left).
    try:
        outcome = processes.run_streaming(
            argv, on_line=report.take, tick=flush, tick_every=settings.JOB_HEARTBEAT_SECONDS, time_limit=limit,
            env=env, log_path=log_path, on_start=lambda pid: job_heartbeat(job, pid=pid), grace_seconds=3,
        )
    except OSError as error:
        _end(job, on_end)
        job_fail(job, kind="engine_missing", reason=f"could not start the runner: {error}")
        return True
    except BaseException as error:
        # The Celery soft time limit or a worker shutdown lands here: the process group is already gone.
        _end(job, on_end)
        job_fail(job, kind="interrupted", reason=f"the worker interrupted the job ({type(error).__name__})")
        raise
    flush_state = job_heartbeat(job, progress=report.progress, phase=report.phase, log_lines=report.pending_log)
    if outcome.stopped or flush_state == JobState.CANCELLING:
        _end(job, on_end)
        job_cancelled(job)
    elif outcome.timed_out:
        _end(job, on_end)
        job_fail(job, kind="time_limit", reason=f"the job ran longer than its limit of {limit} s and was stopped")
    elif outcome.returncode == 0 and report.result is not None:
        result = report.result
        if on_success is not None:
            try:
                result = on_success(job, result) or result
            except Exception as error:  # the result could not be recorded: the job did not succeed
                log.exception("recording the result of %s #%s failed", job._meta.label, job.pk)
                _end(job, on_end)
                job_fail(job, kind="result_invalid", reason=f"the runner's result could not be recorded: {error}")
                return True
        job_succeed(job, result=result)
    else:
        if report.error:
            kind, reason = report.error.get("kind", "failed"), report.error.get("reason", "")
        else:
            kind, reason = classify(outcome.tail, outcome.returncode)
        _end(job, on_end)
        job_fail(job, kind=kind, reason=reason)
    return True


def _end(job, on_end):
    """Clean up after a job that did not succeed, before its final state is written: whoever sees the state
    sees the cleanup done."""
    if on_end is None:
        return
    try:
        on_end(job)
    except Exception:  # the job still gets its final state (and an interrupted one its original error)
        log.exception("cleaning up after %s #%s failed", job._meta.label, job.pk)
