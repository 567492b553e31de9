"""Scale on queue: a deployment with a scale policy gets one replica more when requests keep waiting (or its KV cache
stays full) and one fewer when it stays quiet, between its minimum and maximum (decision 0069).

The scaler runs after each pass of the dashboards' scraper (its beat task), on what that pass and the ones before
stored: each replica's engine samples (vLLM's num_requests_waiting, num_requests_running and KV-cache usage gauges),
handed in by the scraper's app (`readings`), which sits above serving. It decides only on a window that every
serving replica was scraped through since the last change, and not while a replica is still starting or draining,
so one burst adds one replica at a time.

Up: a replica row is written where `placement` finds room (the host with the fewest of the deployment's replicas
first) and queued, in one transaction with the policy's change. Down: the newest ready replica (never the first,
which stands for the deployment) goes ready -> draining in one transaction with its local channel's removal from
the route; its supervisor lets it finish what it runs (serving/drain.py), then stops it. No request is cut."""
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from panel.jobs.services import job_created, job_enqueue, job_transition
from panel.serving import placement
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, DeploymentState, ScalePolicy
from panel.serving.quota import gpu_quota_check
from panel.serving.services import profile_check

log = logging.getLogger(__name__)
S = DeploymentState
SETTLING = (S.PENDING, S.STARTING, S.DRAINING, S.ASLEEP, S.WAKING)
LIMITS = {"up_after_seconds": (10, 3600), "down_after_seconds": (30, 86400), "up_waiting": (0.1, 1000.0),
          "up_kv_cache": (0.05, 1.0)}


@dataclass
class Decision:
    action: str  # "up", "down" or "" (nothing to do)
    reason: str
    replica: Deployment | None = None  # the replica to drain
    noted: bool = False  # worth showing on the deployment's page although nothing was done


def policy_validate(*, min_replicas, max_replicas, up_waiting, up_kv_cache, up_after_seconds, down_after_seconds):
    """Every problem of a scale policy's values, keyed by field ({} when it is sound)."""
    problems = {}
    if not 1 <= min_replicas <= placement.MAX_REPLICAS:
        problems["min_replicas"] = f"The minimum must be between 1 and {placement.MAX_REPLICAS}."
    if not min_replicas <= max_replicas <= placement.MAX_REPLICAS:
        problems["max_replicas"] = (f"The maximum must be at least the minimum ({min_replicas}) and at most "
                                    f"{placement.MAX_REPLICAS}.")
    values = {"up_waiting": up_waiting, "up_kv_cache": up_kv_cache, "up_after_seconds": up_after_seconds,
              "down_after_seconds": down_after_seconds}
    words = {"up_waiting": "Waiting requests per replica", "up_kv_cache": "KV-cache use",
             "up_after_seconds": "The time before adding a replica",
             "down_after_seconds": "The quiet time before removing one"}
    for name, (low, high) in LIMITS.items():
        if not low <= values[name] <= high:
            problems[name] = f"{words[name]} must be between {low:g} and {high:g}."
    return problems


@transaction.atomic
def policy_save(*, deployment, **values):
    """Create or change the scale policy of a deployment (its first replica's row); ValidationError, saving nothing,
    when a value is out of range or the deployment has ended."""
    head = deployment if deployment.replica_of_id is None else deployment.replica_of
    if head.state not in ACTIVE_DEPLOYMENT_STATES or head.state == S.STOPPING:
        raise ValidationError(f"Deployment #{head.pk} is {head.get_state_display().lower()}: scaling applies to a "
                              "running deployment.")
    problems = policy_validate(**values)
    if problems:
        raise ValidationError(problems)
    policy, _ = ScalePolicy.objects.update_or_create(deployment=head, defaults=values)
    return policy


def policy_off(*, deployment):
    """The deployment keeps the replicas it has and scales no more. True when it had a policy."""
    head_id = deployment.replica_of_id or deployment.pk
    return ScalePolicy.objects.filter(deployment_id=head_id).delete()[0] > 0


def _window(samples, *, start, now, every):
    """The samples of one replica from `start` on, or None when the scraper did not watch it through the whole
    window (its first look more than one and a half scrapes after the start, or its last one stale)."""
    kept = [sample for sample in samples if sample.at >= start]
    if not kept or kept[0].at > start + timedelta(seconds=1.5 * every) or kept[-1].at < now - timedelta(
            seconds=2 * every + 1):
        return None
    return kept


