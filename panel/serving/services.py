"""Serving profiles and the deployments launched from them."""
import logging
import re
import secrets
import time
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections, transaction
from django.utils import timezone

from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Route
from panel.core import crypto
from panel.jobs.services import (
    job_cancel,
    job_cancelled,
    job_claim,
    job_created,
    job_enqueue,
    job_fail,
    job_heartbeat,
    job_transition,
)
from panel.registry import memory
from panel.registry.models import RegisteredModel
from panel.registry.services import serving_refusal
from panel.serving import adapters, configfile, drain, kv_events, placement, quota, rules, sleep, supervisor
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, DeploymentState, ScalePolicy, ServingProfile
from panel.serving.profile_fields import FIELDS, FIELDS_BY_NAME

log = logging.getLogger(__name__)


NOT_IN_A_SERVED_NAME = re.compile(r"[^A-Za-z0-9._:/-]+")  # what a client would have to quote in `model`


def profile_defaults(*, model, name=""):
    """The values a new profile for `model` starts from, keyed as the profile form takes them: what the model page's
    "Serve this model" fills the form with and what POST /api/v1/profiles/from-model/{id} saves. The profile and
    served model name come from the model's name (`name` overrides the profile's); dtype is auto (the checkpoint's
    own); quantization is what vLLM reads from the checkpoint ("compressed-tensors" for an llm-compressor child,
    "awq" for an AutoAWQ child, "none" for an unquantized model) with its bits; the length is the model's own, up
    to 8,192. ValidationError when the model cannot be served at all."""
    refusal = serving_refusal(model)
    if refusal:
        raise ValidationError(refusal)
    suggested = rules.suggest_values(model)
    if suggested["quantization"] not in FIELDS_BY_NAME["quantization"].choice_values:
        raise ValidationError(f"{model.name} is quantized as {suggested['quantization']!r}, a method vLLM cannot be "
                              "asked to serve from a profile.")
    served = NOT_IN_A_SERVED_NAME.sub("-", model.name).strip("-")[:200] or f"model-{model.pk}"
    return {"name": name or served[:100], "model": model.pk, "served_model_name": served, "dtype": "auto",
            "quantization": suggested["quantization"], "quantization_bits": suggested["quantization_bits"],
            "max_model_len": suggested["max_model_len"], "tool_call_parser": suggested["tool_call_parser"]}


def profile_name_free(*, team, name):
    """`name`, or `name-2`, `name-3`… : the first that no profile of the team has yet."""
    candidate, number = name, 1
    while ServingProfile.objects.filter(team=team, name=candidate).exists():
        number += 1
        suffix = f"-{number}"
        candidate = name[:100 - len(suffix)] + suffix
    return candidate


def profile_values(profile):
    """The profile as the plain dict that configfile and rules work on."""
    values = {field.name: getattr(profile, field.name) for field in FIELDS if hasattr(profile, field.name)}
    values["model_name"] = profile.model.hub_id or profile.model.path
    values["name"] = profile.name
    values["served_model_name"] = profile.served_name
    return values


def host_facts(host):
    """What the rules need to know about a worker host, or None for "no host chosen yet"."""
    if host is None:
        return None
    check = host.latest_engine_check()
    return {
        "kind": "gpu" if host.gpus else "cpu",
        "gpus": host.gpus,
        "memory_available_bytes": host.memory_available_bytes,
        "serves_awq": check.result.get("serves_awq") if check else None,
        "engine": check.result if check else {},
    }


def profile_check(profile, host=None):
    verdict = rules.check_profile(profile_values(profile), model=profile.model, host=host_facts(host),
                                  cpu_kv_cache_bytes=settings.CPU_KVCACHE_GIB * memory.GIB)
    try:  # a profile saved before one of its extra flags was refused cannot launch until it is edited
        configfile.validate_extra_args(profile.extra_args or "", model_path=profile.model.path,
                                       engine_flags=engine_flags(host))
    except configfile.ConfigFileError as error:
        for problem in error.problems:
            verdict.error("extra_args", f"{problem}: edit the profile")
    return verdict


