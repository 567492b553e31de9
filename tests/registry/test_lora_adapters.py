"""LoRA adapters registered on their base (panel/registry/adapters.py): the facts come from adapter_config.json and
the safetensors header, each adapted module is matched with the base's weight, and an adapter of another width or
architecture, of another kind than LoRA or with broken files is refused in words with nothing written. From a
folder under the model roots or a pip package installed in the engine venv. A profile's LoRA settings give the
engine its flags (one token each) and are checked; the flags it owns cannot come in by extra_args. The engine test
(tests/serving/test_lora_engine.py) serves a trained adapter."""
import json

import pytest
from django.core.exceptions import ValidationError

from panel.registry.adapters import adapter_delete, adapter_register, rank_fits, read_adapter
from panel.registry.models import LoraAdapter
from panel.registry.services import model_register
from panel.serving.adapters import adapter_load, lora_argv, lora_env, profile_lora_set
from panel.serving.configfile import ConfigFileError
from panel.serving.models import Deployment, DeploymentAdapter, ServingProfile
from panel.serving.services import launch_argv
from tests.support.safetensors import write_safetensors

QWEN = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden": 256, "kv": 128, "inter": 768}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden": 576, "kv": 192, "inter": 1536}


def base_checkpoint(folder, shape, layers=2, mlp=("gate_proj", "up_proj", "down_proj")):
    folder.mkdir(parents=True)
    h, kv, i = shape["hidden"], shape["kv"], shape["inter"]
    tensors = {"model.embed_tokens.weight": ("BF16", [4096, h]), "model.norm.weight": ("BF16", [h])}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        tensors.update({f"{p}.self_attn.q_proj.weight": ("BF16", [h, h]),
                        f"{p}.self_attn.k_proj.weight": ("BF16", [kv, h]),
                        f"{p}.self_attn.v_proj.weight": ("BF16", [kv, h]),
                        f"{p}.self_attn.o_proj.weight": ("BF16", [h, h]),
                        f"{p}.input_layernorm.weight": ("BF16", [h])})
        sizes = {"gate_proj": [i, h], "up_proj": [i, h], "down_proj": [h, i], "fc1": [i, h], "fc2": [h, i]}
        tensors.update({f"{p}.mlp.{name}.weight": ("BF16", sizes[name]) for name in mlp})
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps({
        "architectures": shape["architectures"], "model_type": shape["model_type"], "hidden_size": h,
        "intermediate_size": i, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "vocab_size": 4096, "torch_dtype": "bfloat16"}))
    return folder


def adapter_folder(folder, shape, *, rank=8, modules=("q_proj", "v_proj"), layers=2, config=None, b_rank=None):
    folder.mkdir(parents=True)
    h, kv = shape["hidden"], shape["kv"]
    outs = {"q_proj": h, "k_proj": kv, "v_proj": kv, "o_proj": h, "fc1": shape["inter"]}
    tensors = {}
    for layer in range(layers):
        for module in modules:
            name = f"base_model.model.model.layers.{layer}.{'mlp' if module == 'fc1' else 'self_attn'}.{module}"
            tensors[f"{name}.lora_A.weight"] = ("F32", [rank, h])
            tensors[f"{name}.lora_B.weight"] = ("F32", [outs[module], b_rank or rank])
    write_safetensors(folder / "adapter_model.safetensors", tensors)
    (folder / "adapter_config.json").write_text(json.dumps(config or {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules),
        "base_model_name_or_path": "/elsewhere/tiny", "task_type": "CAUSAL_LM"}))
    return folder


@pytest.fixture
def tiny(team_setup, tmp_path):
    path = base_checkpoint(tmp_path / "tiny", QWEN)
    return model_register(team=team_setup["team_a"], user=None, source=str(path), name="tiny")


def test_it_registers_an_adapter_with_the_facts_of_its_files(team_setup, tiny, tmp_path):
    folder = adapter_folder(tmp_path / "answers", QWEN)
    adapter = adapter_register(team=team_setup["team_a"], user=team_setup["alice"], base=tiny, source=str(folder),
                               served_name="tiny-answers")
    assert (adapter.name, adapter.served_name, adapter.base, adapter.rank, adapter.alpha) == (
        "answers", "tiny-answers", tiny, 8, 16.0)
    assert adapter.target_modules == ["q_proj", "v_proj"] and adapter.hidden_size == 256 and adapter.size_bytes > 0
    assert read_adapter(folder).modules["model.layers.1.self_attn.v_proj"] == (256, 128)
    assert (rank_fits(8), rank_fits(9), rank_fits(600)) == (8, 16, None)


