from django.urls import path

from panel.evaluations import autopilot_views, sample_views, views

urlpatterns = [
    path("evaluations/", views.evaluations, name="evaluations"),
    path("evaluations/new/", views.eval_set_new, name="eval_set_new"),
    path("evaluations/starter/", views.eval_set_starter, name="eval_set_starter"),
    path("evaluations/<int:set_id>/", views.eval_set_detail, name="eval_set_detail"),
    path("evaluations/<int:set_id>/revise/", views.eval_set_revise_view, name="eval_set_revise"),
    path("evaluations/<int:set_id>/delete/", views.eval_set_delete_view, name="eval_set_delete"),
    path("evaluations/<int:set_id>/run/", views.eval_run_start, name="eval_run_start"),
    path("evaluations/runs/<int:run_id>/", views.eval_run_detail, name="eval_run_detail"),
    path("evaluations/runs/<int:run_id>/live/", views.eval_run_live, name="eval_run_live"),
    path("evaluations/<int:set_id>/versions/<int:number>.jsonl", views.eval_set_download, name="eval_set_download"),
    path("evaluations/samples/<int:route_id>/", sample_views.route_samples, name="route_samples"),
    path("evaluations/samples/<int:route_id>/settings/", sample_views.route_samples_settings,
         name="route_samples_settings"),
    path("evaluations/samples/<int:route_id>/set/", sample_views.route_samples_to_set, name="route_samples_to_set"),
    path("evaluations/samples/<int:route_id>/delete/", sample_views.route_samples_delete_view,
         name="route_samples_delete"),
    path("evaluations/autopilot/<int:route_id>/", autopilot_views.route_autopilot, name="route_autopilot"),
    path("evaluations/autopilot/<int:route_id>/settings/", autopilot_views.route_autopilot_settings,
         name="route_autopilot_settings"),
    path("evaluations/autopilot/<int:route_id>/review/", autopilot_views.route_autopilot_review,
         name="route_autopilot_review"),
    path("evaluations/autopilot/<int:route_id>/candidates.csv", autopilot_views.route_autopilot_csv,
         name="route_autopilot_csv"),
]