def deployment_warnings(deployment):
    """What the rules warned about when this deployment was launched on its host (shown after the launch)."""
    warnings = list(profile_check(deployment.profile, deployment.host).warnings)
    if not deployment.attach_to_route and Route.objects.filter(team=deployment.team_id,
                                                               model_name=deployment.served_model_name).exists():
        warnings.append(f"The team already has a route for {deployment.served_model_name!r}: this deployment's "
                        "local channel will not join it (an admin can add it to the route, or launch with "
                        "\"Attach to the existing route\").")
    return warnings


# On a CPU host vLLM 0.32 starts faster this way (decision 0074, docs/benchmarks.md "An engine's start on a CPU
# host"): its ahead-of-time compiled-graph cache never loads there ("'function' object has no attribute
# 'finalize_loading'"), so every start compiled the model again, where the older cache loads; and one worker in the
# engine-core process (the "uni" executor, which the CPU platform allows only without V1 multiprocessing) spares a
# third process importing vLLM. 37 s to 21-26 s for the demo model, decoding as fast.
CPU_ENGINE_ENV = {"VLLM_USE_AOT_COMPILE": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_ONE_WORKER_ARGS = ["--distributed-executor-backend=uni"]


def engine_flags(host):
    """The option strings the host's vLLM knows, by its latest engine check, or None where no check listed them."""
    flags = ((host_facts(host) or {}).get("engine") or {}).get("engine_flags")
    return set(flags) if isinstance(flags, list) else None


def launch_argv(profile, *, port, sleep_mode=False, cpu_host=False, host=None):
    """The command the panel starts the profile's engine with: every path behind the engine's key; with vLLM's
    sleep mode when `sleep_mode` (serving/sleep.py); on a CPU host, one worker in the engine's own process when
    the profile needs one (before extra_args, which may say otherwise: the last flag wins)."""
    one_worker = cpu_host and profile.tensor_parallel_size * profile.pipeline_parallel_size == 1
    host_args = [*(CPU_ONE_WORKER_ARGS if one_worker else ()), *adapters.lora_argv(profile, cpu_host=cpu_host)]
    argv = configfile.launch_argv(profile_values(profile), model_path=profile.model.path, port=port,
                                  engine_python=settings.ENGINE_PYTHON,
                                  checkpoint_quantized=profile.model.is_quantized, host=settings.ENGINE_BIND,
                                  key_guard=True, host_args=host_args, engine_flags=engine_flags(host))
    return [*argv, "--enable-sleep-mode"] if sleep_mode else argv


def engine_sleeps(deployment):
    """Whether the deployment's engine falls asleep in vLLM's sleep mode rather than stopping: its profile sleeps
    when idle, on a GPU host whose engine check says the engine has the sleep mode."""
    if not deployment.profile.sleep_after_minutes or not (deployment.host and deployment.host.gpus):
        return False
    return (host_facts(deployment.host) or {}).get("engine", {}).get("sleep_mode") is True


def host_pick(profile):
    """The online GPU worker host where the profile fits with the most room, or ValidationError."""
    return placement.replicas_place(profile, 1, check=profile_check)[0]


def deployment_launch(*, team, user, profile, host=None, replicas=1, restart_on_crash=False, enqueue=True,
                      attach_to_route=False, max_replicas=None):
    """Check the profile against the hosts and queue its deployment: `replicas` engines, placed over the online
    GPU workers (all on `host` when given). Returns the first replica's row, which stands for the deployment.
    Replicas of a deployment of several are always restarted after a crash (the others serve meanwhile).
    `attach_to_route` (an admin's choice, checked by the caller): its local channels join the team's existing
    route of the same served name; without it that route is left as it is. `max_replicas` above `replicas`: it
    scales on queue between the two (serving/scaling.py; the policy's other values are its defaults).
    ValidationError, saving nothing, when the model cannot be served (it failed its check as a model), no host can
    run the profile, or `max_replicas` is under `replicas` or over the limit."""
    refusal = serving_refusal(profile.model)  # before any host: the model is the problem, wherever it would run
    if refusal:
        raise ValidationError(refusal)
    if max_replicas is not None and not replicas <= max_replicas <= placement.MAX_REPLICAS:
        raise ValidationError(f"Scale up to must be between the {replicas} replicas asked for and "
                              f"{placement.MAX_REPLICAS}.")
    if host is not None and not host.is_online:
        raise ValidationError(f"{host.name} is offline.")
    hosts = placement.replicas_place(profile, replicas, host=host, check=profile_check)
    verdicts = {placed.pk: profile_check(profile, placed) for placed in hosts}
    with transaction.atomic():
        quota.gpu_quota_check(team=team, profile=profile, hosts=hosts)
        head = None
        for index, placed in enumerate(hosts):
            deployment = Deployment.objects.create(
                team=team, created_by=user, profile=profile, host=placed, queue=f"gpu.{placed.host}",
                served_model_name=profile.served_name, restart_on_crash=restart_on_crash or replicas > 1,
                attach_to_route=bool(attach_to_route), replica_of=head, replica_index=index)
            head = head or deployment
            which = f"replica {index + 1} of {replicas}: " if replicas > 1 else ""
            job_created(deployment, actor=user, reason=f"{which}launch on {placed.host} requested"
                        + "".join(f". Warning: {warning}" for warning in verdicts[placed.pk].warnings))
            if enqueue:
                job_enqueue(deployment, "panel.serving.tasks.run_deployment")
        if max_replicas is not None and max_replicas > replicas:
            ScalePolicy.objects.create(deployment=head, min_replicas=replicas, max_replicas=max_replicas)
    return head


def deployment_stop(*, deployment, user=None, reason="stop requested"):
    """Ask for a deployment to stop, every replica of it. A pending one stops at once; a live one moves to
    stopping and its supervisor ends the engine's process group (SIGTERM, then SIGKILL) within a second.
    True when at least one replica was still running or queued."""
    stopped = False
    for replica in deployment.replicas():
        if job_cancel(replica, actor=user, reason=reason):
            stopped = True
        else:
            local_channel_sync(replica)  # already ending: a channel an earlier failed sync left enabled goes now
    return stopped


class DeploymentHooks:
    """The supervisor's view of the deployment row: the job lifecycle's heartbeat and moves."""

    def __init__(self, deployment):
        self.deployment = deployment
        self.sleep = sleep.SleepHooks(deployment)
        self.draining_since = None

    def started(self, pid):
        job_heartbeat(self.deployment, pid=pid)

    def ready(self, verification):
        """READY; `ready_at` is the first time only: a restart after a crash keeps it, since the deployment held its
        GPU all along and its GPU hours run from there (dashboards/cost.py)."""
        now = timezone.now()
        first = Deployment.objects.filter(pk=self.deployment.pk).values_list("ready_at", flat=True).first()
        adapters.adapters_reload(self.deployment)  # a restarted engine: what the last one loaded at run time
        job_transition(self.deployment, to=DeploymentState.READY, allowed_from=[DeploymentState.STARTING],
                       reason="GET /v1/models lists " + self.deployment.served_model_name, ready_at=first or now,
                       heartbeat_at=now, verification=verification)

    def beat(self, log_lines):
        self.sleep.after_beat(job_heartbeat(self.deployment, log_lines=log_lines))
        return self.stop_requested()

    def stop_requested(self):
        """Stop the engine: stopped, failed, or asleep or scaled down once drained (serving/drain.py)."""
        state = Deployment.objects.filter(pk=self.deployment.pk).values_list("state", flat=True).first()
        if state in (DeploymentState.ASLEEP, DeploymentState.WAKING):
            return self.sleep.stop_engine(state)
        if state == DeploymentState.DRAINING:
            if self.draining_since is None:
                self.draining_since = time.monotonic()
            return drain.drained(self.deployment, since=self.draining_since)
        return state not in (DeploymentState.STARTING, DeploymentState.READY)


def engine_env(deployment, host_is_gpu):
    """What the engine gets on top of the engine environment (`processes.engine_environment`)."""
    env = adapters.lora_env(deployment.profile)
    if host_is_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in deployment.gpu_indices)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.CPU_KVCACHE_GIB)
        env.update(CPU_ENGINE_ENV)
    return env


