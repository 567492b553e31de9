"""In Chromium: a LoRA adapter registered on a model's page (refused first, in the checker's words), chosen in a
profile's LoRA settings, whose launch command then carries it; a deployment's page lists what its engine serves.
The engine itself is tests/serving/test_lora_engine.py's."""
from playwright.sync_api import expect

from panel.registry.services import model_register
from panel.serving.models import Deployment, DeploymentAdapter, ServingProfile
from tests.registry.test_lora_adapters import LLAMA, QWEN, adapter_folder, base_checkpoint
from tests.support.browser import screenshot, sign_in


def test_an_adapter_is_registered_chosen_for_a_profile_and_shown_on_its_deployment(page, live_server, team_setup,
                                                                                   tmp_path):
    team, alice = team_setup["team_a"], team_setup["alice"]
    tiny = model_register(team=team, user=alice, source=str(base_checkpoint(tmp_path / "tiny", QWEN)), name="tiny")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/models/{tiny.pk}/")
    page.fill("#adapter-form #id_source", str(adapter_folder(tmp_path / "smol-tone", LLAMA)))
    page.click("text=Register adapter")
    expect(page.locator("#adapter-form")).to_contain_text("hidden size 576, and tiny (qwen2) has 256")
    page.fill("#adapter-form #id_source", str(adapter_folder(tmp_path / "support-tone", QWEN)))
    page.fill("#adapter-form #id_served_name", "tiny-support")
    page.click("text=Register adapter")
    expect(page.locator("table").filter(has_text="tiny-support")).to_contain_text("q_proj, v_proj")
    screenshot(page, "lora-model-adapters")

    profile = ServingProfile.objects.create(team=team, model=tiny, name="tiny-cpu", served_model_name="tiny-chat",
                                            created_by=alice)
    page.goto(f"{live_server.url}/serving/profiles/{profile.pk}/")
    page.click("text=Change LoRA settings")
    page.fill("#id_max_loras", "2")
    page.select_option("#id_max_lora_rank", "8")
    page.check("text=support-tone (served as tiny-support, rank 8)")
    page.click("text=Save LoRA settings")
    expect(page.locator("pre.command")).to_contain_text("--enable-lora --max-loras=2 --max-lora-rank=8 "
                                                        "--lora-modules=tiny-support=")
    screenshot(page, "lora-profile")

    deployment = Deployment.objects.create(team=team, profile=profile, state="ready", served_model_name="tiny-chat",
                                           base_url="http://127.0.0.1:9/v1")
    DeploymentAdapter.objects.create(deployment=deployment, adapter=profile.lora_adapters.get(), at_start=True)
    page.goto(f"{live_server.url}/serving/deployments/{deployment.pk}/")
    expect(page.locator("#adapters")).to_contain_text("tiny-support")
    expect(page.locator("#adapters")).to_contain_text("at start")
    screenshot(page, "lora-deployment")
