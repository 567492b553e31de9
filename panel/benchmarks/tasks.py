"""Celery tasks of panel.benchmarks: thin wrappers over its service functions."""
