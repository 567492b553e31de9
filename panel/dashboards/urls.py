from django.urls import path

from panel.dashboards import views

urlpatterns = [
    path("dashboards/", views.overview, name="dashboards"),
    path("dashboards/latency/", views.latency, name="dashboards_latency"),
    path("dashboards/cache/", views.cache, name="dashboards_cache"),
    path("dashboards/cost/", views.cost, name="dashboards_cost"),
    path("dashboards/data/", views.data, name="dashboards_data"),
    path("dashboards/export.csv", views.export_csv, name="dashboards_csv"),
    path("metrics", views.metrics, name="metrics"),
]
