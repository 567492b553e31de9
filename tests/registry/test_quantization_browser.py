"""In Chromium: register the demo model, pick a scheme on the quantization form (each scheme's size, time and
whether the worker serves it), follow the job's bar inside a layer to done, then its quality report to the model
page, where the quantized model stands beside its parent."""
import pytest
from playwright.sync_api import expect

from tests.support.browser import screenshot, sign_in

pytestmark = pytest.mark.engine  # the demo model, a real quantization on a gpu worker


def test_it_quantizes_from_the_form_and_shows_the_quality_report(page, live_server, team_setup, start_worker,
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
    expect(page.locator("table.quality")).to_contain_text("not measured yet")
    page.click("a.btn:has-text('Quantize')")
    table = page.locator("table.schemes")
    expect(table.locator("tr[data-scheme=w8a8-int8]")).to_contain_text("W8A8 INT8")
    expect(table.locator("tr[data-scheme=fp8-dynamic]")).to_contain_text("no calibration text")
    expect(table).to_contain_text("not known")  # nobody ran this worker's engine check
    expect(page.locator(".page-head + h2 + p")).to_contain_text("embeddings, the LM head and norms stay")
    expect(page.locator("#id_max_calib_samples")).to_have_value("32")  # a CPU worker's default
    page.check("input[name=scheme][value=w8a8-int8]")
    page.fill("#id_smoothquant", "0.5")
    page.fill("#id_max_calib_samples", "128")  # enough calibration to watch the bar move inside a layer
    page.fill("#id_max_calib_seq_len", "512")
    screenshot(page, "quantization-form")
    page.click("text=Start quantization")
    expect(page.locator("h1")).to_contain_text("Quantization #")
    expect(page.locator(".page-head")).to_contain_text("W8A8 INT8 with llm-compressor, SmoothQuant 0.5")
    # The bar moves inside a layer (no reload), then turns green at 100%.
    expect(page.locator(".job-status")).to_contain_text("sample", timeout=180000)
    screenshot(page, "quantization-running")
    expect(page.locator(".pill.state-succeeded")).to_be_visible(timeout=240000)
    expect(page.locator(".progress-bar")).to_have_attribute("style", "width: 100%")
    expect(page.locator(".cards")).to_contain_text("tiny-w8a8-int8-sq")
    screenshot(page, "quantization-done")
    page.click("text=Quality report")
    expect(page.locator("h1")).to_contain_text("Quality report #")
    expect(page.locator(".pill.state-succeeded")).to_be_visible(timeout=480000)
    page.click("text=Open the report")
    expect(page.locator("h1")).to_have_text("tiny-w8a8-int8-sq")
    quality = page.locator("table.quality")
    expect(quality.locator("tr").nth(1)).to_contain_text("tiny (parent)")
    expect(quality.locator("tr.current")).to_contain_text("W8A8 INT8")
    expect(quality.locator("tr.current")).to_contain_text("safe to serve")
    page.locator("#quality").scroll_into_view_if_needed()
    screenshot(page, "model-quality")
