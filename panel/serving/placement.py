"""Where a deployment's replicas run: over the online GPU worker hosts that can hold the profile, one or several
per host, spread over as many hosts as have room.

Room on a GPU host is its GPUs not held by an active deployment, in groups of tensor × pipeline parallel; on a CPU
host it is its available memory in pieces of one engine (the weights plus the CPU engine's KV cache space), less
the replicas already queued or starting there (they have not taken their memory yet). Replicas go to the hosts
with the fewest of them first, so they stack on one host only when the others have no room."""
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError

from panel.hosts.models import WorkerHost
from panel.registry import memory
from panel.serving import rules
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment, DeploymentState

MAX_REPLICAS = 16


@dataclass
class Room:
    host: WorkerHost
    replicas: int  # how many more replicas of the profile fit
    free_bytes: int  # for ties: the host with more free memory first


def host_room(profile, host, verdict):
    """How many replicas of the profile this host can take now (0 with a verdict that says no)."""
    if not verdict.ok:
        return 0
    active = Deployment.objects.filter(host=host, state__in=list(ACTIVE_DEPLOYMENT_STATES))
    if host.gpus:
        held = 0  # GPUs of engines running here, and of those queued here that take theirs when they start
        for indices, tensor, pipeline in active.values_list("gpu_indices", "profile__tensor_parallel_size",
                                                            "profile__pipeline_parallel_size"):
            held += len(indices) if indices else tensor * pipeline
        devices = profile.tensor_parallel_size * profile.pipeline_parallel_size
        return max(0, len(host.gpus) - held) // devices
    values = {"quantization": profile.quantization, "quantization_bits": profile.quantization_bits}
    engine = rules.weight_bytes(values, profile.model) + settings.CPU_KVCACHE_GIB * memory.GIB
    waiting = active.filter(state__in=[DeploymentState.PENDING, DeploymentState.STARTING]).count()
    # The verdict found room for one engine in what is free now; the count only matters for more than one.
    return max(1, (host.memory_available_bytes or 0) // max(engine, 1) - waiting)


def replicas_place(profile, count, *, host=None, check, beside=()):
    """The host of each of `count` replicas, or ValidationError saying what the online workers have room for.
    `check(profile, host)` is the profile's verdict on a host (the serving rules); `beside`: the hosts of the
    deployment's replicas already running (a replica the scaler adds goes where fewest of them are)."""
    if not 1 <= count <= MAX_REPLICAS:
        raise ValidationError(f"Replicas must be between 1 and {MAX_REPLICAS}.")
    if host is not None:
        candidates = [host]
    else:
        candidates = [candidate for candidate in WorkerHost.objects.filter(kind="gpu").order_by("host")
                      if candidate.is_online]
        if not candidates:
            raise ValidationError("No GPU worker is online: start one (make run, or python -m workers.start gpu).")
    rooms, reasons = [], []
    for candidate in candidates:
        verdict = check(profile, candidate)
        if not verdict.ok:
            reasons.append(f"{candidate.host}: " + "; ".join(message for messages in verdict.errors.values()
                                                              for message in messages))
        free = sum(gpu.get("memory_free_bytes", 0) for gpu in candidate.gpus) or candidate.memory_available_bytes
        rooms.append(Room(candidate, host_room(profile, candidate, verdict), free or 0))
    if len(reasons) == len(rooms):
        raise ValidationError(("This worker cannot run this profile. " if host else
                               "No online worker can run this profile. ") + " ".join(reasons))
    if sum(room.replicas for room in rooms) < count:
        raise ValidationError(_no_room(count, rooms))
    placed, on_host = [], {room.host.pk: 0 for room in rooms}
    for other in beside:
        if other is not None and other.pk in on_host:
            on_host[other.pk] += 1
    for _ in range(count):
        # Spread first (the host with the fewest of these replicas), then the most room: two hosts whose free
        # memory differs by a little still get one replica each.
        best = max((room for room in rooms if room.replicas),
                   key=lambda room: (-on_host[room.host.pk], room.replicas, room.free_bytes))
        best.replicas -= 1
        on_host[best.host.pk] += 1
        placed.append(best.host)
    return placed


def _no_room(count, rooms):
    room = ", ".join(f"{room.host.host}: {room.replicas}" for room in rooms)
    asked = f"{count} replica{'s' if count != 1 else ''} asked for"
    return (f"{asked}, but the workers have room for {sum(r.replicas for r in rooms)} now "
            f"(per host: {room}). Free GPUs or memory, start another GPU worker, or ask for fewer.")
