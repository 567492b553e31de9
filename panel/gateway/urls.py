from django.urls import path

from panel.gateway import views

urlpatterns = [
    path("keys/", views.key_list, name="keys"),
    path("keys/new/", views.key_create, name="key_create"),
    path("keys/<int:key_id>/revoke/", views.key_revoke_view, name="key_revoke"),
    path("keys/members/", views.member_keys_view, name="member_keys"),
]
