from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "panel.serving"
    label = "serving"
    verbose_name = "Serving profiles and deployments"
