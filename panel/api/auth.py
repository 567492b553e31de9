"""Who is calling: a personal access token (`Authorization: Bearer twp-…`) or the browser's session (with Django's
CSRF check on unsafe methods), and as which member of which team. The role rule is the pages' own
(`accounts.decorators.role_check`), and so is the role each action needs (`accounts.roles`)."""
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from ninja.security import HttpBearer, SessionAuth

from panel.accounts.decorators import role_check
from panel.accounts.roles import role_for
from panel.accounts.services import current_membership
from panel.accounts.tokens import token_membership
from panel.audit.models import AuditAction
from panel.audit.services import audit_record


class AccessTokenAuth(HttpBearer):
    """A personal access token; its member must hold the role `action` needs (checked here, before the body is read,
    as the pages' gate checks before the form)."""
    openapi_description = "A personal access token (twp-…) from Your account; it acts with its member's role."

    def __init__(self, action, *, refusal=""):
        super().__init__()
        self.action, self.role = action, role_for(action)
        self.refusal = refusal  # words for an operation no token may call (it needs a signed-in session)

    def authenticate(self, request, token):
        access, membership = token_membership(token)
        if access is None:
            return None
        request.user = access.user
        request.access_token = access
        request.token_membership = membership
        if self.refusal:
            audit_record(action=AuditAction.REFUSED, request=request, team=membership.team, actor=access.user,
                         target=request.path[:300], needed="session", had="token")
            raise PermissionDenied(self.refusal)
        role_check(request, membership, self.role)
        return access


class BrowserSession(SessionAuth):
    openapi_description = "The panel's session cookie; unsafe methods need the X-CSRFToken header."

    def __init__(self, action):
        super().__init__()
        self.action, self.role = action, role_for(action)

    def authenticate(self, request, key):
        if request.headers.get("Authorization"):
            return None  # a request that names a token is judged by that token alone, never by a cookie beside it
        user = super().authenticate(request, key)
        if user is None:
            return None
        membership = current_membership(request)
        if membership is None:
            raise PermissionDenied("You are not a member of any team yet.")
        role_check(request, membership, self.role)
        return user


def gate(action, *, token_refusal=""):
    """The authentication of an operation that does `action` (panel/accounts/roles.py), for its decorator's `auth=`:
    a personal access token or the browser's session, of a member whose role the action allows. Refused (403,
    audited) before the request's body or parameters are read, as on the pages; request.team and request.membership
    are set for the operation. With `token_refusal`, any personal access token is refused with those words (403,
    audited): only a signed-in session may call the operation."""
    return [AccessTokenAuth(action, refusal=token_refusal), BrowserSession(action)]


class Ungated(SessionAuth):
    """The API's default, for an operation that names no action: it lets nobody in (tests/accounts/test_roles.py
    fails first). A session auth, so that the reference page (Swagger UI) still sends the CSRF token."""

    def authenticate(self, request, key):
        raise PermissionDenied("This operation names no action in the roles table.")


def reference_gate(view):
    """The schema (openapi.json) and the reference page (docs): they map every operation and field of the API, so
    they are for a signed-in member of a team or a valid personal access token. Anyone else: 401 in the API's shape,
    or, for the reference page, the sign-in page."""

    @wraps(view)
    def gated(request, *args, **kwargs):
        header = request.headers.get("Authorization", "")
        if header:
            access, _ = token_membership(header.removeprefix("Bearer ").strip())
            allowed = access is not None
        else:
            allowed = request.user.is_authenticated and current_membership(request) is not None
        if allowed:
            return view(request, *args, **kwargs)
        if not header and not request.path.endswith(".json"):
            return redirect_to_login(request.get_full_path())
        return JsonResponse({"detail": "Sign in, or send a personal access token: Authorization: Bearer twp-…",
                             "errors": {}}, status=401)

    return gated
