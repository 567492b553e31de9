from django.urls import path

from panel.benchmarks import views

urlpatterns = [
    path("benchmarks/", views.home, name="benchmarks"),
    path("benchmarks/runs/new/", views.run_create, name="benchmark_create"),
    path("benchmarks/runs/<int:run_id>/", views.run_detail, name="benchmark_run"),
    path("benchmarks/runs/<int:run_id>/live/", views.run_live, name="benchmark_run_live"),
    path("benchmarks/runs/<int:run_id>/vllm-result.json", views.run_export, name="benchmark_run_export"),
    path("benchmarks/import/", views.run_import, name="benchmark_import"),
    path("benchmarks/compare/", views.compare, name="benchmark_compare"),
    path("benchmarks/ladders/new/", views.ladder_create, name="benchmark_ladder_create"),
    path("benchmarks/ladders/<int:ladder_id>/", views.ladder_detail, name="benchmark_ladder"),
    path("benchmarks/ladders/<int:ladder_id>/live/", views.ladder_live, name="benchmark_ladder_live"),
    path("benchmarks/sweeps/new/", views.sweep_create, name="benchmark_sweep_create"),
    path("benchmarks/sweeps/<int:sweep_id>/", views.sweep_detail, name="benchmark_sweep"),
    path("benchmarks/sweeps/<int:sweep_id>/live/", views.sweep_live, name="benchmark_sweep_live"),
    path("benchmarks/<str:kind>/<int:job_id>/cancel/", views.job_cancel_view, name="benchmark_cancel"),
    path("benchmarks/<str:kind>/<int:job_id>/remove/", views.job_remove_view, name="benchmark_remove"),
]
