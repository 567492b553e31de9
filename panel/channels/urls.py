from django.urls import path

from panel.channels import views

urlpatterns = [
    path("channels/", views.channel_list, name="channels"),
    path("channels/new/", views.channel_create_view, name="channel_create"),
    path("channels/import/", views.settings_import_view, name="settings_import"),
    path("channels/export/", views.settings_export_view, name="settings_export"),
    path("channels/<int:channel_id>/", views.channel_detail, name="channel_detail"),
    path("channels/<int:channel_id>/edit/", views.channel_edit, name="channel_edit"),
    path("channels/<int:channel_id>/test/", views.channel_test_view, name="channel_test"),
    path("channels/<int:channel_id>/delete/", views.channel_delete_view, name="channel_delete"),
    path("channels/routes/new/", views.route_create, name="route_create"),
    path("channels/routes/<int:route_id>/edit/", views.route_edit, name="route_edit"),
    path("channels/routes/<int:route_id>/delete/", views.route_delete_view, name="route_delete"),
    path("channels/routes/<int:route_id>/", views.route_detail, name="route_detail"),
    path("channels/routes/<int:route_id>/canary/start/", views.canary_start_view, name="canary_start"),
    path("channels/routes/<int:route_id>/canary/promote/", views.canary_promote_view, name="canary_promote"),
    path("channels/routes/<int:route_id>/canary/stop/", views.canary_stop_view, name="canary_stop"),
    path("channels/routes/<int:route_id>/shadow/start/", views.shadow_start_view, name="shadow_start"),
    path("channels/routes/<int:route_id>/shadow/stop/", views.shadow_stop_view, name="shadow_stop"),
    path("channels/routes/<int:route_id>/rules/new/", views.rule_create_view, name="rule_create"),
    path("channels/routes/<int:route_id>/rules/<int:rule_id>/edit/", views.rule_edit_view, name="rule_edit"),
    path("channels/routes/<int:route_id>/rules/<int:rule_id>/move/", views.rule_move_view, name="rule_move"),
    path("channels/routes/<int:route_id>/rules/<int:rule_id>/delete/", views.rule_delete_view, name="rule_delete"),
]
