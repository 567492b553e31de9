"""The audit page in Chromium: each event's details are read in words beside it, one a line."""
from playwright.sync_api import expect

from panel.accounts.models import Role
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from tests.support.browser import screenshot, sign_in


def test_the_audit_page_shows_what_each_event_changed(page, live_server, team_setup):
    team = team_setup["team_a"]
    audit_record(action=AuditAction.OWNER_KEPT, team=team, target="alice", role=Role.OWNER, groups_give="member",
                 username="single sign-on")
    audit_record(action=AuditAction.CANARY_ROLLED_BACK, team=team, target="chat", percent_from=25,
                 reason="JSON parse failures 12.0% (6 of 50 requests that asked for JSON) are 10.0 points above "
                        "the stable channels' 2.0% (1 of 50), more than the 3-point threshold.")
    audit_record(action=AuditAction.KEY_ISSUED, team=team, actor=team_setup["alice"], target="app",
                 key_id=7, rpm_limit=None, allowed_models=["chat", "embed"])
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/audit/")
    kept = page.locator("tr", has_text="Last owner kept")
    expect(kept.locator(".audit-detail")).to_contain_text("groups give: member")
    expect(page.locator("tr", has_text="Canary rolled back").locator(".detail-item").first).to_have_text(
        "percent from: 25")
    issued = page.locator("tr", has_text="Key issued").locator(".detail-item")
    expect(issued).to_have_text(["key id: 7", "rpm limit: —", "allowed models: chat, embed"])
    box = page.locator("tr", has_text="Canary rolled back").locator(".audit-detail").bounding_box()
    assert box["width"] <= 28 * 16 + 32  # a long reason wraps in its column instead of widening the table
    screenshot(page, "audit-details")
