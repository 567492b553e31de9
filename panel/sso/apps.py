from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "panel.sso"
    label = "sso"
    verbose_name = "Single sign-on"
