"""Dashboard pages (one per tab), their JSON for live refresh, CSV export of every table, and the panel's own
Prometheus /metrics."""
import csv
import hmac
import os

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from panel.accounts.decorators import team_view
from panel.accounts.models import TeamKey
from panel.channels.models import listed_channels
from panel.core.csv_cells import csv_row
from panel.dashboards.pages import TABS, dashboard_page, team_has_data
from panel.dashboards.selectors import RANGES, BadQuery, dashboard_query_parse
from panel.gateway.metrics import registry
from panel.serving.models import Deployment

REFRESH_MS = 5000


def _filters(team):
    return {"channels": listed_channels(team).order_by("name"),
            "deployments": Deployment.objects.filter(team=team).select_related("profile").order_by("-created_at")[:50],
            "keys": TeamKey.objects.filter(team=team)}


def _bad(request, error, tab=None):
    if tab is None:
        return HttpResponse(f"Bad query: {error}\n", status=400, content_type="text/plain; charset=utf-8")
    return render(request, "dashboards/page.html", {"tab": tab, "tabs": TABS, "error": str(error),
                                                    "ranges": RANGES}, status=400)


def _page(request, tab):
    try:
        query = dashboard_query_parse(team=request.team, params=request.GET)
    except BadQuery as error:
        return _bad(request, error, tab)
    context = {"tab": tab, "tabs": TABS, "query": query, "ranges": RANGES, "params": urlencode(query.as_params()),
               "refresh_ms": REFRESH_MS, "refresh_seconds": REFRESH_MS // 1000, **_filters(request.team)}
    if tab != "agents" and not team_has_data(request.team):  # the Agents tab reads the usage records themselves
        context["empty"] = True
        return render(request, "dashboards/page.html", context)
    page = dashboard_page(tab=tab, query=query)
    context.update(page=page, figures=page.figures,
                   data_url=f"{reverse('dashboards_data')}?{urlencode({'tab': tab, **query.as_params()})}")
    return render(request, "dashboards/page.html", context)


@require_GET
@team_view("usage.view")
def overview(request):
    return _page(request, "overview")


@require_GET
@team_view("usage.view")
def latency(request):
    return _page(request, "latency")


@require_GET
@team_view("usage.view")
def cache(request):
    return _page(request, "cache")


@require_GET
@team_view("usage.view")
def cost(request):
    return _page(request, "cost")


@require_GET
@team_view("usage.view")
def agents(request):
    return _page(request, "agents")


def _tab(request):
    tab = request.GET.get("tab", "")
    if tab not in TABS:
        raise BadQuery(f"tab must be one of {', '.join(TABS)}, not {tab!r}")
    return tab


@require_GET
@team_view("usage.view")
def data(request):
    """The tab's figures, tables (as HTML) and cards as JSON, for live refresh without a page reload."""
    try:
        tab = _tab(request)
        query = dashboard_query_parse(team=request.team, params=request.GET)
    except BadQuery as error:
        return JsonResponse({"error": str(error)}, status=400)
    page = dashboard_page(tab=tab, query=query)
    params = urlencode({"tab": tab, **query.as_params()})
    return JsonResponse({
        "figures": page.figures,
        "tables": render_to_string("dashboards/_tables.html", {"page": page, "params": params}, request=request),
        "cards": render_to_string("dashboards/_cards.html", {"page": page}, request=request),
    })


@require_GET
@team_view("usage.view")
def export_csv(request):
    """One table of one tab as CSV, with the same query as the page."""
    try:
        tab = _tab(request)
        query = dashboard_query_parse(team=request.team, params=request.GET)
        page = dashboard_page(tab=tab, query=query)
        name = request.GET.get("table", "")
        table = page.table(name)
        if table is None:
            raise BadQuery(f"the {tab} tab has no table {name!r}: it has {', '.join(t.name for t in page.tables)}")
    except BadQuery as error:
        return _bad(request, error)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tokenwise-{tab}-{table.name}-{query.range}.csv"'
    writer = csv.writer(response)
    writer.writerow(csv_row(table.columns))
    for row in table.csv_rows:
        writer.writerow(csv_row(row))
    return response


@require_GET
def metrics(request):
    """The panel's Prometheus metrics. Not a team view: Prometheus has no session. It needs `Authorization: Bearer
    <TOKENWISE_METRICS_TOKEN>`, unless the operator set TOKENWISE_METRICS_PUBLIC=1. A loopback bind proves nothing:
    a proxy on the same host makes every outside request come from loopback."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    token = settings.METRICS_TOKEN
    if not token and not settings.METRICS_PUBLIC:
        return HttpResponse("set TOKENWISE_METRICS_TOKEN and scrape with 'Authorization: Bearer <token>' (make run "
                            "keeps one in data/secrets/metrics_token), or TOKENWISE_METRICS_PUBLIC=1 to serve "
                            "/metrics to anyone who reaches the panel\n", status=403, content_type="text/plain")
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return HttpResponse("a bearer token is needed (TOKENWISE_METRICS_TOKEN)\n", status=401,
                                content_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)


def metrics_registry():
    """The counters of this process or, when the web server runs several (panel/web.py), of all of them."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return registry
    from prometheus_client import CollectorRegistry, multiprocess

    every_process = CollectorRegistry()
    multiprocess.MultiProcessCollector(every_process)
    return every_process
