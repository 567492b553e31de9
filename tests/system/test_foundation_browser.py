"""In Chromium: sign in, see the navigation, switch team, and watch the Workers page show a real worker."""
import pytest
from playwright.sync_api import expect

from panel.accounts.models import Role
from panel.accounts.services import membership_add
from tests.support.browser import screenshot, sign_in

NAVIGATION = ["Overview", "Models", "Quantization", "Serving", "Channels", "Gateway keys", "Dashboards", "Compare",
              "Evaluations", "Benchmarks", "Advisor", "Audit", "Workers"]


def test_it_signs_in_and_shows_the_navigation(page, live_server, team_setup):
    page.goto(f"{live_server.url}/login/")
    screenshot(page, "login")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    expect(page.locator(".message.error")).to_contain_text("correct username and password")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    links = page.locator("nav.sidebar .nav a .label")
    expect(links).to_have_text(NAVIGATION)
    expect(page.locator("h1")).to_have_text("Team A")
    screenshot(page, "home")
    page.click("nav.sidebar >> text=Compare")
    expect(page.locator("h1")).to_have_text("Compare")
    expect(page.locator("nav.sidebar a.active .label")).to_have_text("Compare")


def test_it_switches_team_from_the_top_bar(page, live_server, team_setup):
    membership_add(team=team_setup["team_b"], user=team_setup["alice"], role=Role.VIEWER)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    expect(page.locator(".role-badge")).to_have_text("owner")
    page.select_option("#team-select", label="Team B")
    page.wait_for_load_state()
    expect(page.locator("h1")).to_have_text("Team B")
    expect(page.locator(".role-badge")).to_have_text("viewer")
    expect(page.locator(".message.success")).to_contain_text("Now working in Team B")


@pytest.mark.engine  # a gpu worker
def test_it_shows_a_real_worker_online_and_refreshes_live(page, live_server, team_setup, start_worker):
    sign_in(page, live_server.url, "vera", "pw-vera-123")
    page.click("nav.sidebar >> text=Workers")
    expect(page.locator(".empty h2")).to_have_text("No worker has announced itself yet")
    start_worker("gpu")
    # No reload: the live region polls and picks the worker up.
    expect(page.locator("table.table")).to_contain_text("gpu@testhost", timeout=30000)
    expect(page.locator(".pill.ok")).to_have_text("online")
    expect(page.locator("table.table")).to_contain_text("gpu.testhost")
    # A viewer sees no launch button.
    expect(page.locator("text=Check engine")).to_have_count(0)
    screenshot(page, "workers")


@pytest.mark.engine  # a gpu worker and the engine check
def test_it_runs_an_engine_check_and_shows_its_progress(page, live_server, team_setup, start_worker):
    start_worker("gpu")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/workers/")
    page.click("text=Check engine", timeout=30000)
    expect(page.locator("h1")).to_contain_text("Engine check #")
    expect(page.locator(".pill.state-succeeded")).to_be_visible(timeout=120000)
    expect(page.locator("table.kv")).to_contain_text("0.32.0")
    expect(page.locator(".progress-bar")).to_have_attribute("style", "width: 100%")
    screenshot(page, "engine-check")