def scale_decision(policy, replicas, samples, *, now, every, max_num_seqs):
    """What to do now. `replicas`: the deployment's rows; `samples`: {replica id: its good engine samples, oldest
    first}; `every`: the scraper's interval in seconds; `max_num_seqs`: the profile's batch size."""
    serving = [replica for replica in replicas if replica.state == S.READY]
    counted = [replica for replica in replicas if replica.state in (S.READY, S.PENDING, S.STARTING, S.WAKING,
                                                                   S.ASLEEP)]
    changed = policy.changed_at
    if len(counted) < policy.min_replicas:
        if changed is not None and changed > now - timedelta(seconds=policy.up_after_seconds):
            return Decision("", "under its minimum: a replica added less than a window ago failed")
        return Decision("up", f"{len(counted)} replica{'s' if len(counted) != 1 else ''} running, under the "
                              f"minimum of {policy.min_replicas}")
    settling = [replica for replica in replicas if replica.state in SETTLING]
    if settling:
        first = settling[0]
        return Decision("", f"replica {first.replica_number} is {first.get_state_display().lower()}: the scaler "
                            "waits for it")
    if not serving:
        return Decision("", "no replica is serving")

    def watched(seconds):
        start = now - timedelta(seconds=seconds)
        if changed is not None and changed > start:
            return None  # not a whole window since the last change
        windows = [_window(samples.get(replica.pk, []), start=start, now=now, every=every) for replica in serving]
        return None if any(window is None for window in windows) else windows

    up = watched(policy.up_after_seconds)
    if up is not None:
        # What stayed: the window's mean reading on each replica, averaged over the replicas, with the last reading
        # still at the threshold (a queue has dips as answers end; a burst that is over adds nothing).
        def kept(reading, threshold):
            mean = sum(sum(reading(sample) for sample in window) / len(window) for window in up) / len(up)
            last = sum(reading(window[-1]) for window in up) / len(up)
            return mean if mean >= threshold and last >= threshold else None

        waiting = kept(lambda sample: sample.waiting or 0, policy.up_waiting)
        kv = kept(lambda sample: sample.kv_cache_usage or 0, policy.up_kv_cache)
        pressed = []
        if waiting is not None:
            pressed.append(f"{waiting:.3g} request{'s' if waiting != 1 else ''} waited per replica on average")
        if kv is not None:
            pressed.append(f"the KV cache was {kv:.0%} full on average")
        if pressed:
            why = " and ".join(pressed) + f" for {policy.up_after_seconds} s"
            if len(counted) >= policy.max_replicas:
                return Decision("", f"{why}, but the deployment is at its maximum of {policy.max_replicas} "
                                    "replicas", noted=True)
            return Decision("up", why)
    if len(serving) <= policy.min_replicas:
        return Decision("", f"{len(serving)} replica{'s' if len(serving) != 1 else ''}, the minimum")
    down = watched(policy.down_after_seconds)
    if down is None:
        return Decision("", "watching")
    waited = max(sample.waiting or 0 for window in down for sample in window)
    kv = max(sample.kv_cache_usage or 0 for window in down for sample in window)
    running = sum(max(sample.running or 0 for sample in window) for window in down)
    quiet_kv = policy.up_kv_cache / 2
    room = (len(serving) - 1) * max_num_seqs / 2  # what the others take at half their batch
    if waited == 0 and kv < quiet_kv and running <= room:
        newest = max(serving[1:] or serving, key=lambda replica: replica.replica_index)
        if newest.replica_index == 0:
            return Decision("", "only the first replica is serving")
        return Decision("down", f"no request waited, the KV cache stayed under {quiet_kv:.0%} and at most "
                                f"{running:g} ran at once for {policy.down_after_seconds} s", replica=newest)
    return Decision("", "busy enough to keep its replicas")


