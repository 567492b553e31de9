"""In Chromium: a viewer creates a personal access token on Your account and uses it; an admin adds a webhook and
reads its delivery log; a member opens My usage and a key's page; the API reference renders from the panel's own
files (no CDN)."""
from datetime import timedelta
from decimal import Decimal

import httpx
from django.utils import timezone
from playwright.sync_api import expect

from panel.accounts.keys import key_issue
from panel.dashboards.rollup import usage_rollup_run
from panel.notifications.models import Delivery, DeliveryAttempt, DeliveryState, Notification
from panel.usage.models import RequestLog
from tests.support.browser import screenshot, sign_in


def test_a_viewer_makes_a_token_and_the_api_answers_to_it(page, live_server, team_setup):
    sign_in(page, live_server.url, "vera", "pw-vera-123")
    page.click("header.topbar >> text=vera")
    expect(page.locator("h1")).to_have_text("Your account")
    page.fill("#id_name", "grafana export")
    page.click("button:has-text('Create token')")
    raw = page.locator("#new-token").inner_text().strip()
    assert raw.startswith("twp-")
    expect(page.locator("table")).to_contain_text("grafana export")
    screenshot(page, "account-token-created")
    answer = httpx.get(f"{live_server.url}/api/v1/team", headers={"Authorization": f"Bearer {raw}"}, timeout=10)
    assert answer.json()["role"] == "viewer"
    page.goto(f"{live_server.url}/account/")
    expect(page.locator("#new-token")).to_have_count(0)  # shown once
    page.click("button:has-text('Revoke')")
    expect(page.locator("table")).to_contain_text("revoked")
    assert httpx.get(f"{live_server.url}/api/v1/team", headers={"Authorization": f"Bearer {raw}"},
                     timeout=10).status_code == 401
    screenshot(page, "account")


def test_an_admin_adds_a_webhook_and_reads_the_delivery_log(page, live_server, team_setup):
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("header.topbar >> text=Webhooks")
    page.fill("#id_name", "#ops in Slack")
    page.fill("#id_url", "http://127.0.0.1:9/hooks/ops")
    page.select_option("#id_format", "slack")
    page.check("input[value='deployment.failed']")
    page.check("input[value='budget.exhausted']")
    page.click("button:has-text('Add webhook')")
    secret = page.locator("#webhook-secret").inner_text().strip()
    assert secret.startswith("whsec_")
    row = page.locator('tr[data-webhook="#ops in Slack"]')
    expect(row).to_contain_text("deployment.failed")
    # A delivery log as a failing receiver leaves it: two failed attempts, then one delivered.
    hook = team_setup["team_a"].webhooks.get()
    note = Notification.objects.create(team=team_setup["team_a"], kind="deployment.failed",
                                       title="Deployment #7 failed: out of memory (CUDA OOM)")
    delivery = Delivery.objects.create(webhook=hook, notification=note, state=DeliveryState.DELIVERED, attempts=3,
                                       last_status=200, next_attempt_at=timezone.now(), delivered_at=timezone.now())
    for status, error in ((None, "no answer within 5 s"), (500, "the receiver answered HTTP 500"), (200, "")):
        DeliveryAttempt.objects.create(delivery=delivery, status=status, error=error, duration_ms=5000 if not status
                                       else 40)
    waiting = Notification.objects.create(team=team_setup["team_a"], kind="budget.exhausted",
                                          title="Whole team (Team A): budget spent in 2026-11")
    Delivery.objects.create(webhook=hook, notification=waiting, attempts=1, last_error="the receiver answered HTTP 503",
                            last_status=503, next_attempt_at=timezone.now() + timedelta(seconds=30))
    page.goto(f"{live_server.url}/webhooks/")
    expect(page.locator(f'tr[data-delivery="{delivery.pk}"]')).to_contain_text("Delivered")
    expect(page.locator("#deliveries")).to_contain_text("HTTP 503")
    screenshot(page, "webhooks")
    row = page.locator('tr[data-webhook="#ops in Slack"]')
    row.locator("summary:has-text('Edit')").click()
    row.locator(f"#id_{hook.pk}_url").fill("https://hooks.example/ops")
    row.locator("button:has-text('Save')").click()
    expect(page.locator(".message.success")).to_contain_text("Saved #ops in Slack")
    expect(page.locator('tr[data-webhook="#ops in Slack"]')).to_contain_text("https://hooks.example/ops")


def test_my_usage_and_a_keys_page(page, live_server, team_setup):
    from panel.channels.models import Route

    team = team_setup["team_a"]
    Route.objects.create(team=team, model_name="tiny-chat")
    mine, _ = key_issue(team=team, user=team_setup["alice"], name="support bot")
    other, _ = key_issue(team=team, user=team_setup["bob"], name="batch jobs")
    now = timezone.now()
    RequestLog.objects.bulk_create([
        RequestLog(team=team, key=mine if i % 3 else other, created_at=now - timedelta(minutes=i % 55),
                   endpoint="chat", model="tiny-chat", status_code=200 if i % 17 else 502,
                   outcome="ok" if i % 17 else "error", latency_ms=120 + i % 40, ttft_ms=30 + i % 20,
                   prompt_tokens=200, completion_tokens=60, cost=Decimal("0.0004")) for i in range(400)])
    usage_rollup_run(lock=False)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("header.topbar >> text=My usage")
    expect(page.locator("h1")).to_have_text("My usage")
    page.click("label:has-text('1h')")
    expect(page.locator("#dash-cards")).to_contain_text("266")  # her key's requests, not the team's 400
    expect(page.locator("#figure-requests .main-svg").first).to_be_visible()
    screenshot(page, "my-usage")
    page.goto(f"{live_server.url}/keys/")
    page.click("a:has-text('support bot')")
    expect(page.locator("h1")).to_contain_text("Key support bot")
    expect(page.locator("#figure-tokens .main-svg").first).to_be_visible()
    screenshot(page, "key-detail")


def test_the_api_reference_renders_from_local_files(page, live_server, team_setup):
    outside = []
    page.on("request", lambda request: outside.append(request.url)
            if not request.url.startswith(live_server.url) else None)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/api/v1/docs")
    expect(page.locator(".swagger-ui .title").first).to_contain_text("Tokenwise management API")
    expect(page.locator(".opblock-tag-section").first).to_be_visible()
    page.click("#operations-gateway_keys-keys_issue .opblock-summary")
    expect(page.locator(".opblock.is-open")).to_contain_text("allowed_models")
    page.locator(".opblock.is-open").scroll_into_view_if_needed()
    page.screenshot(path=screenshot(page, "api-docs"), full_page=False)
    assert outside == []
