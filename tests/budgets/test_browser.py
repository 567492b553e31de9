"""In Chromium: an admin sets a team budget on the Budgets page; at 85% spent every page shows the warning."""
from decimal import Decimal

from django.utils import timezone
from playwright.sync_api import expect

from panel.accounts.keys import key_issue
from panel.budgets.services import budgets_reconcile
from panel.usage.models import RequestLog
from tests.support.browser import screenshot, sign_in


def test_it_sets_a_budget_and_warns_at_80_percent(page, live_server, team_setup):
    team = team_setup["team_a"]
    key, _ = key_issue(team=team, user=team_setup["alice"], name="support bot")
    RequestLog.objects.create(team=team, key=key, endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=5, prompt_tokens=400_000, completion_tokens=250_000, cost=Decimal("21.25"),
                              created_at=timezone.now())
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("header.topbar >> text=Budgets")
    expect(page.locator('tr[data-scope^="team"]')).to_contain_text("no budget")
    page.select_option("#id_target", "team")
    page.fill("#id_money_per_month", "25")
    page.click("button:has-text('Save budget')")
    expect(page.locator(".message.success")).to_contain_text("Saved the budget of team Team A")
    page.select_option("#id_target", str(key.pk))
    page.fill("#id_tokens_per_month", "-5")
    page.click("button:has-text('Save budget')")
    expect(page.locator(".field-error")).to_contain_text("greater than or equal to 0")
    page.fill("#id_tokens_per_month", "2000000")
    page.click("button:has-text('Save budget')")
    expect(page.locator('tr[data-scope^="key"]')).to_contain_text("within budget")
    budgets_reconcile()  # what beat runs every minute
    page.click("nav.sidebar >> text=Gateway keys")
    expect(page.locator(".budget-alerts")).to_contain_text("85% of the monthly money budget spent")
    page.click(".budget-alerts >> text=Budgets")
    expect(page.locator('tr[data-scope^="team"]')).to_contain_text("over 80%")
    screenshot(page, "budgets")
