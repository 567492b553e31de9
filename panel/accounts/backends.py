"""The authentication backend: Django's, behind the sign-in throttle (`throttle.py`), so every sign-in form that
authenticates (the panel's and the admin site's) is throttled the same way."""
from django.contrib.auth.backends import ModelBackend

from panel.accounts.throttle import signin_blocked, signin_failed, signin_succeeded


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
        if username is None:
            username = kwargs.get("username", "")
        if signin_blocked(username, address):
            return None  # even the right password: the window has to pass
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            signin_failed(username, address)
        else:
            signin_succeeded(username, address)
        return user
