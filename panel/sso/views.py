"""The way through the identity provider: the sign-in button's start, the provider's callback, the refused page.
The first two are mozilla-django-oidc's views, answering 404 while single sign-on is off."""
from django.conf import settings
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from panel.sso.backends import REFUSAL_KEY


class ProviderCallback(OIDCAuthenticationCallbackView):
    @property
    def failure_url(self):
        return reverse("sso_refused")


def _when_on(view):
    def wrapper(request):
        if not settings.SSO_ENABLED:
            raise Http404("Single sign-on is off.")
        return view(request)

    return wrapper


sign_in = _when_on(OIDCAuthenticationRequestView.as_view())
callback = _when_on(ProviderCallback.as_view())


def refused(request):
    reason = request.session.pop(REFUSAL_KEY, None) or "The identity provider did not complete the sign-in."
    return render(request, "sso/refused.html", {"reason": reason, "sso_name": settings.SSO_NAME}, status=403)
