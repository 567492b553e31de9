"""Serving pages: presets, the profile form's validation (nothing saved on error), config.toml import through the
page, and the three exports."""

import pytest
import yaml
from django.urls import reverse

from panel.registry.services import model_register
from panel.serving import configfile
from panel.serving.models import ServingProfile
from panel.serving.services import profile_values
from tests.support.environment import FIXTURES

SEED = (FIXTURES / "seed_config.toml").read_text()


@pytest.fixture(scope="module")
def demo_model_path(tmp_path_factory):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path_factory.mktemp("pages") / "tiny"
    build_demo_model(path)
    return path


@pytest.fixture
def model(team_setup, demo_model_path):
    return model_register(team=team_setup["team_a"], user=None, source=str(demo_model_path), name="tiny")


def form_data(model, **changes):
    data = {"name": "tiny-latency", "model": model.pk, "served_model_name": "", "dtype": "auto", "quantization": "none",
            "quantization_bits": "", "max_model_len": 2048, "enable_prefix_caching": "on", "block_size": 32,
            "gpu_memory_utilization": 0.9, "swap_space": 0, "max_num_seqs": 16, "max_num_batched_tokens": 2048,
            "enable_chunked_prefill": "on", "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "port": "",
            "extra_args": ""}
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_it_fills_the_form_from_a_preset(client, team_setup, model):
    client.force_login(team_setup["alice"])
    page = client.get(reverse("profile_create") + "?preset=low_latency").content.decode()
    assert "Low latency" in page and 'name="max_num_seqs" value="16"' in page
    page = client.get(reverse("profile_create") + "?preset=high_throughput").content.decode()
    assert 'name="max_num_seqs" value="256"' in page
    assert '<option value="32" selected>' in page  # no GPU host online: the CPU engine's block size


def test_it_saves_a_good_profile_and_warns_outside_the_stable_range(client, team_setup, model):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("profile_create"), form_data(model, gpu_memory_utilization=0.95), follow=True)
    profile = ServingProfile.objects.get()
    assert (profile.team, profile.model, profile.max_num_seqs) == (team_setup["team_a"], model, 16)
    assert "0.85-0.92" in response.content.decode()


@pytest.mark.parametrize("changes, message", [
    ({"tensor_parallel_size": 3}, "does not split"),
    ({"gpu_memory_utilization": 0.3}, "0.5"),
    ({"quantization": "awq", "quantization_bits": 4}, "Quantize it first"),
    ({"max_model_len": 100000, "max_num_batched_tokens": 100000}, "4,096"),
    ({"max_num_seqs": 0}, "greater than or equal to 1"),
    ({"extra_args": "--port 9000"}, "--port"),
    ({"extra_args": "--enforce-eager 'unclosed"}, "extra"),
    ({"name": ""}, "This field is required"),
])
def test_it_refuses_a_bad_profile_and_saves_nothing(client, team_setup, model, changes, message):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("profile_create"), form_data(model, **changes))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert ServingProfile.objects.count() == 0


def test_it_refuses_another_teams_model_in_the_form(client, team_setup, demo_model_path):
    other = model_register(team=team_setup["team_b"], user=None, source=str(demo_model_path), name="theirs")
    client.force_login(team_setup["alice"])
    response = client.post(reverse("profile_create"), form_data(other))
    assert response.status_code == 400 and ServingProfile.objects.count() == 0


def test_it_imports_the_seeds_config_toml_through_the_page(client, team_setup, model):
    client.force_login(team_setup["alice"])
    seed_for_tiny = SEED.replace('"Qwen/Qwen2.5-14B-Instruct"', f'"{model.path}"')
    # The seeds' file as it is asks for AWQ on an unquantized checkpoint: refused, nothing saved.
    response = client.post(reverse("profile_import"), {"name": "seed", "config": seed_for_tiny})
    assert response.status_code == 400 and "Quantize it first" in response.content.decode()
    assert ServingProfile.objects.count() == 0
    unknown = client.post(reverse("profile_import"), {"name": "seed", "config": SEED})
    assert "is not a registered model of this team" in unknown.content.decode()
    broken = client.post(reverse("profile_import"), {"name": "seed", "config": "[model\nname = 1"})
    assert broken.status_code == 400 and ServingProfile.objects.count() == 0
    fixed = (seed_for_tiny.replace('quantization = "awq"', 'quantization = "none"')
             .replace("quantization_bits = 4", "").replace("max_model_len = 8192", "max_model_len = 4096"))
    response = client.post(reverse("profile_import"), {"name": "seed", "config": fixed})
    profile = ServingProfile.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("profile_detail", args=[profile.pk])
    assert (profile.block_size, profile.max_num_seqs, profile.tensor_parallel_size) == (16, 256, 2)


