from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "panel.audit"
    label = "audit"

    def ready(self):
        from panel.audit import signals  # noqa: F401  (sign-in success and failure)
