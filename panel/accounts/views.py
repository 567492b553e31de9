from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from panel.accounts.services import team_switch
from panel.accounts.throttle import signin_blocked, signin_failed, signin_succeeded


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        address = request.META.get("REMOTE_ADDR", "")
        if signin_blocked(username, address):
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, f"Too many failed sign-ins. Wait {settings.SIGNIN_WINDOW_SECONDS // 60} minutes "
                                 "and try again.")
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        signin_failed(self.request.POST.get("username", ""), self.request.META.get("REMOTE_ADDR", ""))
        return super().form_invalid(form)

    def form_valid(self, form):
        signin_succeeded(form.get_user().get_username(), self.request.META.get("REMOTE_ADDR", ""))
        return super().form_valid(form)


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
