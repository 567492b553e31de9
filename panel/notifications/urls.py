from django.urls import path

from panel.notifications import views

urlpatterns = [
    path("webhooks/", views.webhook_list, name="webhooks"),
    path("webhooks/new/", views.webhook_create_view, name="webhook_create"),
    path("webhooks/<int:webhook_id>/edit/", views.webhook_edit_view, name="webhook_edit"),
    path("webhooks/<int:webhook_id>/secret/", views.webhook_secret_view, name="webhook_secret"),
    path("webhooks/<int:webhook_id>/test/", views.webhook_test_view, name="webhook_test"),
    path("webhooks/<int:webhook_id>/delete/", views.webhook_delete_view, name="webhook_delete"),
]
