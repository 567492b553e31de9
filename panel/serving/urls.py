from django.urls import path

from panel.serving import adapter_views, views

urlpatterns = [
    path("serving/", views.serving_home, name="serving"),
    path("serving/profiles/new/", views.profile_create, name="profile_create"),
    path("serving/profiles/import/", views.profile_import_view, name="profile_import"),
    path("serving/profiles/<int:profile_id>/", views.profile_detail, name="profile_detail"),
    path("serving/profiles/<int:profile_id>/edit/", views.profile_edit, name="profile_edit"),
    path("serving/profiles/<int:profile_id>/export/<str:kind>/", views.profile_export, name="profile_export"),
    path("serving/profiles/<int:profile_id>/launch/", views.deployment_create, name="deployment_create"),
    path("serving/deployments/<int:deployment_id>/", views.deployment_detail, name="deployment_detail"),
    path("serving/deployments/<int:deployment_id>/live/", views.deployment_live, name="deployment_live"),
    path("serving/deployments/<int:deployment_id>/stop/", views.deployment_stop_view, name="deployment_stop"),
    path("serving/deployments/<int:deployment_id>/scale/", views.deployment_scale_view, name="deployment_scale"),
    path("serving/profiles/<int:profile_id>/lora/", adapter_views.profile_lora, name="profile_lora"),
    path("serving/deployments/<int:deployment_id>/adapters/load/", adapter_views.deployment_adapter_load,
         name="deployment_adapter_load"),
    path("serving/deployments/<int:deployment_id>/adapters/<int:adapter_id>/unload/",
         adapter_views.deployment_adapter_unload, name="deployment_adapter_unload"),
]
