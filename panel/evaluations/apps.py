from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "panel.evaluations"
    label = "evaluations"

    def ready(self):
        from panel.evaluations import canary_guard  # noqa: F401  (connects the autopilot's guard on canaries)