def refused(team, base, source, *, served_name="", **kwargs):
    with pytest.raises(ValidationError) as caught:
        adapter_register(team=team, user=None, base=base, source=str(source), served_name=served_name, **kwargs)
    assert not LoraAdapter.objects.exists()
    return " ".join(caught.value.messages)


def test_an_adapter_that_does_not_fit_its_base_is_refused_in_words_and_nothing_is_written(team_setup, tiny,
                                                                                         tmp_path):
    team = team_setup["team_a"]
    smol = model_register(team=team, user=None, source=str(base_checkpoint(tmp_path / "smol", LLAMA)), name="smol")
    words = refused(team, smol, adapter_folder(tmp_path / "for-tiny", QWEN))
    assert "does not fit smol" in words and "hidden size 256, and smol (llama) has 576" in words, words
    # Another architecture of the same width: a module the base does not have.
    fc = base_checkpoint(tmp_path / "fc-model", QWEN, mlp=("fc1", "fc2"))
    other = model_register(team=team, user=None, source=str(fc), name="fc")
    words = refused(team, other, adapter_folder(tmp_path / "mlp", QWEN, modules=("q_proj", "v_proj", "k_proj"),
                                                layers=3))
    assert "it adapts 3 module(s) fc does not have, such as model.layers.2.self_attn.k_proj" in words, words
    assert "another architecture than Qwen2ForCausalLM" in words
    words = refused(team, tiny, adapter_folder(tmp_path / "ia3", QWEN, config={"peft_type": "IA3", "r": 8}))
    assert "peft_type 'IA3': only LoRA adapters are served by vLLM" in words
    words = refused(team, tiny, adapter_folder(tmp_path / "ranks", QWEN, b_rank=4))
    assert "has rank 4 in adapter_model.safetensors, and adapter_config.json says r = 8" in words
    (tmp_path / "empty").mkdir()
    assert "is not a LoRA adapter: it has no adapter_config.json" in refused(team, tiny, tmp_path / "empty")
    assert "outside the folders models are registered from" in refused(team, tiny, "/etc/adapter")
    assert "neither an absolute path nor a pip package" in refused(team, tiny, "not a/name")
    assert "is the served name of the base model itself" in refused(
        team, tiny, adapter_folder(tmp_path / "same", QWEN), served_name="tiny")
    assert "cannot be a served name" in refused(team, tiny, adapter_folder(tmp_path / "bad", QWEN),
                                                served_name="has space")


def test_an_adapter_comes_from_a_pip_package_in_the_engine_venv(team_setup, tiny, tmp_path, settings):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    adapter_folder(site / "tiny_answers" / "adapter", QWEN)
    info = site / "tiny_answers-0.1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("tiny_answers/adapter/adapter_config.json,,\n"
                                 "tiny_answers/adapter/adapter_model.safetensors,,\n")
    settings.ENGINE_PYTHON = str(tmp_path / "venv" / "bin" / "python")
    team = team_setup["team_a"]
    assert "has tiny-answers 0.1.0, not 0.2" in refused(team, tiny, "tiny-answers==0.2")
    assert "no pip package other-thing is installed in the engine venv" in refused(team, tiny, "other-thing")
    adapter = adapter_register(team=team, user=None, base=tiny, source="tiny-answers==0.1.0")
    assert adapter.path == str((site / "tiny_answers" / "adapter").resolve()) and adapter.name == "adapter"
    assert adapter.source == "tiny-answers==0.1.0"


