"""Sign-in throttling: five wrong passwords lock that username out for the window, even with the right one;
other users are not affected; a success clears the count."""
from django.urls import reverse


def attempt(client, username, password, address="10.0.0.1"):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def test_it_locks_out_a_username_after_five_failures(client, team_setup):
    for _ in range(5):
        assert attempt(client, "alice", "guess").status_code == 200
    blocked = attempt(client, "alice", "pw-alice-123")
    assert blocked.status_code == 429 and "Too many failed sign-ins" in blocked.content.decode()
    assert "_auth_user_id" not in client.session
    # Another user from another address signs in normally.
    assert attempt(client, "bob", "pw-bob-123", address="10.0.0.2").status_code == 302


def test_it_clears_the_count_after_a_success(client, team_setup):
    for _ in range(4):
        attempt(client, "vera", "guess", address="10.0.0.3")
    assert attempt(client, "vera", "pw-vera-123", address="10.0.0.3").status_code == 302
    client.logout()
    for _ in range(4):
        attempt(client, "vera", "guess", address="10.0.0.4")
    assert attempt(client, "vera", "pw-vera-123", address="10.0.0.4").status_code == 302


def test_a_stranger_elsewhere_cannot_lock_a_user_out(client, team_setup):
    for _ in range(5):
        attempt(client, "alice", "guess", address="203.0.113.9")
    assert attempt(client, "alice", "guess-again", address="203.0.113.9").status_code == 429
    assert attempt(client, "alice", "pw-alice-123", address="10.0.0.1").status_code == 302  # her own address


def test_guessing_spread_over_many_addresses_meets_the_softer_limit(client, team_setup, settings):
    settings.SIGNIN_MAX_FAILURES = 2  # pair 2, username 20, address 8
    for index in range(20):
        attempt(client, "bob", "guess", address=f"198.51.100.{index}")
    assert attempt(client, "bob", "pw-bob-123", address="10.0.0.7").status_code == 429


def test_the_admin_site_sign_in_is_throttled_too(client, team_setup):
    team_setup["alice"].is_staff = True
    team_setup["alice"].save()
    for _ in range(5):
        client.post("/admin/login/", {"username": "alice", "password": "guess"}, REMOTE_ADDR="10.0.0.9")
    client.post("/admin/login/", {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.0.0.9")
    assert "_auth_user_id" not in client.session
