"""The two teams most tests start from (the conftest's team_setup fixture, and the benchmark scripts)."""


def teams_create():
    """Two teams; `alice` owns team A, `vera` is a viewer in A, `bob` owns team B."""
    from django.contrib.auth import get_user_model

    from panel.accounts.models import Role
    from panel.accounts.services import membership_add, team_create

    users = get_user_model().objects
    alice = users.create_user("alice", password="pw-alice-123")
    bob = users.create_user("bob", password="pw-bob-123")
    vera = users.create_user("vera", password="pw-vera-123")
    team_a = team_create(name="Team A", owner=alice)
    team_b = team_create(name="Team B", owner=bob)
    membership_add(team=team_a, user=vera, role=Role.VIEWER)
    return {"alice": alice, "bob": bob, "vera": vera, "team_a": team_a, "team_b": team_b}