def gpus_for(deployment):
    """GPU indices on the deployment's host not held by its other live deployments."""
    needed = deployment.profile.tensor_parallel_size * deployment.profile.pipeline_parallel_size
    busy = set()
    for other in Deployment.objects.filter(host=deployment.host, state__in=list(ACTIVE_DEPLOYMENT_STATES)).exclude(
            pk=deployment.pk):
        busy.update(other.gpu_indices)
    free = [gpu["index"] for gpu in deployment.host.gpus if gpu["index"] not in busy]
    return free[:needed] if len(free) >= needed else None


def deployment_execute(*, deployment_id, worker):
    """Body of the deployment task: own the engine until it is stopped or dies for good."""
    deployment = Deployment.objects.select_related("profile__model", "host").get(pk=deployment_id)
    host_is_gpu = bool(deployment.host and deployment.host.gpus)
    if host_is_gpu:
        deployment.gpu_indices = gpus_for(deployment)
        if deployment.gpu_indices is None:
            job_fail(deployment, kind="no_free_gpu", reason="every GPU of this host is held by another deployment",
                     event="no free GPU")
            return False
    log_path = Path(settings.LOGS_DIR) / f"deployment-{deployment.pk}.log"
    hooks = DeploymentHooks(deployment)
    hooks.sleep.engine_sleeps = engine_sleeps(deployment)
    # vLLM serves /sleep and /wake_up only in its development mode; the key guard keeps them the panel's.
    sleep_env = {"VLLM_SERVER_DEV_MODE": "1"} if hooks.sleep.engine_sleeps else {}
    woken = False
    while True:
        port = deployment.profile.port or supervisor.free_port()
        argv = launch_argv(deployment.profile, port=port, sleep_mode=hooks.sleep.engine_sleeps,
                           cpu_host=not host_is_gpu, host=deployment.host)
        argv += kv_events.publisher_args(deployment, free_port=supervisor.free_port,
                                         engine_flags=engine_flags(deployment.host))
        base_url = f"http://{settings.ENGINE_ADVERTISE_HOST}:{port}/v1"
        engine_key = secrets.token_urlsafe(32)  # a new one each start; only the local channel learns it
        env = engine_env(deployment, host_is_gpu) | {"VLLM_API_KEY": engine_key} | sleep_env
        exposed = supervisor.exposure_problem(argv, env)
        if exposed:
            job_fail(deployment, kind="exposed_engine", reason=exposed, event="refused to start an open engine")
            return False
        claimed = job_claim(deployment, worker=worker,
                            allowed_from=[DeploymentState.WAKING] if woken else [DeploymentState.PENDING],
                            reason=f"started by {worker}" + (" after a wake" if woken else "")
                            + (f" (restart {deployment.restarts})" if deployment.restarts and not woken else ""),
                            port=port, base_url=base_url, command=argv, gpu_indices=deployment.gpu_indices or [],
                            verification={}, engine_key_ciphertext=crypto.encrypt(engine_key))
        if not claimed:
            if woken:  # stopped while waking: no engine to stop
                job_cancelled(deployment, reason="stopped while waking")
                return True
            log.info("deployment #%s is not pending; duplicate delivery or stopped before start", deployment.pk)
            return False
        woken = False
        profile = deployment.profile
        outcome = supervisor.run_server(
            argv, env=env, port=port, served_model_name=deployment.served_model_name,
            hooks=hooks, log_path=log_path, wanted_quantization=profile.quantization,
            wanted_prefix_caching=profile.enable_prefix_caching,
            grace_seconds=settings.DEPLOYMENT_STOP_GRACE_SECONDS)
        close_old_connections()
        state = Deployment.objects.filter(pk=deployment.pk).values_list("state", flat=True).first()
        if state in (DeploymentState.ASLEEP, DeploymentState.WAKING):  # stopped for sleep: start again when woken
            woken = sleep.wait_while_asleep(deployment)
            if woken:
                continue
            if job_cancelled(deployment, reason="stopped while asleep"):
                return True
            state = Deployment.objects.filter(pk=deployment.pk).values_list("state", flat=True).first()
        if state == DeploymentState.DRAINING:  # scaled down: drained, or it ended while draining
            job_transition(deployment, to=DeploymentState.STOPPED, allowed_from=[DeploymentState.DRAINING], pid=None,
                           reason="drained and stopped" if outcome.stopped else "ended while draining")
            return True
        if outcome.stopped or state == DeploymentState.STOPPING:
            job_cancelled(deployment, reason="engine stopped")
            return True
        kind, reason = supervisor.classify_crash(outcome)
        deployment.refresh_from_db(fields=["restart_on_crash", "max_restarts"])  # as stored now, not at the start
        if deployment.restart_on_crash and deployment.restarts < deployment.max_restarts and outcome.became_ready:
            deployment.restarts += 1
            # The first crash after a healthy run restarts at once (a replica is back within its start-up time);
            # a repeat backs off 2, 4, 8 s... (up to max_restarts: only engines that became ready restart at all).
            backoff = 0 if deployment.restarts == 1 else min(60, 2 ** (deployment.restarts - 1))
            if not job_transition(deployment, to=DeploymentState.PENDING,
                                  allowed_from=[DeploymentState.STARTING, DeploymentState.READY],
                                  reason=f"crashed ({kind}); restarting "
                                         + (f"in {backoff} s" if backoff else "now"), restarts=deployment.restarts,
                                  pid=None, failure_kind=kind, failure_reason=reason):
                return True
            if _sleep_unless_stopped(deployment, backoff):
                return True
            continue
        job_fail(deployment, kind=kind, reason=reason, event=f"engine exited: {kind}")
        return True


