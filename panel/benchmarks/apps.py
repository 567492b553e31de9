from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "panel.benchmarks"
    label = "benchmarks"
