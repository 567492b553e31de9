from panel.accounts.roles import may
from panel.accounts.services import current_membership
from panel.core.sections import SECTIONS


def current_team(request):
    """Template context: the current team, the user's role in it, the teams to switch to, and the sidebar's
    sections this role may not open (hidden)."""
    membership = getattr(request, "membership", None)
    if membership is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
        membership = current_membership(request)
    if membership is None:
        return {"current_team": None, "current_role": None, "my_memberships": [], "hidden_sections": set()}
    return {
        "current_team": membership.team,
        "current_role": membership.role,
        "my_memberships": request.user.memberships.select_related("team").order_by("team__name"),
        "hidden_sections": {section.slug for section in SECTIONS if not may(membership, section.view_action)},
    }
