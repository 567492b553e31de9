"""Teams and memberships: the only place that creates them or changes roles."""
from django.contrib.auth import get_user_model
from django.db import transaction

from panel.accounts.models import Membership, Role, Team

SESSION_TEAM_KEY = "tokenwise_team_id"


@transaction.atomic
def team_create(*, name, owner):
    """Create a team with `owner` as its owner."""
    team = Team.objects.create(name=name)
    Membership.objects.create(team=team, user=owner, role=Role.OWNER)
    return team


def membership_add(*, team, user, role=Role.MEMBER):
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def membership_for(*, user, team_id):
    """The user's membership in team `team_id`, or None."""
    if not user.is_authenticated or team_id is None:
        return None
    return Membership.objects.select_related("team").filter(user=user, team_id=team_id).first()


def current_membership(request):
    """The membership of the team this session works in; falls back to the user's first team."""
    user = request.user
    if not user.is_authenticated:
        return None
    membership = membership_for(user=user, team_id=request.session.get(SESSION_TEAM_KEY))
    if membership is None:
        membership = Membership.objects.select_related("team").filter(user=user).order_by("team__name").first()
        if membership is not None:
            request.session[SESSION_TEAM_KEY] = membership.team_id
    return membership


def team_switch(request, *, team_id):
    """Make `team_id` the session's current team. Returns the membership, or None if the user is not in it."""
    membership = membership_for(user=request.user, team_id=team_id)
    if membership is not None:
        request.session[SESSION_TEAM_KEY] = membership.team_id
    return membership


@transaction.atomic
def admin_ensure(*, username, password, email=""):
    """Create the superuser `username` if it does not exist. Returns (user, created)."""
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    user = User.objects.create_superuser(username=username, email=email, password=password)
    return user, True


@transaction.atomic
def demo_team_ensure(*, owner, name="Demo team"):
    """The demo team that `make run` seeds, with `owner` as owner. Idempotent."""
    team = Team.objects.filter(name=name).first()
    if team is None:
        return team_create(name=name, owner=owner)
    membership_add(team=team, user=owner, role=Role.OWNER)
    return team
