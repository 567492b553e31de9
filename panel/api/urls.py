"""The management API, version 1: one router per resource, each a thin layer over its app's services and the
pages' own forms and role rules. The schema is at openapi.json and the reference at docs (Swagger UI served from
the django-ninja package: no CDN), both for a signed-in member or a personal access token (auth.reference_gate)."""
from django.http import JsonResponse
from django.urls import path, re_path
from ninja import NinjaAPI

from panel.api import (
    adapters,
    advisor,
    audit,
    autopilot,
    benchmarks,
    budgets,
    channels,
    errors,
    evaluations,
    gguf,
    hosts,
    keys,
    ladders,
    registry,
    routes,
    serving,
    shadows,
    team,
    tokens,
    usage,
    webhooks,
)
from panel.api.auth import Ungated, reference_gate


class ManagementAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation):
        return operation.view_func.__name__  # keys_issue, channels_change …: short, stable, unique (tested)


api = ManagementAPI(title="Tokenwise management API", version="1", auth=Ungated(), urls_namespace="api-v1",
               description="Everything the pages do, for scripts: authenticate with a personal access token from "
                           "Your account (`Authorization: Bearer twp-…`), or with the panel's session and the "
                           "X-CSRFToken header. Every operation needs the role its page needs; another team's object "
                           "is a 404. Refusals are {\"detail\", \"errors\"} with 400 (nothing saved), 401, 403 or 404.",
               openapi_url="/openapi.json", docs_url="/docs", docs_decorator=reference_gate)
errors.install(api)
# Each operation names its action in its decorator (`auth=gate(...)`, panel/accounts/roles.py) or its router's.
ROUTERS = [module.router for module in (team, tokens, keys, channels, routes, shadows, registry, gguf, adapters,
                                        serving, benchmarks, ladders, hosts, budgets, usage, audit, webhooks, advisor,
                                        evaluations, autopilot)]
for router in ROUTERS:
    api.add_router("", router)


def unknown_path(request, rest):
    """Any other path under /api/v1/ is the API's own 404 in its own shape, not the pages' HTML."""
    return JsonResponse({"detail": f"No API operation at /api/v1/{rest}: the reference is at /api/v1/docs."},
                        status=404)


def api_root(request):
    return JsonResponse({"name": api.title, "version": api.version, "reference": "/api/v1/docs",
                         "schema": "/api/v1/openapi.json"})


urlpatterns = [path("", api_root), path("", api.urls), re_path(r"^(?P<rest>.*)$", unknown_path)]