def test_it_exports_config_toml_the_deploy_script_and_yaml(client, team_setup, model):
    profile = ServingProfile.objects.create(team=team_setup["team_a"], name="p", model=model, max_model_len=2048,
                                            block_size=32)
    client.force_login(team_setup["vera"])  # a viewer may read and export
    toml = client.get(reverse("profile_export", args=[profile.pk, "toml"]))
    assert toml["Content-Disposition"] == 'attachment; filename="config.toml"'
    assert configfile.toml_import(toml.content.decode())["max_model_len"] == 2048
    script = client.get(reverse("profile_export", args=[profile.pk, "sh"])).content.decode()
    assert script.startswith("#!/usr/bin/env bash") and "vllm.entrypoints.openai.api_server" in script
    assert "--block-size=32" in script
    config = yaml.safe_load(client.get(reverse("profile_export", args=[profile.pk, "yaml"])).content)
    assert config["max-model-len"] == 2048 and config["model"] == model.path
    assert client.get(reverse("profile_export", args=[profile.pk, "exe"])).status_code == 404
    assert profile_values(profile)["model_name"] == model.path


def test_launching_awq_on_a_cpu_host_nobody_checked_warns_and_says_how_to_find_out(client, team_setup):
    """Allowed (the host may have AVX-512), but the page, the command and the deployment's history say to run
    the engine check first: on a CPU without AVX-512 the engine dies at its first request."""
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.jobs.models import JobEvent
    from panel.registry.models import RegisteredModel
    from panel.serving.models import Deployment

    team = team_setup["team_a"]
    awq = RegisteredModel.objects.create(
        team=team, name="tiny-awq", path="/models/tiny-awq", architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1_000_000, linear_parameter_count=900_000, num_layers=2, num_attention_heads=4,
        num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="float16",
        size_bytes=1_000_000, quantization={"method": "awq", "bits": 4, "group_size": 128})
    profile = ServingProfile.objects.create(team=team, model=awq, name="tiny-awq-cpu", quantization="awq",
                                            quantization_bits=4, max_model_len=2048, block_size=32,
                                            max_num_seqs=8, max_num_batched_tokens=2048)
    WorkerHost.objects.create(name="gpu@cpu-box", host="cpu-box", kind="gpu", queues=["gpu", "gpu.cpu-box"],
                              gpus=[], memory_available_bytes=16 * 1024 ** 3, last_seen=timezone.now())
    client.force_login(team_setup["alice"])
    page = client.post(reverse("deployment_create", args=[profile.pk]), {"host": ""}, follow=True)
    assert page.status_code == 200 and Deployment.objects.count() == 1
    text = page.content.decode()
    assert "Nobody has checked this host&#x27;s engine yet" in text and "Run Check engine on the Workers page" in text
    deployment = Deployment.objects.get()
    event = JobEvent.objects.get(job_id=deployment.pk, job_type=deployment.job_type())
    assert event.reason.startswith("launch on cpu-box requested. Warning: Nobody has checked")
    out = StringIO()
    call_command("deploy", str(profile.pk), stdout=out)
    assert "warning: Nobody has checked this host's engine yet" in out.getvalue()
    assert "scales on queue" not in out.getvalue()
    out = StringIO()
    call_command("deploy", str(profile.pk), "--max-replicas", "3", stdout=out)
    scaled = Deployment.objects.latest("pk")
    assert (scaled.scale_policy.min_replicas, scaled.scale_policy.max_replicas) == (1, 3)
    assert "scales on queue between 1 and 3 replicas" in out.getvalue()
    with pytest.raises(CommandError, match="Scale up to must be between the 2 replicas asked for and 16"):
        call_command("deploy", str(profile.pk), "--replicas", "2", "--max-replicas", "1", stdout=StringIO())
    assert Deployment.objects.count() == 3  # the refused one wrote nothing


