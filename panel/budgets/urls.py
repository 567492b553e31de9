from django.urls import path

from panel.budgets import views

urlpatterns = [
    path("budgets/", views.budget_list, name="budgets"),
    path("budgets/edit/", views.budget_edit, name="budget_edit"),
]
