from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "panel.api"
    label = "api"
    verbose_name = "Management API"
