"""Celery tasks of panel.dashboards: thin wrappers over its service functions."""
