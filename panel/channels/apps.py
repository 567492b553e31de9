from django.apps import AppConfig


class ChannelsConfig(AppConfig):
    name = "panel.channels"
    label = "channels"
    verbose_name = "Channels and routes"

    def ready(self):
        from django.core import checks

        from panel.core.crypto import encryption_keys_check

        checks.register(encryption_keys_check, "security")