def _sleep_unless_stopped(deployment, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Deployment.objects.filter(pk=deployment.pk, state=DeploymentState.STOPPED).exists():
            return True
        time.sleep(0.5)
    return False


EXPORTS = {
    "toml": ("config.toml", "application/toml"),
    "sh": ("vllm_deploy.sh", "text/x-shellscript"),
    "yaml": ("vllm_config.yaml", "application/yaml"),
}


def profile_export_file(profile, kind):
    """(file name, content type, text) of a profile as config.toml, vllm_deploy.sh or vLLM's --config YAML;
    ValidationError when the profile's extra flags are refused (saved before they were)."""
    values = profile_values(profile)
    port = profile.port or 8000
    keywords = {"model_path": profile.model.path, "port": port, "checkpoint_quantized": profile.model.is_quantized}
    try:
        if kind == "toml":
            body = configfile.toml_export(values)
        elif kind == "sh":
            body = configfile.deploy_script(values, **keywords)
        else:
            body = configfile.yaml_export(values, **keywords)
    except configfile.ConfigFileError as error:
        raise ValidationError([f"{problem}: edit the profile" for problem in error.problems]) from None
    filename, content_type = EXPORTS[kind]
    return filename, content_type, body


@transaction.atomic
def profile_import(*, team, user, text, name):
    """Create a profile from config.toml text. Validates everything; saves nothing on error."""
    try:
        values = configfile.toml_import(text)
    except configfile.ConfigFileError as error:
        raise ValidationError(str(error)) from None
    model_name = values["model_name"]
    model = (RegisteredModel.objects.filter(team=team, hub_id=model_name).first()
             or RegisteredModel.objects.filter(team=team, name=model_name).first()
             or RegisteredModel.objects.filter(team=team, path=model_name).first())
    if model is None:
        raise ValidationError(f"[model].name {model_name!r} is not a registered model of this team: register it "
                              "first (Models → Register), by hub id or path.")
    if ServingProfile.objects.filter(team=team, name=name).exists():
        raise ValidationError(f"This team already has a profile named {name!r}.")
    fields = {field.name: values[field.name] for field in FIELDS
              if field.name in values and field.name not in ("model_name", "name")}
    fields = {key: value for key, value in fields.items() if value is not None or key in ("quantization_bits", "port")}
    profile = ServingProfile(team=team, created_by=user, name=name, model=model, **fields)
    try:  # extra_args against the allow-list, with the model's folder for a chat template file
        configfile.validate_extra_args(profile.extra_args or "", model_path=model.path)
    except configfile.ConfigFileError as error:
        raise ValidationError(error.problems) from None
    verdict = rules.check_profile(profile_values(profile), model=model)
    if not verdict.ok:
        raise ValidationError([message for messages in verdict.errors.values() for message in messages])
    profile.save()
    return profile
