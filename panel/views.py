"""The overview page: how the team is doing this month, its deployments, what is failing, and the order of work;
the error pages."""
import time

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render

from panel.accounts.decorators import team_view
from panel.advisor.services import problems_attention
from panel.core.sections import SECTIONS
from panel.dashboards.home import overview
from panel.hosts.models import WorkerHost


@team_view("team.view")
def home(request):
    hosts = list(WorkerHost.objects.all())
    summary = overview(team=request.team, now=time.time())
    summary.attention += problems_attention(team=request.team)
    context = {
        "sections": SECTIONS,
        "hosts_online": sum(1 for host in hosts if host.is_online),
        "hosts_total": len(hosts),
        "overview": summary,
    }
    return render(request, "core/home.html", context)



# --- error pages: the panel's own layout for pages, JSON for the API --------------------------------------------

ERRORS = {
    403: ("Not allowed", "Your role in this team cannot open this page; an admin of the team can change roles on "
                         "Members."),
    404: ("Not found", "There is nothing at this address. It may have been removed, or belong to another team."),
    500: ("Something went wrong", "The panel could not answer this request. The error is in the web server's log; "
                                  "try again in a moment."),
}


def error_page(request, status, reason=""):
    title, words = ERRORS[status]
    words = f"{reason} {words}" if reason else words
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"{title}: {words}"}, status=status)
    try:
        return render(request, "error.html", {"title": title, "words": words}, status=status)
    except Exception:  # the page itself needs the database, which may be what failed
        return HttpResponse(f"{title}. {words}", content_type="text/plain; charset=utf-8", status=status)


def permission_denied(request, exception=None):
    return error_page(request, 403, reason=str(exception or ""))  # the role rule's words: "This needs the ... role"


def page_not_found(request, exception=None):
    return error_page(request, 404)


def server_error(request):
    return error_page(request, 500)
