from django.urls import path

from panel.sso import views

urlpatterns = [
    path("sso/sign-in/", views.sign_in, name="sso_sign_in"),
    path("sso/callback/", views.callback, name="sso_callback"),
    path("sso/refused/", views.refused, name="sso_refused"),
]
