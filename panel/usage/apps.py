from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "panel.usage"
    label = "usage"
    verbose_name = "Usage records"
