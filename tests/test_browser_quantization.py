"""In Chromium: register the demo model, launch a quantization job from the form, watch the bar reach done."""
from playwright.sync_api import expect

from tests.browser import screenshot, sign_in


def test_it_launches_a_job_from_the_form_and_follows_it_to_done(page, live_server, team_setup, start_worker,
                                                                 tmp_path):
    from panel.registry.demo_model import build_demo_model

    model_path = tmp_path / "tiny"
    build_demo_model(model_path)
    start_worker("gpu")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Models")
    page.fill("#id_source", str(model_path))
    page.fill("#id_name", "tiny")
    page.click("button:has-text('Register')")
    expect(page.locator("h1")).to_have_text("tiny")
    expect(page.locator("table.fit")).to_contain_text("INT4 (AWQ, g128)")
    screenshot(page, "model-detail")
    page.click("text=Quantize with AWQ")
    page.fill("#id_max_calib_samples", "32")
    page.fill("#id_max_calib_seq_len", "256")
    screenshot(page, "quantization-form")
    page.click("text=Start quantization")
    expect(page.locator("h1")).to_contain_text("Quantization #")
    bar = page.locator(".progress-bar")
    # The bar moves while the job runs (no reload), then turns green at 100%.
    expect(page.locator(".job-status")).to_contain_text("calibrating layer", timeout=120000)
    screenshot(page, "quantization-running")
    expect(page.locator(".pill.state-succeeded")).to_be_visible(timeout=240000)
    expect(bar).to_have_attribute("style", "width: 100%")
    expect(page.locator(".cards")).to_contain_text("tiny-awq-w4-g128")
    screenshot(page, "quantization-done")
    page.click("text=Open it →")
    expect(page.locator("h1")).to_have_text("tiny-awq-w4-g128")
    expect(page.locator(".crumbs")).to_contain_text("tiny")
