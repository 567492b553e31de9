from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from panel.accounts.services import team_switch


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True


@require_POST
@login_required
def switch_team(request):
    try:
        team_id = int(request.POST.get("team", ""))
    except ValueError:
        raise Http404("No such team") from None
    membership = team_switch(request, team_id=team_id)
    if membership is None:
        raise Http404("No such team")
    messages.success(request, f"Now working in {membership.team}.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = resolve_url("home")
    return redirect(target)


@login_required
def no_team(request):
    if request.user.memberships.exists():
        return redirect("home")
    return render(request, "accounts/no_team.html")