def deployments_scale(*, readings, now=None):
    """One pass of the scaler over every running deployment with a scale policy; returns {deployment id: action}.
    `readings(deployment ids, since)`: {id: that deployment's good engine samples since then, oldest first}."""
    now = now or timezone.now()
    every = settings.DASHBOARDS_SCRAPE_EVERY_SECONDS
    done = {}
    heads = ScalePolicy.objects.filter(deployment__state__in=[state for state in ACTIVE_DEPLOYMENT_STATES
                                                              if state != S.STOPPING])
    for policy_id, head_id in heads.values_list("pk", "deployment_id"):
        try:
            action = _scale_one(policy_id, readings=readings, now=now, every=every)
        except Exception:  # a bug for one deployment must not stop the scaler (or the scraper) for all
            log.exception("the scaler failed for deployment #%s", head_id)
            continue
        if action is not None:
            done[head_id] = action
    return done


def _scale_one(policy_id, *, readings, now, every):
    """Decide and act for one policy, in one transaction with its row locked; the action taken ("up", "down", or ""
    when one was wanted and could not be taken), or None when there was nothing to do."""
    with transaction.atomic():
        policy = ScalePolicy.objects.select_for_update().select_related(
            "deployment__profile__model", "deployment__host").filter(pk=policy_id).first()
        if policy is None:
            return None
        replicas = policy.deployment.replicas()
        serving = [replica.pk for replica in replicas if replica.state == S.READY]
        longest = max(policy.up_after_seconds, policy.down_after_seconds)
        samples = readings(serving, now - timedelta(seconds=longest + 2 * every))
        decision = scale_decision(policy, replicas, samples, now=now, every=every,
                                  max_num_seqs=policy.deployment.profile.max_num_seqs)
        if decision.action == "up":
            return replica_add(policy, replicas, reason=decision.reason, now=now)
        if decision.action == "down":
            return replica_drain(policy, decision.replica, reason=decision.reason, now=now)
        if decision.noted:
            _note(policy, decision.reason, now=now)
        return None


def replica_add(policy, replicas, *, reason, now):
    """Queue one more replica of the policy's deployment where there is room; "up", or "" with the reason noted."""
    head = policy.deployment
    running = [replica for replica in replicas if replica.state in ACTIVE_DEPLOYMENT_STATES]
    try:
        host = placement.replicas_place(head.profile, 1, check=profile_check,
                                        beside=[replica.host for replica in running])[0]
    except ValidationError as error:
        _note(policy, f"{reason}, but no worker could take one more replica: {' '.join(error.messages)}", now=now)
        return ""
    try:  # a replica the scaler adds counts against the team's GPU quota as a launched one does
        gpu_quota_check(team=head.team, profile=head.profile, hosts=[host])
    except ValidationError as error:
        _note(policy, f"{reason}, but one more replica would pass the team's GPU quota: {' '.join(error.messages)}",
              now=now)
        return ""
    taken = {replica.replica_index for replica in running}
    index = min(number for number in range(len(replicas) + 1) if number not in taken)  # a freed slot first
    replica = Deployment.objects.create(
        team=head.team, profile=head.profile, host=host, queue=f"gpu.{host.host}",
        served_model_name=head.served_model_name, restart_on_crash=True, attach_to_route=head.attach_to_route,
        replica_of=head, replica_index=index)
    words = f"replica {index + 1} added on {host.host}: {reason}"
    job_created(replica, reason=f"the scaler: {words}")
    job_enqueue(replica, "panel.serving.tasks.run_deployment")
    _note(policy, words, now=now, changed=True)
    log.info("deployment #%s: %s", head.pk, words)
    return "up"


def replica_drain(policy, replica, *, reason, now):
    """Take `replica` out of rotation to drain and stop: "down", or "" when it was no longer ready."""
    words = f"replica {replica.replica_number} drains and stops: {reason}"
    if not job_transition(replica, to=S.DRAINING, allowed_from=[S.READY], reason=f"the scaler: {words}"):
        return ""
    _note(policy, words, now=now, changed=True)
    log.info("deployment #%s: %s", policy.deployment_id, words)
    return "down"


def _note(policy, words, *, now, changed=False):
    """Remember what the scaler last did or could not do (written only when it changes)."""
    fields = {}
    if changed:
        fields["changed_at"] = now
    if words[:500] != policy.last_decision:
        fields.update(last_decision=words[:500], last_decision_at=now)
    if fields:
        ScalePolicy.objects.filter(pk=policy.pk).update(**fields)
        for name, value in fields.items():
            setattr(policy, name, value)