def test_a_profile_serves_adapters_with_flags_the_panel_owns(team_setup, tiny, tmp_path):
    team = team_setup["team_a"]
    one = adapter_register(team=team, user=None, base=tiny, source=str(adapter_folder(tmp_path / "a.v1", QWEN)),
                           served_name="tiny-a")
    two = adapter_register(team=team, user=None, base=tiny, source=str(adapter_folder(tmp_path / "b", QWEN,
                                                                                      rank=32)))
    profile = ServingProfile.objects.create(team=team, model=tiny, name="tiny-cpu", served_model_name="tiny-chat")
    assert lora_argv(profile) == [] and lora_env(profile) == {}
    with pytest.raises(ValidationError) as caught:
        profile_lora_set(profile=profile, max_loras=0, max_lora_rank=12, adapters=[two])
    assert caught.value.messages == [
        "Largest adapter rank (--max-lora-rank) takes one of 1, 8, 16, 32, 64, 128, 256, 320, 512.",
        "b has rank 32, above the largest rank 12.",
        "Adapters loaded at start need at least one adapter at once (--max-loras)."]
    profile.refresh_from_db()
    assert (profile.max_loras, list(profile.lora_adapters.all())) == (0, [])
    smol = model_register(team=team, user=None, source=str(base_checkpoint(tmp_path / "smol", LLAMA)), name="smol")
    other = ServingProfile.objects.create(team=team, model=smol, name="smol-cpu")
    with pytest.raises(ValidationError, match="a.v1 is an adapter of tiny, not of smol"):
        profile_lora_set(profile=other, max_loras=1, max_lora_rank=8, adapters=[one])

    profile_lora_set(profile=profile, max_loras=2, max_lora_rank=32, adapters=[one, two])
    argv = launch_argv(profile, port=8123, cpu_host=True)
    # On a CPU host one slot more, kept empty: a base request batched with an adapter's would get the last slot's.
    assert argv[argv.index("--enable-lora"):argv.index("--enable-lora") + 5] == [
        "--enable-lora", "--max-loras=3", "--max-lora-rank=32", f"--lora-modules=b={two.path}",
        f"--lora-modules=tiny-a={one.path}"]
    assert lora_env(profile) == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    for flag in ("--max-loras=4", "--enable-lora", "--max-lora-rank=64", "--lora-modules=x=/tmp/x"):
        profile.extra_args = flag
        with pytest.raises(ConfigFileError, match="LoRA settings|reads another model's folder"):
            launch_argv(profile, port=8123, cpu_host=True)
    with pytest.raises(ValidationError, match="loaded at start by the serving profile"):
        adapter_delete(adapter=one)
    assert "2 adapters loaded at start need 2 adapters at once (--max-loras), not 1." in " ".join(pytest.raises(
        ValidationError, profile_lora_set, profile=profile, max_loras=1, max_lora_rank=32,
        adapters=[one, two]).value.messages)

    # A CPU host's engine serves the profile's number at once, no more: the next load is refused before any call.
    three = adapter_register(team=team, user=None, base=tiny, source=str(adapter_folder(tmp_path / "c", QWEN)))
    deployment = Deployment.objects.create(team=team, profile=profile, state="ready", served_model_name="tiny-chat",
                                           base_url="http://127.0.0.1:9/v1")
    for adapter in (one, two):
        DeploymentAdapter.objects.create(deployment=deployment, adapter=adapter, at_start=True)
    with pytest.raises(ValidationError, match="runs on a CPU host and serves 2 adapters, its profile's 2 at once"):
        adapter_load(deployment=deployment, adapter=three)
    assert deployment.adapters.count() == 2


