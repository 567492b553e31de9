"""In Chromium: an admin issues a gateway key, sees it once, and revokes it."""
from playwright.sync_api import expect

from panel.channels.models import Route
from tests.support.browser import screenshot, sign_in


def test_it_issues_a_key_shows_it_once_and_revokes_it(page, live_server, team_setup):
    Route.objects.create(team=team_setup["team_a"], model_name="chat")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Gateway keys")
    expect(page.locator(".empty h2")).to_have_text("No keys yet")
    page.fill("#id_name", "support bot")
    page.fill("#id_allowed_models", "chat")
    page.fill("#id_rpm_limit", "120")
    page.click("button:has-text('Issue key')")
    shown = page.locator("#new-key")
    expect(shown).to_contain_text("tw-")
    raw = shown.inner_text().strip()
    expect(page.locator("table.table")).to_contain_text(f"tw-…{raw[-4:]}")
    expect(page.locator("table.table")).to_contain_text("120 req/min")
    screenshot(page, "keys-issued")
    page.goto(f"{live_server.url}/keys/")
    expect(page.locator("#new-key")).to_have_count(0)
    assert raw not in page.content()
    page.click("button:has-text('Revoke')")
    expect(page.locator(".message.success")).to_contain_text("Revoked support bot")
    expect(page.locator(".pill.off")).to_have_text("revoked")
    screenshot(page, "keys-revoked")
