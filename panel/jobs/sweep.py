"""When a GPU worker starts, whatever a previous process of the same node left behind is dead or orphaned:
kill any process group still recorded for it and end its rows, instead of waiting for the reaper."""
import logging
import os
import signal

log = logging.getLogger(__name__)


def sweep(node_name):
    from panel.jobs.models import LIVE_STATES
    from panel.jobs.services import job_fail, job_models
    from panel.serving.models import LIVE_DEPLOYMENT_STATES, Deployment, DeploymentState
    from panel.serving.services import deployment_transition

    reason = f"the worker {node_name} restarted while this ran"
    for model in job_models():
        for job in model.objects.filter(worker=node_name, state__in=list(LIVE_STATES)):
            _kill(job.pid)
            job_fail(job, kind="worker_lost", reason=reason)
    for deployment in Deployment.objects.filter(worker=node_name, state__in=list(LIVE_DEPLOYMENT_STATES)):
        _kill(deployment.pid)
        deployment_transition(deployment, to=DeploymentState.FAILED, allowed_from=list(LIVE_DEPLOYMENT_STATES),
                              reason=reason, failure_kind="worker_lost", failure_reason=reason, pid=None)


def _kill(pgid):
    if not pgid:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
        log.warning("killed the orphaned process group %s", pgid)
    except (ProcessLookupError, PermissionError):
        pass
