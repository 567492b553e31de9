from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "panel.evaluations"
    label = "evaluations"
