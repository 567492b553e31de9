"""State changes, heartbeats and the reaper for every `Job` subclass."""
import logging
import re
from datetime import timedelta

from celery import current_app
from django.apps import apps
from django.db import transaction
from django.utils import timezone

from panel.jobs.models import Job, JobEvent, JobState
from panel.notifications.services import notify

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
# A runner may end its phase with an estimate ("calibrating layer 2 of 30 · about 31 s left"); an ended job has
# no time left, so the estimate goes when it ends and the phase keeps where it was.
TIME_LEFT = re.compile(r"\s*·\s*about [^·]* left$")


def job_transition(job, *, to, allowed_from, actor=None, reason="", **fields):
    """Move `job` to state `to` if, and only if, it is now in one of `allowed_from`.

    One conditional UPDATE decides; the loser of a race (a second worker, a redelivered message, a reaper)
    gets False and changes nothing. Extra `fields` are written in the same UPDATE. On success the event is
    recorded, `job` is updated in memory and its kind's `on_transition` runs, all in the same transaction. Every
    final state of every kind sets `finished_at` and drops the time-left estimate from the phase."""
    final = to in type(job).FINAL_STATES
    if final:
        fields.setdefault("finished_at", timezone.now())
    with transaction.atomic():
        previous, phase = type(job).objects.filter(pk=job.pk).values_list("state", "phase").first() or (None, "")
        if final and "phase" not in fields and TIME_LEFT.search(phase):
            fields["phase"] = TIME_LEFT.sub("", phase)
        updated = type(job).objects.filter(pk=job.pk, state__in=list(allowed_from)).update(state=to, **fields)
        if not updated:
            return False
        JobEvent.objects.create(job_type=job.job_type(), job_id=job.pk, from_state=previous or "", to_state=to,
                                actor=actor, reason=reason[:2000])
        job.state = to
        for name, value in fields.items():
            setattr(job, name, value)
        job.on_transition()
        if to == type(job).FAILED:
            _failure_notice(job, previous)
    return True


def _failure_notice(job, previous):
    """The team hears of a failed job (a deployment that crashed or never became ready included) in the same
    transaction as the failure."""
    label = type(job)._meta.verbose_name
    reason = (job.failure_reason or job.failure_kind or "no reason recorded")[:200]
    notify(team=job.team_id, kind=type(job).FAILURE_EVENT, title=f"{label.capitalize()} #{job.pk} failed: {reason}",
           job_type=job.job_type(), job_id=job.pk, failure_kind=job.failure_kind or "", previous_state=previous or "",
           failure_reason=reason)


def job_created(job, *, actor=None, reason="created"):
    """Record who asked for a job (or deployment) that was just inserted."""
    JobEvent.objects.create(job_type=job.job_type(), job_id=job.pk, from_state="", to_state=job.state,
                            actor=actor, reason=reason[:2000])


def job_enqueue(job, task):
    """Send the task named `task` (e.g. "panel.serving.tasks.run_deployment") for `job` to the job's queue once the
    current transaction commits, so the worker finds the row. By name: a service never imports its app's tasks
    module (the tasks import the services)."""
    transaction.on_commit(lambda: current_app.send_task(task, args=[job.pk], queue=job.queue or "default"))


def job_claim(job, *, worker, reason="", allowed_from=(JobState.PENDING,), **fields):
    """A worker takes a pending job (with `fields` written in the same UPDATE); a woken deployment is claimed from
    waking. False means someone already did (duplicate delivery), or it was stopped before it started: do nothing."""
    now = timezone.now()
    return job_transition(job, to=type(job).CLAIMED, allowed_from=list(allowed_from),
                          reason=reason or f"claimed by {worker}", worker=worker, started_at=now, heartbeat_at=now,
                          **fields)


def job_heartbeat(job, *, progress=None, phase=None, log_lines=(), pid=None):
    """Record that the job is alive, with its progress. Returns the job's state as stored now, so the
    runner learns of a cancel request at its next beat."""
    fields = {"heartbeat_at": timezone.now()}
    if progress is not None:
        fields["progress"] = max(0, min(100, int(progress)))
    if phase is not None:
        fields["phase"] = phase[:200]
    if pid is not None:
        fields["pid"] = pid
    if log_lines:
        job.log_tail = append_log(job.log_tail, log_lines)
        fields["log_tail"] = job.log_tail
    type(job).objects.filter(pk=job.pk, state__in=list(type(job).LIVE_STATES)).update(**fields)
    for name, value in fields.items():
        setattr(job, name, value)
    state = type(job).objects.filter(pk=job.pk).values_list("state", flat=True).first()
    job.state = state
    return state


def append_log(tail, lines):
    kept = (tail.splitlines() if tail else []) + [line.rstrip("\n")[:2000] for line in lines]
    return "\n".join(kept[-LOG_TAIL_LINES:])


def job_succeed(job, *, result):
    return job_transition(job, to=JobState.SUCCEEDED, allowed_from=[JobState.RUNNING], reason="finished",
                          result=result, progress=100, phase="done", pid=None)


def job_fail(job, *, kind, reason, actor=None, event=""):
    """Fail an active job with a classified `kind` (e.g. "oom") and a reason in words (`event`: the history's words,
    when they differ from "kind: reason")."""
    kind_of = type(job)
    return job_transition(job, to=kind_of.FAILED, allowed_from=list(kind_of.ACTIVE_STATES), actor=actor,
                          reason=event or f"{kind}: {reason}", failure_kind=kind, failure_reason=reason, pid=None)


def job_cancel(job, *, actor=None, reason="cancel requested"):
    """Ask for a job to stop. A pending job stops at once; a live one moves to its stopping state and its worker
    kills the process group at its next heartbeat. Returns True if anything changed."""
    kind_of = type(job)
    if job_transition(job, to=kind_of.STOPPED, allowed_from=[JobState.PENDING], actor=actor,
                      reason=f"{reason} (before it started)"):
        return True
    working = [state for state in kind_of.LIVE_STATES if state != kind_of.STOPPING]
    return job_transition(job, to=kind_of.STOPPING, allowed_from=working, actor=actor, reason=reason)


def job_cancelled(job, *, reason="process stopped"):
    """The worker confirms that the process group of a stopping job is gone."""
    kind_of = type(job)
    return job_transition(job, to=kind_of.STOPPED, allowed_from=[kind_of.STOPPING], reason=reason, pid=None)


def job_models():
    return [model for model in apps.get_models() if issubclass(model, Job)]


def jobs_reap(*, stale_after_seconds):
    """Fail every job (deployments included) whose worker stopped heartbeating (killed, lost, or its host went
    away). Returns the reaped jobs. A job that was being stopped ends stopped instead. A deployment's engine died
    with its worker (PR_SET_PDEATHSIG)."""
    cutoff = timezone.now() - timedelta(seconds=stale_after_seconds)
    reaped = []
    for model in job_models():
        stale = model.objects.filter(state__in=list(model.LIVE_STATES), heartbeat_at__lt=cutoff)
        for job in stale:
            reason = (f"the worker {job.worker or '?'} stopped sending heartbeats for over {stale_after_seconds} s "
                      "(killed, crashed or lost its host)")
            if job.state == model.STOPPING:
                moved = job_cancelled(job, reason="reaper: " + reason)
            else:
                moved = job_fail(job, kind="worker_lost", reason=reason, event="reaper: " + reason)
            if moved:
                log.warning("reaped %s #%s: %s", model._meta.label, job.pk, reason)
                reaped.append(job)
    return reaped


def job_events(job):
    return JobEvent.objects.filter(job_type=job.job_type(), job_id=job.pk).select_related("actor")
