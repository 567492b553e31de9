"""Sleep when idle: a deployment whose profile sets `sleep_after_minutes` stops its engine after that long without a
request and starts it again when a request comes (decision 0061).

Its supervisor (serving/services.py, `deployment_execute`) watches the engine's own counters, so a request sent
past the gateway counts too. Idle long enough: the deployment is asleep (one transaction: the state, its nap, the
routing version its local channel's gateways read), the engine keeps serving what it already has for a drain
window, then stops. Its worker keeps owning it, heartbeating, until a request wakes it: the gateway flips it to
waking (gateway/waking.py) and the supervisor starts the engine again; woken during the drain, it is ready again
at once.

Where the host's engine check says vLLM's sleep mode runs (GPU hosts), the engine is started with it and, once
drained, is put to sleep instead of stopped (`POST /sleep?level=1`: its weights moved to CPU memory, its KV cache
dropped, the GPU's memory freed, the process kept); a wake is `POST /wake_up`, seconds instead of a cold start.
vLLM serves those two paths only with VLLM_SERVER_DEV_MODE, behind the engine's own key like every other path. If
the engine does not go to sleep or wake when asked, it is stopped and started as on a CPU host (decision 0072)."""
import logging
import time

import httpx
from django.db import transaction
from django.utils import timezone

from panel.jobs.services import job_heartbeat, job_transition
from panel.serving import drain
from panel.serving.adapters import adapters_reload
from panel.serving.models import Deployment, DeploymentState, Nap
from panel.serving.supervisor import engine_root

log = logging.getLogger(__name__)
SLEEP_LEVEL = 1  # level 2 drops the weights too: a wake would read them again from disk
SLEEP_SECONDS = 60.0  # the most a sleep or a wake may take before the engine is stopped instead

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


def engine_call(deployment, method, path, **params):
    """One call to the deployment's engine, with its key; the JSON answer, or None when it failed."""
    try:
        response = httpx.request(method, f"{engine_root(deployment.port)}{path}", params=params,
                                 headers={"Authorization": f"Bearer {deployment.engine_key()}"},
                                 timeout=SLEEP_SECONDS)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as error:
        log.warning("deployment #%s: %s %s failed: %s", deployment.pk, method, path, error)
        return None


def engine_sleep(deployment):
    """Put the engine in vLLM's sleep mode: True when it says it sleeps."""
    answer = engine_call(deployment, "POST", "/sleep", level=SLEEP_LEVEL)
    return bool(answer) and engine_call(deployment, "GET", "/is_sleeping") == {"is_sleeping": True}


def engine_wake(deployment):
    """Wake an engine in vLLM's sleep mode: True when it says it is awake."""
    answer = engine_call(deployment, "POST", "/wake_up")
    return bool(answer) and engine_call(deployment, "GET", "/is_sleeping") == {"is_sleeping": False}


class SleepHooks:
    """The supervisor's idle watch and drain, for `DeploymentHooks` (serving/services.py). `engine_sleeps`: the
    engine was started with vLLM's sleep mode (serving/services.py, `engine_sleeps`)."""

    def __init__(self, deployment):
        self.deployment = deployment
        minutes = deployment.profile.sleep_after_minutes
        self.minutes = minutes
        self.watch = None
        self.asleep_since = None
        self.engine_sleeps = False
        self.engine_asleep = False  # in vLLM's sleep mode now

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
        once the drain is over and the engine runs nothing (or the drain's deadline passed), unless it went to
        sleep in vLLM's sleep mode instead; woken before it stopped, never (it is ready again at once, after a
        wake from the sleep mode)."""
        if state == DeploymentState.WAKING and self.asleep_since is not None:
            reason = "woken before its engine stopped: ready again"
            if self.engine_asleep:
                started = time.monotonic()
                if not engine_wake(self.deployment):
                    self.asleep_since, self.engine_asleep = None, False
                    return True  # stopped, then started again as on a host without the sleep mode
                self.engine_asleep = False
                reason = (f"woken in {time.monotonic() - started:.1f} s: the engine kept its process in vLLM's "
                          "sleep mode")
            self.asleep_since = None
            adapters_reload(self.deployment)  # an engine woken in place still holds them: checked all the same
            job_transition(self.deployment, to=DeploymentState.READY, allowed_from=[DeploymentState.WAKING],
                           reason=reason)
            return False
        if state != DeploymentState.ASLEEP:
            return True
        since = self.asleep_since
        if since is None:  # asleep before this supervisor knew it: drained long ago
            since = time.monotonic() - drain.DRAIN_DEADLINE_SECONDS
        if self.engine_asleep:
            return False
        if not drain.drained(self.deployment, since=since):
            return False
        if self.engine_sleeps and self.asleep_since is not None:
            self.engine_asleep = engine_sleep(self.deployment)
            if self.engine_asleep:
                log.info("deployment #%s: its engine sleeps (GPU memory freed, process kept)", self.deployment.pk)
            return not self.engine_asleep  # it would not sleep: stopped instead
        return True


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
