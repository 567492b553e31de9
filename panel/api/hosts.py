"""Workers (as on the Workers page): the installation's worker hosts with their GPUs, GPU price and latest engine
check, and engine checks (run one on a GPU host, follow it, read what its engine can serve)."""
import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, validated
from panel.api.schemas import JobEventOut, JobOut, Money, job_events_out
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.hosts.forms import GpuPriceForm
from panel.hosts.models import EngineCheck, WorkerHost
from panel.hosts.services import engine_check_launch, host_price_set
from panel.jobs.services import job_events

router = Router(tags=["workers"])


class EngineCheckOut(JobOut):
    host_id: int
    result: dict[str, Any] = Field(description="Versions, CPU extensions, CUDA devices and the kernels this host's "
                                               "engine can serve, once the check has finished.")


class EngineCheckDetail(EngineCheckOut):
    log_tail: str
    events: list[JobEventOut]


class HostOut(Schema):
    id: int
    name: str
    host: str
    kind: str
    queues: list[str]
    online: bool
    cpu_count: int
    memory_bytes: int
    memory_available_bytes: int
    gpus: list[dict[str, Any]]
    gpu_price_per_hour: Money | None
    gpu_count: int | None
    last_seen: datetime.datetime | None
    engine_check: EngineCheckOut | None = Field(description="The latest engine check that finished.")


def check_out(check, *, detail=False):
    out = {name: getattr(check, name) for name in EngineCheckOut.model_fields}
    if detail:
        out.update(log_tail=check.log_tail, events=job_events_out(job_events(check)))
    return out


def host_out(host):
    check = host.latest_engine_check()
    return {**{name: getattr(host, name) for name in HostOut.model_fields if name not in ("online", "engine_check")},
            "online": host.is_online, "engine_check": check_out(check) if check is not None else None}


@router.get("/hosts", auth=gate("hosts.view"), response=errors({200: list[HostOut]}))
def hosts_list(request):
    return [host_out(host) for host in WorkerHost.objects.order_by("kind", "host", "name")]


GpuPriceIn = schema_from_form(GpuPriceForm, "GpuPriceIn")


@router.put("/hosts/{host_id}/gpu-price", auth=gate("hosts.price"), response=errors({200: HostOut}),
            summary="Set a host's GPU price per hour and GPU count (superusers only: it counts in every team's costs)")
def hosts_price_set(request, host_id: int, body: GpuPriceIn):
    """As the Workers page's price form: hosts are the installation's, so only a superuser sets their price (any
    other caller gets 403, and the refusal is audited); both fields empty clears the price. Each change is audited
    with its before and after."""
    host = get_object_or_404(WorkerHost, pk=host_id)
    if not request.user.is_superuser:
        audit_record(action=AuditAction.REFUSED, request=request, target=request.path[:300], needed="superuser")
        raise PermissionDenied("GPU prices are the installation's: only a superuser sets them.")
    data = validated(GpuPriceForm, body).cleaned_data
    before = (host.gpu_price_per_hour, host.gpu_count)
    host_price_set(host=host, **data)
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target=f"GPU price of {host.host}",
                 price=f"{before[0]} → {data['gpu_price_per_hour']}", gpus=f"{before[1]} → {data['gpu_count']}")
    return host_out(host)


@router.post("/hosts/{host_id}/engine-checks", auth=gate("hosts.check"), response=errors({201: EngineCheckOut}),
             summary="Check what the engine on a GPU host can serve (versions, CPU extensions, CUDA, kernels)")
def engine_checks_start(request, host_id: int):
    host = get_object_or_404(WorkerHost, pk=host_id, kind="gpu")
    if not host.is_online:
        raise Invalid({"__all__": [f"{host.name} is offline: start its worker first, then run the check."]})
    check = engine_check_launch(team=request.team, user=request.user, host=host)
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"engine check #{check.pk} on {host.host}")
    return Status(201, check_out(check))


@router.get("/engine-checks/{check_id}", auth=gate("hosts.view"), response=errors({200: EngineCheckDetail}))
def engine_checks_get(request, check_id: int):
    return check_out(get_object_or_404(EngineCheck.objects.filter(team=request.team), pk=check_id), detail=True)
