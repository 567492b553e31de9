"""In Chromium: "Check and promote" refuses while the step has no passing verdict (it once promoted 5 % -> 25 % on
three requests with a P99 of 1,060 ms against 83 ms); a person may override, only with a confirmation and a reason,
and the audit log records the override."""
from playwright.sync_api import expect

from panel.audit.models import AuditAction, AuditEvent
from panel.channels.canary import canary_start
from panel.channels.models import Channel, Route, RouteChannel
from panel.usage.models import RequestLog
from tests.support.browser import screenshot, sign_in


def test_promotion_needs_a_verdict_and_an_override_is_confirmed_and_audited(page, live_server, team_setup):
    team = team_setup["team_a"]
    stable = Channel.objects.create(team=team, name="stable", base_url="http://127.0.0.1:9/v1", model_id="m")
    candidate = Channel.objects.create(team=team, name="awq-candidate", base_url="http://127.0.0.1:9/v1",
                                       model_id="m")
    route = Route.objects.create(team=team, model_name="support")
    RouteChannel.objects.create(route=route, channel=stable, position=0)
    canary_start(route=route, channel=candidate, percent=5)
    for channel, count, latency, canary in ((candidate, 3, 1060, True), (stable, 60, 83, False)):
        RequestLog.objects.bulk_create([RequestLog(team=team, route=route, channel=channel, canary=canary,
                                                   endpoint="chat", model="support", status_code=200, outcome="ok",
                                                   latency_ms=latency) for _ in range(count)])
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/")
    page.click("button:has-text('Check and promote')")
    expect(page.locator(".message.error")).to_contain_text("no passing verdict yet")
    expect(page.locator(".message.error")).to_contain_text("served 3 of the 20 requests")
    expect(page.locator(".card").first).to_contain_text("5% of the requests go to")
    assert Route.objects.get(pk=route.pk).canary_percent == 5

    page.click("summary:has-text('Promote without a passing verdict')")
    page.fill("#override-reason", "read the candidate's replies by hand")
    page.click("button:has-text('Promote anyway')")  # the confirmation is not ticked: the browser holds the form
    assert Route.objects.get(pk=route.pk).canary_percent == 5
    screenshot(page, "route-canary-override")
    page.check("input[name=confirm]")
    page.click("button:has-text('Promote anyway')")
    expect(page.locator(".message.success")).to_contain_text("Promoted: 25%")
    assert Route.objects.get(pk=route.pk).canary_percent == 25
    event = AuditEvent.objects.filter(action=AuditAction.CANARY_PROMOTED).get()
    assert event.actor == team_setup["alice"]
    assert event.detail["override"] is True
    assert event.detail["override_reason"] == "read the candidate's replies by hand"
    assert "served 3 of the 20 requests" in event.detail["verdict"]
