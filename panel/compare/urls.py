from django.urls import path

from panel.compare import views

urlpatterns = [
    path("compare/", views.compare, name="compare"),
    path("compare/send/", views.compare_send, name="compare_send"),
    path("compare/checks/json/", views.compare_json_check, name="compare_json_check"),
    path("compare/checks/prefix-cache/", views.compare_cache_check, name="compare_cache_check"),
    path("compare/<int:conversation_id>/", views.compare_conversation, name="compare_conversation"),
    path("compare/<int:conversation_id>/columns/<int:column>/stream/", views.compare_stream, name="compare_stream"),
    path("compare/<int:conversation_id>/share/", views.compare_share, name="compare_share"),
    path("compare/<int:conversation_id>/diff/", views.compare_diff, name="compare_diff"),
]
