from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "panel.budgets"
    label = "budgets"
