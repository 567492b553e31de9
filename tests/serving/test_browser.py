"""In Chromium: create a profile from a preset, launch it on the real CPU engine, watch it become ready, stop it."""
import pytest
from playwright.sync_api import expect

from panel.registry.services import model_register
from tests.support.browser import screenshot, sign_in

pytestmark = pytest.mark.engine  # the demo model and a real engine on a gpu worker


def test_it_creates_launches_watches_and_stops_a_deployment(page, live_server, team_setup, start_worker, tmp_path):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path / "tiny"
    build_demo_model(path)
    model_register(team=team_setup["team_a"], user=None, source=str(path), name="tiny")
    start_worker("gpu")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Serving")
    page.click("text=Low latency")
    expect(page.locator("#id_max_num_seqs")).to_have_value("16")
    page.fill("#id_name", "tiny-latency")
    page.select_option("#id_model", label="tiny")
    page.fill("#id_max_model_len", "2048")
    page.fill("#id_extra_args", "--enforce-eager")
    screenshot(page, "profile-form")
    page.click("text=Save profile")
    expect(page.locator("h1")).to_have_text("tiny-latency")
    expect(page.locator("pre.command")).to_contain_text("--max-num-seqs=16")
    screenshot(page, "profile-detail")
    page.click("button:has-text('Launch')")
    expect(page.locator("h1")).to_contain_text("Deployment #")
    expect(page.locator(".job-status .pill")).to_have_text("Starting", timeout=30000)
    expect(page.locator(".job-status .pill")).to_have_text("Ready", timeout=240000)
    expect(page.locator("table.kv")).to_contain_text("Prefix caching")
    expect(page.locator(".job-status")).to_contain_text("serving tiny at http://127.0.0.1:")
    screenshot(page, "deployment-ready")
    asked = []
    page.once("dialog", lambda dialog: asked.append(dialog.message) or dialog.dismiss())
    page.click("button:has-text('Stop')")  # dismissed: nothing stops
    assert asked and "Stop tiny" in asked[0]
    expect(page.locator(".job-status .pill")).to_have_text("Ready")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Stop')")
    expect(page.locator(".job-status .pill")).to_have_text("Stopped", timeout=60000)
    expect(page.locator("#deployment-stopping")).to_have_count(0)  # the notice goes once it has stopped
    expect(page.locator(".message", has_text="Stopping")).to_have_count(0)
    screenshot(page, "deployment-stopped")
