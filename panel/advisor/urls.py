from django.urls import path

from panel.advisor import views

urlpatterns = [
    path("advisor/", views.advisor, name="advisor"),
]
