"""The attempt trail shown to users: the Requests list and one request's detail (each upstream attempt: channel,
outcome, milliseconds, status), the Overview's failed attempts per channel and outcome, and the Cache tab's hit rates
per key, route and request beside the engine's own prefix-cache counters. In Chromium at 1280 px, with screenshots;
and the pages' team scoping with Django's client."""
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import expect

from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.seed import LOCAL_MODEL, usage_seed, usage_seed_fixtures
from panel.usage.models import RequestLog
from tests.support.browser import screenshot, sign_in
from tests.support.dashboards import seed_engine


def step(channel, outcome, ms, status):
    return {"channel": channel.name, "channel_id": channel.pk, "outcome": outcome, "ms": ms, "status": status}


@pytest.fixture
def traffic(team_setup):
    team = team_setup["team_a"]
    local, clouds, keys = usage_seed_fixtures(team=team)
    usage_seed(team=team, count=300, days=1)  # the background: rows without a trail, as before trails existed
    now = timezone.now()
    fell_back = RequestLog.objects.create(
        team=team, key=keys[0], channel=clouds[0], created_at=now - timedelta(seconds=90), endpoint="chat",
        model="seed-chat", stream=True, status_code=200, outcome="ok", attempts=2, fell_back=True,
        request_id="req_fellback00000000000001", prompt_tokens=1000, cached_tokens=600, completion_tokens=50,
        ttft_ms=10700, latency_ms=11200,
        attempt_trail=[step(local, "stalled", 10012, None), step(clouds[0], "ok", 640, 200)])
    failed = RequestLog.objects.create(
        team=team, key=keys[1], channel=local, created_at=now - timedelta(seconds=60), endpoint="chat",
        model="seed-chat", status_code=502, outcome="error", error_kind="upstream_error", attempts=2,
        request_id="req_failed0000000000000002", latency_ms=420,
        attempt_trail=[step(local, "upstream_error", 180, 503), step(local, "upstream_error", 200, 503)])
    usage_rollup_run()
    return {"team": team, "local": local, "clouds": clouds, "keys": keys, "fell_back": fell_back, "failed": failed}


def test_a_users_request_shows_its_attempt_trail_and_the_dashboards_count_failures_and_hit_rates(
        page, live_server, traffic):
    seed_engine(traffic["local"].deployment)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/dashboards/?range=24h")
    page.click("nav.dash-tabs >> text=Requests")
    expect(page.locator("#request-list tbody tr")).to_have_count(100)  # the latest 100
    page.click("text=Failed, retried or fallen back")
    failed = page.locator("#request-list tbody tr", has_text="req_failed0000000000000002")
    expect(failed).to_contain_text("502")
    expect(failed).to_contain_text("upstream_error")
    screenshot(page, "requests-failed")

    page.click("text=req_fellback00000000000001")
    expect(page.locator("h1")).to_contain_text("req_fellback00000000000001")
    trail = page.locator("#attempt-trail tbody tr")
    expect(trail).to_have_count(2)
    expect(trail.nth(0)).to_contain_text(traffic["local"].name)
    expect(trail.nth(0)).to_contain_text("stalled")
    expect(trail.nth(0)).to_contain_text("10012")
    expect(trail.nth(1)).to_contain_text(traffic["clouds"][0].name)
    expect(trail.nth(1)).to_contain_text("200")
    facts = page.locator("#request-facts")
    expect(facts).to_contain_text("yes: the answer did not come from the route's first choice")
    expect(facts).to_contain_text("600 cached, 60.0 %")
    screenshot(page, "request-detail")

    page.goto(f"{live_server.url}/dashboards/?range=24h")
    failures = page.locator("[data-table=failures]")
    local_errors = failures.locator("tr", has_text="upstream_error")
    expect(local_errors).to_contain_text(traffic["local"].name)
    expect(local_errors.locator("td").nth(3)).to_have_text("2")  # two failed attempts
    expect(local_errors.locator("td").nth(4)).to_have_text("1")  # in one request
    expect(failures.locator("tr", has_text="stalled")).to_contain_text(traffic["local"].name)
    failures.scroll_into_view_if_needed()
    screenshot(page, "dashboards-failures")

    page.goto(f"{live_server.url}/dashboards/cache/?range=24h")
    expect(page.locator("[data-table=cache]")).to_contain_text(f"{LOCAL_MODEL} #")  # the engine's own counters
    expect(page.locator("[data-table=hit_by_key] tbody tr")).not_to_have_count(0)
    expect(page.locator("[data-table=hit_by_route]")).to_contain_text("seed-chat")
    latest = page.locator("[data-table=hit_by_request]").locator("tr", has_text="req_fellback00000000000001")
    expect(latest.locator("td").nth(6)).to_have_text("60")  # 600 of 1,000 prompt tokens
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # nothing wider than the window
    screenshot(page, "dashboards-cache-hit-rates")


def test_requests_are_the_teams_own_and_every_member_may_read_them(client, traffic, team_setup):
    detail = reverse("request_detail", args=[traffic["fell_back"].request_id])
    client.force_login(team_setup["vera"])  # a viewer
    assert client.get(reverse("requests")).status_code == 200
    page = client.get(detail)
    assert page.status_code == 200 and "stalled" in page.content.decode()
    client.force_login(team_setup["bob"])  # another team
    assert client.get(detail).status_code == 404
    assert "req_fellback" not in client.get(reverse("requests")).content.decode()