def test_the_pages_and_the_api_register_adapters_and_set_a_profiles_lora(client, team_setup, tiny, tmp_path):
    from django.urls import reverse

    from tests.support.api_helpers import call, token_for

    team, alice = team_setup["team_a"], team_setup["alice"]
    client.force_login(alice)
    page = reverse("model_detail", args=[tiny.pk])
    assert "LoRA adapters" in client.get(page).content.decode()
    # The page refuses in the checker's words and saves nothing; then registers.
    smol_folder = tmp_path / "smol-adapter"
    adapter_folder(smol_folder, LLAMA)
    refused = client.post(reverse("adapter_create", args=[tiny.pk]), {"source": str(smol_folder)})
    assert refused.status_code == 400 and "hidden size 576, and tiny (qwen2) has 256" in refused.content.decode()
    assert not LoraAdapter.objects.exists()
    made = client.post(reverse("adapter_create", args=[tiny.pk]),
                       {"source": str(adapter_folder(tmp_path / "tone", QWEN)), "served_name": "tiny-tone"})
    assert made.status_code == 302 and made["Location"].endswith("#adapters")
    tone = LoraAdapter.objects.get(served_name="tiny-tone")
    assert "tiny-tone" in client.get(page).content.decode()

    # The API: the same check, a viewer may read and not register, the profile's LoRA settings.
    owner, viewer = token_for(alice, team), token_for(team_setup["vera"], team)
    body = {"source": str(adapter_folder(tmp_path / "api", QWEN)), "served_name": "tiny-api"}
    assert call(client, "post", f"/models/{tiny.pk}/adapters", viewer, body).status_code == 403
    wrong = call(client, "post", f"/models/{tiny.pk}/adapters", owner, {"source": str(smol_folder)})
    assert wrong.status_code == 400 and "hidden size 576" in wrong.json()["errors"]["source"][0]
    created = call(client, "post", f"/models/{tiny.pk}/adapters", owner, body)
    assert created.status_code == 201 and created.json()["rank"] == 8, created.json()
    listed = call(client, "get", f"/models/{tiny.pk}/adapters", viewer).json()
    assert [entry["served_name"] for entry in listed] == ["tiny-api", "tiny-tone"]
    profile = ServingProfile.objects.create(team=team, model=tiny, name="tiny-cpu", created_by=alice)
    too_big = call(client, "put", f"/profiles/{profile.pk}/lora", owner,
                   {"max_loras": 2, "max_lora_rank": 1, "adapter_ids": [tone.pk]})
    assert too_big.status_code == 400 and "tone has rank 8, above the largest rank 1." in too_big.json()["detail"]
    done = call(client, "put", f"/profiles/{profile.pk}/lora", owner,
                {"max_loras": 2, "max_lora_rank": 8, "adapter_ids": [tone.pk]})
    assert done.json() == {"profile_id": profile.pk, "max_loras": 2, "max_lora_rank": 8, "adapter_ids": [tone.pk]}
    assert "--lora-modules=tiny-tone=" in client.get(reverse("profile_detail", args=[profile.pk])).content.decode()
    assert call(client, "delete", f"/adapters/{tone.pk}", owner).status_code == 400  # loaded at start
    assert call(client, "delete", f"/adapters/{created.json()['id']}", owner).status_code == 204
    # Registrations and removals are audited, by the page and the API alike; what was refused is not.
    from panel.audit.models import AuditEvent
    audited = list(AuditEvent.objects.filter(action__startswith="adapter_").order_by("pk")
                   .values_list("action", "target", "actor_id"))
    assert audited == [("adapter_registered", "adapter tiny-tone of tiny", alice.pk),
                       ("adapter_registered", "adapter tiny-api of tiny", alice.pk),
                       ("adapter_removed", "adapter tiny-api of tiny", alice.pk)]


@pytest.mark.engine  # vLLM's own parser, in ENGINE_PYTHON
def test_vllm_reads_every_adapter_of_a_profile_although_each_is_its_own_token(team_setup, tiny, tmp_path):
    """`--lora-modules` is a list option: given twice as --flag=value argparse would keep the last; engine/serve.py
    joins the tokens, so vLLM starts with every adapter the profile names (and the check sees them all)."""
    import subprocess


    team = team_setup["team_a"]
    adapters = [adapter_register(team=team, user=None, base=tiny, source=str(adapter_folder(tmp_path / name, QWEN)),
                                 served_name=f"tiny-{name}") for name in ("one.v1", "two")]
    profile = ServingProfile.objects.create(team=team, model=tiny, name="tiny-cpu", served_model_name="tiny-chat")
    profile_lora_set(profile=profile, max_loras=2, max_lora_rank=8, adapters=adapters)
    argv = launch_argv(profile, port=8123, cpu_host=True)
    checked = subprocess.run([*argv[:3], "--check-only", *argv[3:]], capture_output=True, text=True, timeout=300)
    said = json.loads(checked.stdout.strip().splitlines()[-1])
    assert said["problems"] == [], said
    assert (said["set"]["enable_lora"], said["set"]["max_loras"], said["set"]["max_lora_rank"]) == (True, 3, 8)
    modules = said["set"]["lora_modules"]
    assert f"name='tiny-one.v1', path='{adapters[0].path}'" in modules and "name='tiny-two'" in modules, modules
