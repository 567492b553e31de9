"""Sleep when idle: a deployment whose profile sets `sleep_after_minutes` stops its engine after that long without a
request and starts it again when a request comes (decision 0061).

Its supervisor (serving/services.py, `deployment_execute`) watches the engine's own counters, so a request sent
past the gateway counts too. Idle long enough: the deployment is asleep (one transaction: the state, its nap, the
routing version its local channel's gateways read), the engine keeps serving what it already has for a drain
window, then stops. Its worker keeps owning it, heartbeating, until a request wakes it: the gateway flips it to
waking (gateway/waking.py) and the supervisor starts the engine again; woken during the drain, it is ready again
at once. vLLM's own sleep mode (GPU memory freed, the process kept) is not used: the CPU engine has none, and a
stopped engine frees a GPU the same way, at the cost of a cold start."""
import logging
import time

from django.db import transaction
from django.utils import timezone

from panel.jobs.services import job_heartbeat, job_transition
from panel.serving import drain
from panel.serving.models import Deployment, DeploymentState, Nap

log = logging.getLogger(__name__)

class IdleWatch:
    """When the engine last did anything: a request in flight, or prompt tokens taken in since the last look."""

    def __init__(self, minutes, *, now=None):
        self.seconds = minutes * 60
        self.last_active = time.monotonic() if now is None else now
        self.taken_in = None

    def observe(self, activity, *, now=None):
        """Take one look (`engine_activity`'s answer); True when the engine has been idle for the profile's
        minutes. An engine that does not answer is not idle (it may be busy or restarting)."""
        now = time.monotonic() if now is None else now
        if activity is None:
            self.last_active = now
            return False
        taken_in, busy = activity
        if busy or (self.taken_in is not None and taken_in != self.taken_in):
            self.last_active = now
        self.taken_in = taken_in
        return now - self.last_active >= self.seconds


def deployment_fall_asleep(deployment, *, minutes):
    """Ready -> asleep, with its nap begun, in one transaction (its local channel stays on the route and the
    gateways re-read it). False when it was not ready (stopped meanwhile)."""
    with transaction.atomic():
        moved = job_transition(deployment, to=DeploymentState.ASLEEP, allowed_from=[DeploymentState.READY],
                               reason=f"no request for {minutes:g} min: the engine stops (its GPU hours stop) and "
                                      "the next request wakes it")
        if moved:
            Nap.objects.create(deployment=deployment, began_at=timezone.now())
    return moved


def deployment_wake(deployment, *, by):
    """Asleep -> waking, its nap ended, in one transaction: its supervisor starts the engine. `by` says who woke it
    ("a request for tiny-chat", a user's name). False when it was not asleep (already waking, or stopped)."""
    with transaction.atomic():
        moved = job_transition(deployment, to=DeploymentState.WAKING, allowed_from=[DeploymentState.ASLEEP],
                               reason=f"woken by {by}")
        if moved:
            nap_end(deployment, by=by)
    return moved


def nap_end(deployment, *, by):
    Nap.objects.filter(deployment=deployment, ended_at__isnull=True).update(ended_at=timezone.now(),
                                                                            woken_by=by[:200])


class SleepHooks:
    """The supervisor's idle watch and drain, for `DeploymentHooks` (serving/services.py)."""

    def __init__(self, deployment):
        self.deployment = deployment
        minutes = deployment.profile.sleep_after_minutes
        self.minutes = minutes
        self.watch = None
        self.asleep_since = None

    def after_beat(self, state):
        """At each heartbeat of a ready engine: look at its activity; asleep once idle for the profile's minutes."""
        if not self.minutes or state != DeploymentState.READY:
            self.watch = None
            return
        if self.watch is None:  # a new engine (launched, restarted or woken): idle from now
            self.watch, self.asleep_since = IdleWatch(self.minutes), None
        activity = drain.engine_activity(self.deployment.port, self.deployment.engine_key())
        if self.watch.observe(activity) and deployment_fall_asleep(self.deployment, minutes=self.minutes):
            self.asleep_since = time.monotonic()
            log.info("deployment #%s is asleep after %g idle minutes", self.deployment.pk, self.minutes)

    def stop_engine(self, state):
        """Whether the engine should stop now, for a deployment in `state` that is asleep or was woken: asleep,
        once the drain is over and the engine runs nothing (or the drain's deadline passed); woken before that,
        never (it is ready again at once)."""
        if state == DeploymentState.WAKING and self.asleep_since is not None:
            self.asleep_since = None
            job_transition(self.deployment, to=DeploymentState.READY, allowed_from=[DeploymentState.WAKING],
                           reason="woken before its engine stopped: ready again")
            return False
        if state != DeploymentState.ASLEEP:
            return True
        since = self.asleep_since
        if since is None:  # asleep before this supervisor knew it: drained long ago
            since = time.monotonic() - drain.DRAIN_DEADLINE_SECONDS
        return drain.drained(self.deployment, since=since)


def wait_while_asleep(deployment, *, beat_every=5.0, poll_every=0.5):
    """The supervisor's wait between naps: heartbeat the sleeping deployment until a request wakes it (True) or it is
    stopped or lost (False; a stop ends its nap here)."""
    last_beat = 0.0
    while True:
        now = time.monotonic()
        if now - last_beat >= beat_every:
            last_beat = now
            state = job_heartbeat(deployment)
        else:
            state = Deployment.objects.filter(pk=deployment.pk).values_list("state", flat=True).first()
        if state == DeploymentState.WAKING:
            return True
        if state != DeploymentState.ASLEEP:
            nap_end(deployment, by="stopped")
            return False
        time.sleep(poll_every)
