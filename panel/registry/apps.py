from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "panel.registry"
    label = "registry"
    verbose_name = "Models and quantization"
