"""Who is calling: a personal access token (`Authorization: Bearer twp-…`) or the browser's session (with Django's
CSRF check on unsafe methods), and as which member of which team. The role rule is the pages' own
(`accounts.decorators.role_check`)."""
from functools import wraps

from django.core.exceptions import PermissionDenied
from ninja.security import HttpBearer, SessionAuth

from panel.accounts.decorators import role_check
from panel.accounts.models import Role
from panel.accounts.services import current_membership
from panel.accounts.tokens import token_membership
from panel.audit.models import AuditAction
from panel.audit.services import audit_record


class AccessTokenAuth(HttpBearer):
    """A personal access token; its member must hold `role` (checked here, before the body is read, as the pages'
    gate checks before the form)."""
    openapi_description = "A personal access token (twp-…) from Your account; it acts with its member's role."

    def __init__(self, role=Role.VIEWER, *, refusal=""):
        super().__init__()
        self.role = Role(role)
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

    def __init__(self, role=Role.VIEWER):
        super().__init__()
        self.role = Role(role)

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


AUTH = [AccessTokenAuth(), BrowserSession()]


def gate_operations(api):
    """Give every operation the authentication of its role (from `allowed`), so a role below it is refused (403,
    audited) before the request's body or parameters are even read, as on the pages."""
    for _, router in api._routers:
        for path_view in router.path_operations.values():
            for operation in path_view.operations:
                role = operation.view_func.required_role
                refusal = getattr(operation.view_func, "token_refusal", "")
                callbacks = [AccessTokenAuth(role, refusal=refusal), BrowserSession(role)]
                operation.auth_param = callbacks  # kept by the copy ninja binds to the API
                operation._set_auth(callbacks)


def required_role(view):
    """The role a page view asks for (set by `team_view`)."""
    while view is not None:
        if hasattr(view, "required_role"):
            return view.required_role
        view = getattr(view, "__wrapped__", None)
    raise ValueError(f"{view!r} is not a team_view")


def allowed(role=None, *, like=None, token_refusal=""):
    """An API operation open to `role` and above, or to whoever may open the page view `like` (the same rule,
    read from the page, so the two cannot drift apart). Sets request.team and request.membership. With
    `token_refusal`, a personal access token is refused with those words (403, audited): only a signed-in session
    may call the operation."""
    needed = Role(role) if role is not None else required_role(like)

    def decorate(operation):
        @wraps(operation)
        def gated(request, *args, **kwargs):
            membership = getattr(request, "token_membership", None) or current_membership(request)
            if membership is None:
                raise PermissionDenied("You are not a member of any team yet.")
            role_check(request, membership, needed)
            return operation(request, *args, **kwargs)

        gated.required_role = needed
        gated.token_refusal = token_refusal
        return gated

    return decorate
