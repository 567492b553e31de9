from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from panel.accounts import account_views, audit_views
from panel.accounts import views as accounts
from panel.hosts import views as hosts
from panel.views import home

urlpatterns = [
    path("", home, name="home"),
    path("login/", accounts.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("teams/switch/", accounts.switch_team, name="switch_team"),
    path("teams/none/", accounts.no_team, name="no_team"),
    path("members/", accounts.member_list, name="members"),
    path("members/invite/", accounts.member_invite_view, name="member_invite"),
    path("members/gpu-quota/", accounts.team_gpu_quota_view, name="team_gpu_quota"),
    path("members/trace-prompts/", accounts.team_trace_prompts_view, name="team_trace_prompts"),
    path("invitations/<int:invitation_id>/accept/", accounts.invitation_accept_view, name="invitation_accept"),
    path("members/<int:membership_id>/role/", accounts.member_role_view, name="member_role"),
    path("members/<int:membership_id>/remove/", accounts.member_remove_view, name="member_remove"),
    path("members/<int:membership_id>/link/", accounts.member_link_view, name="member_link"),
    path("welcome/<str:uidb64>/<str:token>/", accounts.account_setup, name="account_setup"),
    path("account/", account_views.account, name="account"),
    path("account/password/", account_views.password_change, name="password_change"),
    path("account/tokens/new/", account_views.token_create, name="token_create"),
    path("account/tokens/<int:token_id>/revoke/", account_views.token_revoke_view, name="token_revoke"),
    path("audit/", audit_views.audit_list, name="audit"),
    path("audit/export.csv", audit_views.audit_csv, name="audit_csv"),
    path("workers/", hosts.host_list, name="hosts"),
    path("workers/live/", hosts.host_list_live, name="hosts_live"),
    path("workers/<int:host_id>/check/", hosts.engine_check_create, name="engine_check_create"),
    path("workers/checks/<int:check_id>/", hosts.engine_check_detail, name="engine_check"),
    path("workers/checks/<int:check_id>/live/", hosts.engine_check_live, name="engine_check_live"),
    path("workers/checks/<int:check_id>/log.txt", hosts.engine_check_log, name="engine_check_log"),
    path("admin/", admin.site.urls),
    path("", include("panel.registry.urls")),
    path("", include("panel.serving.urls")),
    path("", include("panel.channels.urls")),
    path("", include("panel.gateway.urls")),
    path("", include("panel.budgets.urls")),
    path("", include("panel.dashboards.urls")),
    path("", include("panel.compare.urls")),
    path("", include("panel.evaluations.urls")),
    path("", include("panel.benchmarks.urls")),
    path("", include("panel.advisor.urls")),
    path("", include("panel.notifications.urls")),
    path("api/v1/", include("panel.api.urls")),
    path("", include("panel.sso.urls")),
]


handler400 = "panel.core.request_size.bad_request"  # too-large forms and uploads: 413 with the limit in words
handler403 = "panel.views.permission_denied"  # the panel's own layout; JSON on /api/ paths
handler404 = "panel.views.page_not_found"
handler500 = "panel.views.server_error"
