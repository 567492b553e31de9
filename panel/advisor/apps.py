from django.apps import AppConfig


class AdvisorConfig(AppConfig):
    name = "panel.advisor"
    label = "advisor"
