from django.urls import path

from panel.registry import gguf_views, views

urlpatterns = [
    path("models/", views.model_list, name="models"),
    path("models/add/", views.model_create, name="model_create"),
    path("models/import-gguf/", gguf_views.gguf_import_create, name="gguf_import"),
    path("models/import-gguf/<int:job_id>/", gguf_views.gguf_import_detail, name="gguf_import_job"),
    path("models/import-gguf/<int:job_id>/live/", gguf_views.gguf_import_live, name="gguf_import_job_live"),
    path("models/import-gguf/<int:job_id>/cancel/", gguf_views.gguf_import_stop, name="gguf_import_cancel"),
    path("models/<int:model_id>/", views.model_detail, name="model_detail"),
    path("models/<int:model_id>/adapters/", views.adapter_create, name="adapter_create"),
    path("models/<int:model_id>/adapters/<int:adapter_id>/remove/", views.adapter_remove, name="adapter_delete"),
    path("models/<int:model_id>/check/", views.model_check_create, name="model_check_create"),
    path("models/<int:model_id>/check/live/", views.model_check_live, name="model_check_live"),
    path("models/<int:model_id>/quantize/", views.job_create, name="quantization_create"),
    path("models/<int:model_id>/evaluate/", views.evaluation_create, name="evaluation_create"),
    path("quality/<int:job_id>/", views.evaluation_detail, name="evaluation_job"),
    path("quality/<int:job_id>/live/", views.evaluation_live, name="evaluation_job_live"),
    path("quality/<int:job_id>/cancel/", views.evaluation_cancel, name="evaluation_cancel"),
    path("quantization/", views.job_list, name="quantization"),
    path("quantization/<int:job_id>/", views.job_detail, name="quantization_job"),
    path("quantization/<int:job_id>/live/", views.job_live, name="quantization_job_live"),
    path("quantization/<int:job_id>/cancel/", views.job_cancel, name="quantization_cancel"),
]
