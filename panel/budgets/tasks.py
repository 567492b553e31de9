"""Celery tasks of panel.budgets: thin wrappers over its service functions."""
