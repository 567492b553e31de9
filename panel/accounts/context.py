from panel.accounts.services import current_membership


def current_team(request):
    """Template context: the current team, the user's role in it, and the teams to switch to."""
    membership = getattr(request, "membership", None)
    if membership is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
        membership = current_membership(request)
    if membership is None:
        return {"current_team": None, "current_role": None, "my_memberships": []}
    return {
        "current_team": membership.team,
        "current_role": membership.role,
        "my_memberships": request.user.memberships.select_related("team").order_by("team__name"),
    }
