from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "panel.notifications"
    label = "notifications"
    verbose_name = "Notifications and webhooks"