def test_every_refused_engine_flag_is_shown_on_the_form_with_its_reason_and_nothing_is_saved(client, team_setup,
                                                                                               model):
    import html

    from panel.serving.engine_flags import REFUSED

    client.force_login(team_setup["alice"])
    for flag, reason in [*REFUSED.items(), ("--bogus-flag", "is not among the engine flags Tokenwise allows")]:
        if configfile._owned_by(flag) is not None:  # --host, --port ...: the profile's own settings say why
            reason = "which the profile already sets"
        response = client.post(reverse("profile_create"), form_data(model, extra_args=f"--enforce-eager {flag} x"))
        page = response.content.decode()
        assert response.status_code == 400, flag
        assert html.escape(flag) in page and html.escape(reason) in page, (flag, reason)
        assert "field-error" in page
    assert ServingProfile.objects.count() == 0


def test_editing_the_profile_of_a_running_deployment_says_it_needs_a_relaunch(client, team_setup):
    from tests.support.channels import make_deployment

    deployment = make_deployment(team_setup["team_a"], team_setup["alice"], "chat", state="ready")
    profile = deployment.profile
    client.force_login(team_setup["alice"])
    page = client.get(reverse("profile_edit", args=[profile.pk]))
    assert f"Deployment #{deployment.pk} runs from this profile" in page.content.decode()
    form = page.context["form"]
    data = {name: ("on" if value is True else value) for name in form.fields
            if (value := form[name].value()) is not False and value is not None}
    saved = client.post(reverse("profile_edit", args=[profile.pk]), dict(data, max_num_seqs=7, max_model_len=4096),
                        follow=True)
    said = [str(message) for message in saved.context["messages"]]
    assert saved.redirect_chain, saved.context["form"].errors
    assert f"Deployment #{deployment.pk} still runs with the settings it was launched with: stop it and launch " \
           f"again to apply these." in said, said
    deployment.state = "stopped"
    deployment.save()
    assert "runs from this profile" not in client.get(reverse("profile_edit", args=[profile.pk])).content.decode()


def test_launching_a_running_profile_asks_first_and_starts_nothing_until_confirmed(client, team_setup):
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.serving.models import Deployment
    from tests.support.channels import make_deployment

    running = make_deployment(team_setup["team_a"], team_setup["alice"], "chat", state="ready")
    profile = running.profile
    ServingProfile.objects.filter(pk=profile.pk).update(max_model_len=2048, block_size=32,
                                                        max_num_batched_tokens=2048)
    WorkerHost.objects.create(name="gpu@box", host="box", kind="gpu", queues=["gpu", "gpu.box"], gpus=[],
                              memory_available_bytes=16 * 1024 ** 3, last_seen=timezone.now())
    client.force_login(team_setup["alice"])
    detail = client.get(reverse("profile_detail", args=[profile.pk])).content.decode()
    assert f"Start another engine beside #{running.pk} (ready)" in detail and ">Launch another</button>" in detail
    refused = client.post(reverse("deployment_create", args=[profile.pk]), {"host": "", "replicas": 1}, follow=True)
    said = [str(message) for message in refused.context["messages"]]
    assert said == [f"This profile already runs as deployment #{running.pk} (ready). Tick “Start another engine” "
                    "to launch a second one beside it, or open the running one."]
    assert list(Deployment.objects.values_list("pk", flat=True)) == [running.pk]
    launched = client.post(reverse("deployment_create", args=[profile.pk]), {"host": "", "replicas": 1,
                                                                               "another": "on"})
    second = Deployment.objects.exclude(pk=running.pk).get()
    assert launched["Location"] == reverse("deployment_detail", args=[second.pk])
    running.refresh_from_db()
    assert running.state == "ready"
    running.state = "stopped"
    running.save()
    second.state = "stopped"
    second.save()
    assert "Start another engine" not in client.get(reverse("profile_detail", args=[profile.pk])).content.decode()
