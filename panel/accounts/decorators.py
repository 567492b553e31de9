"""Every team-scoped view goes through `team_view(action)`: it signs the user in, resolves the current team and
checks the role the action needs (panel/accounts/roles.py). Objects are then fetched with `team=request.team`, so
another team's object is a 404."""
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect

from panel.accounts.models import Role
from panel.accounts.roles import OTHERS, may_on, role_for
from panel.accounts.services import current_membership
from panel.audit.models import AuditAction
from panel.audit.services import audit_record


def role_check(request, membership, role):
    """The role rule every page and API operation applies: below `role`, the refusal is audited and PermissionDenied
    raised; at or above it, `request.membership` and `request.team` are set."""
    if not membership.allows(role):
        audit_record(action=AuditAction.REFUSED, request=request, team=membership.team, actor=membership.user,
                     target=request.path[:300], needed=Role(role).value, had=membership.role)
        raise PermissionDenied(f"This needs the {Role(role).label.lower()} role in {membership.team}.")
    request.membership = membership
    request.team = membership.team


def maker_check(request, action, created_by_id, refusal):
    """The rule for what a member made (accounts.roles.OTHERS), after the role rule: its maker may do `action`,
    another needs the role OTHERS names. Else the refusal is audited and PermissionDenied raised with `refusal`."""
    membership = request.membership
    if may_on(membership, action, created_by_id):
        return
    audit_record(action=AuditAction.REFUSED, request=request, team=membership.team, actor=membership.user,
                 target=request.path[:300], needed=f"{Role(OTHERS[action]).value} or its creator",
                 had=membership.role)
    raise PermissionDenied(refusal)


def team_view(action):
    """A page view for members who may do `action` (a name in the roles table; an unknown one raises here, when the
    views module is imported)."""
    role = role_for(action)

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            membership = current_membership(request)
            if membership is None:
                return redirect("no_team")
            role_check(request, membership, role)
            return view(request, *args, **kwargs)

        wrapper.action = action
        wrapper.required_role = role
        return wrapper

    return decorate
