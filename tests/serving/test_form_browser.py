"""In Chromium: the serving-profile form as a new user meets it. Its default max model length once was 8,192 for
the demo model's 4,096 positions (refused), it answered errors in rounds, and the launch preview said --port 8000
while the settings said the port is picked at launch."""
import pytest
from playwright.sync_api import expect

from panel.registry.services import model_register
from panel.serving.models import ServingProfile
from tests.support.browser import screenshot, sign_in

pytestmark = pytest.mark.engine  # each test builds the demo model


def test_the_profile_form_defaults_from_the_model_and_answers_every_error_at_once(page, live_server, team_setup,
                                                                                  tmp_path):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path / "tiny"
    build_demo_model(path)
    model = model_register(team=team_setup["team_a"], user=None, source=str(path), name="tiny")
    assert model.max_position_embeddings == 4096
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/serving/profiles/new/")
    expect(page.locator("#id_model")).to_have_value(str(model.pk))
    expect(page.locator("#id_max_model_len")).to_have_value("4096")

    page.fill("#id_name", "tiny-all-at-once")
    page.fill("#id_gpu_memory_utilization", "1.5")
    page.fill("#id_max_model_len", "100000")
    page.fill("#id_tensor_parallel_size", "3")
    page.click("text=Save profile")
    for field in ("gpu_memory_utilization", "max_model_len", "tensor_parallel_size"):
        expect(page.locator(f"#id_{field}").locator("xpath=ancestor::*[contains(@class,'field')][1]")
               .locator(".field-error")).not_to_have_count(0)
    screenshot(page, "profile-form-all-errors")
    assert not ServingProfile.objects.exists()

    page.fill("#id_gpu_memory_utilization", "0.9")
    page.fill("#id_max_model_len", "")  # empty: the model's own length
    page.fill("#id_tensor_parallel_size", "1")
    page.click("text=Save profile")
    expect(page.locator("h1")).to_have_text("tiny-all-at-once")
    assert ServingProfile.objects.get().max_model_len == 4096
    command = page.locator("pre.command")
    expect(command).to_contain_text("--port=<picked at launch>")
    expect(command).not_to_contain_text("--port=8000")
    screenshot(page, "profile-detail")


def test_the_model_list_says_who_registered_each_model_and_where_its_folder_is(page, live_server, team_setup,
                                                                              tmp_path):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path / "demo"
    build_demo_model(path)
    model_register(team=team_setup["team_a"], user=team_setup["alice"], source=str(path), name="demo")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Models")
    origin = page.locator("tr", has_text="demo").locator(".model-origin")
    expect(origin).to_contain_text("registered by alice")
    expect(origin).to_contain_text(str(path))
    screenshot(page, "models")
