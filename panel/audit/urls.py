from django.urls import path

from panel.audit import views

urlpatterns = [
    path("audit/", views.audit_list, name="audit"),
    path("audit/export.csv", views.audit_csv, name="audit_csv"),
]
