"""When a GPU worker starts, whatever a previous process of the same node left behind is dead or orphaned:
kill any process group still recorded for it and fail its jobs (deployments included), instead of waiting for the
reaper."""
import logging
import os
import signal

from panel.jobs.services import job_fail, job_models

log = logging.getLogger(__name__)


def sweep(node_name):
    reason = f"the worker {node_name} restarted while this ran"
    for model in job_models():
        for job in model.objects.filter(worker=node_name, state__in=list(model.LIVE_STATES)):
            _kill(job.pid)
            job_fail(job, kind="worker_lost", reason=reason, event=reason)


def _kill(pgid):
    if not pgid:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
        log.warning("killed the orphaned process group %s", pgid)
    except (ProcessLookupError, PermissionError):
        pass
