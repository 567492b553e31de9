"""The two teams most tests start from (the conftest's team_setup fixture, and the benchmark scripts)."""


_HASHES = {}  # password -> its hash, made once per test process


def user_create(username, password, **fields):
    """A user as `create_user` makes one, with the password's hash made once per process: the panel's hasher
    (Argon2) takes about 0.13 s a hash on these machines and most tests make three or more users, minutes of the
    suite. The hash is a real one, so a panel process started by a test verifies it like any other."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    if password not in _HASHES:
        _HASHES[password] = make_password(password)
    users = get_user_model()
    user = users(username=username, **fields)
    user.password = _HASHES[password]
    user.save()
    return user


def teams_create():
    """Two teams; `alice` owns team A, `vera` is a viewer in A, `bob` owns team B."""
    from panel.accounts.models import Role
    from panel.accounts.services import membership_add, team_create

    alice = user_create("alice", "pw-alice-123")
    bob = user_create("bob", "pw-bob-123")
    vera = user_create("vera", "pw-vera-123")
    team_a = team_create(name="Team A", owner=alice)
    team_b = team_create(name="Team B", owner=bob)
    membership_add(team=team_a, user=vera, role=Role.VIEWER)
    return {"alice": alice, "bob": bob, "vera": vera, "team_a": team_a, "team_b": team_b}
