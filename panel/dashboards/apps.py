from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    name = "panel.dashboards"
    label = "dashboards"
