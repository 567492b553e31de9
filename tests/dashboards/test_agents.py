"""The Agents tab: per session the turns, the growth curve, repeated-prefix and cache shares, cost as billed
against without caching and at the cloud channel's prices; the top sessions; per key and per route totals."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route, RouteChannel
from panel.core.money import money_text
from panel.dashboards.agents import agent_sessions
from panel.dashboards.selectors import DashboardQuery
from panel.usage.models import RequestLog
from tests.support.browser import screenshot, sign_in
from tests.support.dashboards import figure_points


def _agent_traffic(team_setup):
    team = team_setup["team_a"]
    local = Channel.objects.create(team=team, name="local-qwen", kind="local", base_url="http://127.0.0.1:9/v1",
                                   model_id="m", price_input_per_million=Decimal("0.10"),
                                   price_output_per_million=Decimal("0.20"),
                                   price_cached_per_million=Decimal("0.01"))
    cloud = Channel.objects.create(team=team, name="cloud", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("3.00"), price_output_per_million=Decimal("15.00"),
                                   price_cached_per_million=Decimal("0.30"))
    route = Route.objects.create(team=team, model_name="agent")
    RouteChannel.objects.create(route=route, channel=local, position=0)
    RouteChannel.objects.create(route=route, channel=cloud, position=1)
    key, _ = key_issue(team=team, user=team_setup["alice"], name="review-bot")
    start = timezone.now() - timedelta(minutes=30)
    rows = []
    for session, count in (("review-42", 8), ("p-small", 2)):
        for turn in range(1, count + 1):
            prompt, cached = 2000 * turn, 2000 * (turn - 1) // 16 * 16
            rows.append(RequestLog(team=team, key=key, route=route, channel=local, endpoint="chat", model="agent",
                                   status_code=200, outcome="ok", latency_ms=50, prompt_tokens=prompt,
                                   completion_tokens=100, cached_tokens=cached, session_id=session,
                                   session_turn=turn, repeated_share=(turn - 1) / turn,
                                   cost=local.cost(prompt, 100, cached),
                                   created_at=start + timedelta(seconds=10 * turn)))
    RequestLog.objects.bulk_create(rows)
    return {"team": team, "local": local, "cloud": cloud, "route": route, "key": key}


@pytest.mark.django_db
def test_it_adds_up_each_session_with_the_three_prices(team_setup):
    made = _agent_traffic(team_setup)
    sessions = {s.session_id: s for s in agent_sessions(DashboardQuery(team=made["team"], range="24h"))}
    review = sessions["review-42"]
    assert [turn["turn"] for turn in review.turns] == list(range(1, 9))
    assert review.input_tokens == sum(2000 * turn for turn in range(1, 9))
    third = review.turns[2]
    assert third["uncached"] == made["local"].cost(6000, 100, 0)
    assert third["cloud"] == made["cloud"].cost(6000, 100, third["cached"])  # the route's remote channel
    assert review.billed == sum(made["local"].cost(2000 * t, 100, 2000 * (t - 1) // 16 * 16) for t in range(1, 9))
    assert review.billed < review.uncached < review.cloud


@pytest.mark.django_db
def test_free_sessions_rank_by_length_and_a_refused_request_is_no_session(team_setup):
    from panel.dashboards.pages import dashboard_page

    team = team_setup["team_a"]
    now = timezone.now()
    common = {"team": team, "endpoint": "chat", "model": "agent", "latency_ms": 5.0, "cost": Decimal(0)}
    RequestLog.objects.bulk_create(
        [RequestLog(status_code=200, outcome="ok", prompt_tokens=900, session_id=f"single-{index}", session_turn=1,
                    created_at=now - timedelta(minutes=5), **common) for index in range(3)]
        + [RequestLog(status_code=200, outcome="ok", prompt_tokens=300 * turn, session_id="claude-code-7",
                      session_turn=turn, created_at=now - timedelta(minutes=4, seconds=-turn), **common)
           for turn in range(1, 5)]
        + [RequestLog(status_code=400, outcome="error", prompt_tokens=0, session_id="bad-request", session_turn=1,
                      created_at=now - timedelta(minutes=3), **common)])
    query = DashboardQuery(team=team, range="1h")
    assert sorted(s.session_id for s in agent_sessions(query)) == [
        "claude-code-7", "single-0", "single-1", "single-2"]  # the refused 400 reached no model
    top = dashboard_page(tab="agents", query=query).table("sessions")
    # Every session cost nothing (a free local channel): the four-turn one leads, then the others in a fixed order.
    assert [row[0] for row in top.rows] == ["claude-code-7", "single-0", "single-1", "single-2"]


def test_the_agents_tab_shows_sessions_turns_and_costs(page, live_server, team_setup):
    made = _agent_traffic(team_setup)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/dashboards/agents/")
    expect(page.locator("nav.dash-tabs a.active")).to_have_text("Agents")
    expect(page.locator(".cards")).to_contain_text("Sessions")
    expect(page.locator(".cards .card").first).to_contain_text("2")
    expect(page.locator(".cards .card").first).to_contain_text("10 turns")
    page.wait_for_function("document.getElementById('figure-growth') && document.getElementById('figure-growth').data")
    assert figure_points(page, "growth") == 10
    assert figure_points(page, "shares") == 16
    sessions = page.locator("section[data-table=sessions] tbody tr")
    expect(sessions).to_have_count(2)
    expect(sessions.first).to_contain_text("review-42")
    expect(sessions.first).to_contain_text("review-bot")
    billed = sum(made["local"].cost(2000 * t, 100, 2000 * (t - 1) // 16 * 16) for t in range(1, 9))
    expect(sessions.first.locator("td").nth(7)).to_have_text(money_text(billed))
    expect(page.locator("section[data-table=routes] tbody tr")).to_contain_text("agent")
    expect(page.locator("section[data-table=keys] tbody tr")).to_contain_text("review-bot")
    screenshot(page, "dashboards-agents")
