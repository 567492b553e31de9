"""In Chromium at 1280 px: a deployment of two replicas on two hosts shows each replica's state, host, endpoint and
engine figures, the Serving list one row with "1/2 replicas ready", and the route form its balancing choice.
Screenshots in docs/screenshots/ (deployment-replicas.png, route-form-balance.png)."""
from django.utils import timezone
from playwright.sync_api import expect

from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Route
from panel.dashboards.models import EngineSample
from panel.serving.services import deployment_launch
from tests.support.browser import screenshot, sign_in
from tests.support.channels import set_state
from tests.support.replicas import host, profile  # noqa: F401 (fixture)


def test_it_shows_each_replica_and_the_route_balancing(page, live_server, team_setup, profile):  # noqa: F811
    host("host-a"), host("host-b")
    head = deployment_launch(team=team_setup["team_a"], user=None, profile=profile, replicas=2, enqueue=False)
    first, second = head.replicas()
    set_state(first, "ready", port=8601, base_url="http://127.0.0.1:8601/v1", ready_at=timezone.now())
    set_state(second, "pending", restarts=1, failure_kind="killed", failure_reason="the engine was killed")
    local_channel_sync(first)
    EngineSample.objects.create(deployment=first, team=first.team, at=timezone.now(), running=3, waiting=0,
                                kv_cache_usage=0.42, cumulative={"counters": {"prefix_queries": 1000,
                                                                              "prefix_hits": 870}})
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/serving/")
    expect(page.locator("table").last).to_contain_text("1/2 replicas ready")
    page.goto(f"{live_server.url}/serving/deployments/{head.pk}/")
    rows = page.locator("table.replicas tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("host-a")
    expect(rows.nth(0)).to_contain_text("42 %")
    expect(rows.nth(0)).to_contain_text("87 %")
    expect(rows.nth(1)).to_contain_text("Pending")
    expect(rows.nth(1)).to_contain_text("killed")
    screenshot(page, "deployment-replicas")
    route = Route.objects.get(team=head.team, model_name="tiny-chat")
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/edit/")
    expect(page.locator("#id_balance")).to_have_value("prefix_aware")
    page.select_option("#id_balance", "session_affinity")
    page.fill("#id_affinity_header", "x-api-key")
    page.click("button:has-text('Save route')")
    expect(page.locator(".field-error, .message.error").first).to_contain_text("credential header")
    screenshot(page, "route-form-balance")
    assert Route.objects.get(pk=route.pk).balance == "prefix_aware"  # nothing saved on error
    page.fill("#id_affinity_header", "x-session-id")
    page.click("button:has-text('Save route')")
    page.wait_for_url(f"{live_server.url}/channels/routes/{route.pk}/")  # saved: back on the route
    assert Route.objects.get(pk=route.pk).balance == "session_affinity"
