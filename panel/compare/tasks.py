"""Celery tasks of panel.compare: thin wrappers over its service functions."""
