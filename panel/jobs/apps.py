from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "panel.jobs"
    label = "jobs"
