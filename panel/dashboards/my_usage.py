"""My usage: what every member, viewers included, may see of their own traffic — the keys they issued and the team's
routes they may call — with the Overview tab's charts, cards and tables; and a key's own page with its usage."""
import time

from django.http import JsonResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from panel.accounts.decorators import team_view
from panel.accounts.models import TeamKey
from panel.channels.models import Route
from panel.core.money import money
from panel.dashboards.pages import overview
from panel.dashboards.selectors import (
    RANGES,
    DashboardQuery,
    team_first_data,
    usage_grouped,
)
from panel.dashboards.tables import Table
from panel.dashboards.views import REFRESH_MS


def my_keys(*, team, user):
    return TeamKey.objects.filter(team=team, created_by=user)


def routes_for(*, team, user):
    """The team's enabled routes a member may call: all of them, or, when every key the member holds has a model
    allow-list, the routes those lists name."""
    routes = Route.objects.filter(team=team, enabled=True)
    lists = [key.allowed_models for key in my_keys(team=team, user=user).filter(revoked_at__isnull=True)]
    if lists and all(lists):
        routes = routes.filter(model_name__in={name for names in lists for name in names})
    return routes.order_by("model_name")


def my_usage_page(*, team, user, range_name, key=None):
    """The page's figures, cards and tables: the member's keys (or one key), and the routes they may use."""
    now = time.time()
    key_ids = frozenset([key.pk]) if key is not None else frozenset(
        my_keys(team=team, user=user).values_list("pk", flat=True))
    first = team_first_data(team)
    page = overview(DashboardQuery(team=team, range=range_name, now=now, key_ids=key_ids, first=first))
    page.tables = [table for table in page.tables if table.name != "keys" or key is None]
    if key is None:
        names = [route.model_name for route in routes_for(team=team, user=user)]
        query = DashboardQuery(team=team, range=range_name, now=now, models=frozenset(names), first=first)
        totals = {row["model"]: row for row in usage_grouped(query, by=("model",))}
        rows = [[name, totals.get(name, {}).get("requests", 0),
                 totals.get(name, {}).get("prompt_tokens", 0) + totals.get(name, {}).get("completion_tokens", 0),
                 money(totals.get(name, {}).get("cost", 0) or 0)] for name in names]
        page.tables.append(Table("routes", "Routes you may use (the whole team's traffic)",
                                 ["route", "requests", "tokens", "cost"], rows,
                                 note="Every request of the team to each route, through any key."))
    return page


def _range(request):
    value = request.GET.get("range") or "24h"
    return value if value in RANGES else "24h"


def _render(request, *, key=None):
    range_name = _range(request)
    page = my_usage_page(team=request.team, user=request.user, range_name=range_name, key=key)
    data_url = (f"{request.path}data/?" if key is None else f"{request.path}data/?") + urlencode({"range": range_name})
    keys = my_keys(team=request.team, user=request.user)
    return render(request, "dashboards/my_usage.html", {
        "page": page, "figures": page.figures, "key": key, "keys": keys, "ranges": RANGES, "range": range_name,
        "data_url": data_url, "refresh_ms": REFRESH_MS, "refresh_seconds": REFRESH_MS // 1000, "no_export": True,
        "routes": routes_for(team=request.team, user=request.user)})


def _data(request, *, key=None):
    page = my_usage_page(team=request.team, user=request.user, range_name=_range(request), key=key)
    return JsonResponse({
        "figures": page.figures,
        "tables": render_to_string("dashboards/_tables.html", {"page": page, "no_export": True}, request=request),
        "cards": render_to_string("dashboards/_cards.html", {"page": page}, request=request)})


@require_GET
@team_view("usage.view")
def my_usage(request):
    return _render(request)


@require_GET
@team_view("usage.view")
def my_usage_data(request):
    return _data(request)


@require_GET
@team_view("usage.view")
def key_detail(request, key_id):
    return _render(request, key=get_object_or_404(TeamKey, pk=key_id, team=request.team))


@require_GET
@team_view("usage.view")
def key_detail_data(request, key_id):
    return _data(request, key=get_object_or_404(TeamKey, pk=key_id, team=request.team))
