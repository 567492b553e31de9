"""The overview page: what the panel is made of, and whether its workers are up."""
from django.shortcuts import render

from panel.accounts.decorators import team_view
from panel.core.sections import SECTIONS
from panel.hosts.models import WorkerHost


@team_view("team.view")
def home(request):
    hosts = list(WorkerHost.objects.all())
    context = {
        "sections": SECTIONS,
        "hosts_online": sum(1 for host in hosts if host.is_online),
        "hosts_total": len(hosts),
    }
    return render(request, "core/home.html", context)

