"""Your account: anyone signed in, a viewer too, changes their own password; a wrong old password, a mismatch or a
weak new one changes nothing and says why; other sessions of the account end, this one stays."""
import pytest
from django.test import Client
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent

NEW = "another-long-Phrase-42"


def changed(user, password):
    user.refresh_from_db()
    return user.check_password(password)


@pytest.mark.parametrize("data, words", [
    ({"old_password": "not-it", "new_password1": NEW, "new_password2": NEW}, "old password was entered incorrectly"),
    ({"old_password": "pw-vera-123", "new_password1": NEW, "new_password2": NEW + "x"}, "didn’t match"),
    ({"old_password": "pw-vera-123", "new_password1": "12345678", "new_password2": "12345678"}, "too common"),
    ({"old_password": "pw-vera-123", "new_password1": "", "new_password2": ""}, "This field is required"),
])
def test_a_bad_change_says_why_and_keeps_the_old_password(client, team_setup, data, words):
    vera = team_setup["vera"]
    client.force_login(vera)
    response = client.post(reverse("password_change"), data)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert changed(vera, "pw-vera-123") and not changed(vera, NEW)
    assert not AuditEvent.objects.filter(action=AuditAction.PASSWORD_CHANGED).exists()


def test_a_viewer_changes_their_password_stays_signed_in_and_other_sessions_end(client, team_setup):
    vera = team_setup["vera"]  # a viewer: the lowest role can still change its own password
    assert client.login(username="vera", password="pw-vera-123")
    elsewhere = Client()
    assert elsewhere.login(username="vera", password="pw-vera-123")
    page = client.get(reverse("account")).content.decode()
    assert 'id="password-change"' in page and "Change your password" in page
    assert "<title>Your account · Tokenwise</title>" in page

    response = client.post(reverse("password_change"), {"old_password": "pw-vera-123", "new_password1": NEW,
                                                        "new_password2": NEW}, follow=True)
    assert response.redirect_chain == [(reverse("account"), 302)]
    assert "Your password is changed" in response.content.decode()
    assert changed(vera, NEW) and not changed(vera, "pw-vera-123")
    assert client.get(reverse("account")).status_code == 200  # this session goes on
    other = elsewhere.get(reverse("account"))
    assert other.status_code == 302 and other["Location"].startswith(reverse("login"))  # the other one ended
    [event] = AuditEvent.objects.filter(action=AuditAction.PASSWORD_CHANGED)
    assert (event.actor_id, event.target, event.team_id) == (vera.pk, "vera", team_setup["team_a"].pk)
    client.logout()
    assert not client.login(username="vera", password="pw-vera-123")
    assert client.login(username="vera", password=NEW)


def test_it_changes_the_password_from_the_account_page_in_the_browser(page, live_server, team_setup):
    from playwright.sync_api import expect

    from tests.support.browser import screenshot, sign_in

    sign_in(page, live_server.url, "vera", "pw-vera-123")
    page.click("header.topbar >> text=vera")
    page.fill("#id_old_password", "pw-vera-123")
    page.fill("#id_new_password1", NEW)
    page.fill("#id_new_password2", NEW + "!")
    page.click("button:has-text('Change password')")
    expect(page.locator("#password-change .field-error")).to_contain_text("didn’t match")
    screenshot(page, "account-password-mismatch")
    page.fill("#id_old_password", "pw-vera-123")
    page.fill("#id_new_password1", NEW)
    page.fill("#id_new_password2", NEW)
    page.click("button:has-text('Change password')")
    expect(page.locator(".message.success")).to_contain_text("Your password is changed")
    screenshot(page, "account")
    assert changed(team_setup["vera"], NEW)
