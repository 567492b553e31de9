"""Celery tasks of panel.budgets: thin wrappers over its service functions."""
from celery import shared_task

from panel.budgets.services import budgets_reconcile


@shared_task(ignore_result=True)
def reconcile_budgets():
    return len(budgets_reconcile())
