"""Celery tasks of panel.advisor: thin wrappers over its service functions."""
