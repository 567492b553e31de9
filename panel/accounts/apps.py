from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "panel.accounts"
    label = "accounts"
