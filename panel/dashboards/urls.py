from django.urls import path

from panel.dashboards import my_usage, requests, statement_views, views
from panel.hosts import views as hosts

urlpatterns = [
    path("dashboards/", views.overview, name="dashboards"),
    path("dashboards/latency/", views.latency, name="dashboards_latency"),
    path("dashboards/cache/", views.cache, name="dashboards_cache"),
    path("dashboards/cost/", views.cost, name="dashboards_cost"),
    path("dashboards/agents/", views.agents, name="dashboards_agents"),
    path("dashboards/data/", views.data, name="dashboards_data"),
    path("dashboards/requests/", requests.request_list, name="requests"),
    path("dashboards/requests/<str:request_id>/", requests.request_detail, name="request_detail"),
    path("dashboards/export.csv", views.export_csv, name="dashboards_csv"),
    path("dashboards/statements/", statement_views.statement_list, name="statements"),
    path("dashboards/statements/import/", statement_views.statement_upload, name="statement_upload"),
    path("dashboards/statements/<int:statement_id>/", statement_views.statement_detail, name="statement_detail"),
    path("dashboards/statements/imports/<int:import_id>/", statement_views.statement_import_detail,
         name="statement_import_detail"),
    path("metrics", views.metrics, name="metrics"),
    path("usage/mine/", my_usage.my_usage, name="my_usage"),
    path("usage/mine/data/", my_usage.my_usage_data, name="my_usage_data"),
    path("keys/<int:key_id>/", my_usage.key_detail, name="key_detail"),
    path("keys/<int:key_id>/data/", my_usage.key_detail_data, name="key_detail_data"),
    # The Cost dashboard's GPU prices live on the Workers page (the hosts app has no urls module of its own).
    path("workers/<int:host_id>/price/", hosts.host_price, name="host_price"),
]
