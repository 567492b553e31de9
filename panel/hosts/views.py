from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.hosts.forms import GpuPriceForm
from panel.hosts.models import EngineCheck, WorkerHost
from panel.hosts.services import engine_check_launch, host_price_set
from panel.jobs.services import job_events


def _hosts_context(request):
    hosts = list(WorkerHost.objects.all())
    for host in hosts:
        host.engine = host.latest_engine_check()
    return {"hosts": hosts, "online": sum(1 for host in hosts if host.is_online)}


@team_view("hosts.view")
def host_list(request):
    return render(request, "hosts/list.html", _hosts_context(request))


@team_view("hosts.view")
def host_list_live(request):
    return render(request, "hosts/_table.html", _hosts_context(request))


@require_POST
@team_view("hosts.check")
def engine_check_create(request, host_id):
    host = get_object_or_404(WorkerHost, pk=host_id, kind="gpu")
    if not host.is_online:
        messages.error(request, f"{host.name} is offline: start its worker first, then run the check.")
        return redirect("hosts")
    check = engine_check_launch(team=request.team, user=request.user, host=host)
    audit_record(action=AuditAction.JOB_LAUNCHED, request=request, target=f"engine check #{check.pk} on {host.host}")
    return redirect("engine_check", check_id=check.pk)


@require_POST
@team_view("hosts.price")
def host_price(request, host_id):
    """The GPU price of a host (the Cost dashboard's local cost). Hosts are the installation's, and their price
    counts in every team's costs: only a superuser sets it, and each change is audited."""
    host = get_object_or_404(WorkerHost, pk=host_id)
    if not request.user.is_superuser:
        audit_record(action=AuditAction.REFUSED, request=request, target=request.path[:300], needed="superuser")
        raise PermissionDenied("GPU prices are the installation's: only a superuser sets them.")
    before = (host.gpu_price_per_hour, host.gpu_count)
    form = GpuPriceForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{form.fields[name].label}: {' '.join(errors)}" for name, errors in form.errors.items())
        messages.error(request, f"The price of {host.host} was not changed. {problems}")
        return redirect("hosts")
    host_price_set(host=host, **form.cleaned_data)
    price = form.cleaned_data["gpu_price_per_hour"]
    audit_record(action=AuditAction.SETTING_CHANGED, request=request, target=f"GPU price of {host.host}",
                 price=f"{before[0]} → {price}", gpus=f"{before[1]} → {form.cleaned_data['gpu_count']}")
    messages.success(request, f"{host.host}: {'no GPU price' if price is None else f'{price} per GPU-hour'}.")
    return redirect("hosts")


@team_view("hosts.view")
def engine_check_detail(request, check_id):
    check = get_object_or_404(EngineCheck.objects.select_related("host"), pk=check_id, team=request.team)
    return render(request, "hosts/check.html", {"job": check, "events": job_events(check),
                                                "log_url": reverse("engine_check_log", args=[check.pk])})


@team_view("hosts.view")
def engine_check_live(request, check_id):
    check = get_object_or_404(EngineCheck.objects.select_related("host"), pk=check_id, team=request.team)
    return render(request, "hosts/_check_live.html", {"job": check, "events": job_events(check),
                                                      "log_url": reverse("engine_check_log", args=[check.pk])})


@team_view("hosts.view")
def engine_check_log(request, check_id):
    """The engine check's whole log as text, banners and all."""
    check = get_object_or_404(EngineCheck, pk=check_id, team=request.team)
    response = HttpResponse(check.log_tail, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="engine-check-{check.pk}.log"'
    return response
