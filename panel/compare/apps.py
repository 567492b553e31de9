from django.apps import AppConfig


class CompareConfig(AppConfig):
    name = "panel.compare"
    label = "compare"
