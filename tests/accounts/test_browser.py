"""In Chromium: an owner opens Members from the top bar, invites a new email, passes the one-time link on, changes
a role and removes a member; the invited person sets a password through the link and signs in."""
from playwright.sync_api import expect

from panel.accounts.models import Membership
from panel.accounts.services import membership_add
from tests.support.browser import screenshot, sign_in


def test_it_invites_changes_a_role_and_removes_a_member(page, live_server, team_setup, django_user_model):
    mia = django_user_model.objects.create_user("mia", email="mia@example.com", password="pw-mia-123")
    membership_add(team=team_setup["team_a"], user=mia)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("header.topbar >> text=Members")
    expect(page.locator("h1")).to_have_text("Members of Team A")
    page.fill("#id_who", "dana@example.com")
    page.select_option("#id_role", "admin")
    page.click("button:has-text('Invite')")
    expect(page.locator(".message.success").first).to_contain_text("Added dana as admin")
    link = page.locator("#setup-link").inner_text().strip()
    assert "/welcome/" in link
    expect(page.locator('tr[data-member="dana"]')).to_contain_text("awaiting set-up")
    screenshot(page, "members-invited")

    vera = page.locator('tr[data-member="vera"]')
    vera.locator("select").select_option("member")
    vera.locator("button:has-text('Change')").click()
    expect(page.locator(".message.success")).to_contain_text("vera is now member")
    page.locator('tr[data-member="mia"] button:has-text("Remove")').click()
    expect(page.locator(".message.success")).to_contain_text("Removed mia from Team A")
    expect(page.locator('tr[data-member="mia"]')).to_have_count(0)
    page.locator('tr[data-member="alice"] select').select_option("viewer")
    page.locator('tr[data-member="alice"] button:has-text("Change")').click()
    expect(page.locator(".field-error, .message.error").first).to_contain_text("last owner")
    screenshot(page, "members")
    assert Membership.objects.get(user__username="alice").role == "owner"

    page.click("button:has-text('Sign out')")
    page.goto(link)
    expect(page.locator(".login-card")).to_contain_text("Welcome, dana")
    page.fill("#id_new_password1", "a-long-Pass-phrase-9")
    page.fill("#id_new_password2", "a-long-Pass-phrase-9")
    page.click("button:has-text('Set password')")
    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator(".message.success")).to_contain_text("Your password is set and you are signed in")
    expect(page.locator("header.topbar")).to_contain_text("Members")  # an admin now
    page.click("button:has-text('Sign out')")
    sign_in(page, live_server.url, "dana", "a-long-Pass-phrase-9")
    expect(page.locator("header.topbar")).to_contain_text("Members")
