from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "panel.hosts"
    label = "hosts"
