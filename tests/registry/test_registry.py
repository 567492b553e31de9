"""The model registry: reading checkpoints without loading them, hub cache look-ups, memory estimates, and
forms that refuse bad input and save nothing."""
import json
import shutil
import struct
import tempfile

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.registry import memory
from panel.registry.hub import resolve_hub_id
from panel.registry.inspection import CheckpointError, inspect_checkpoint
from panel.registry.models import RegisteredModel
from panel.registry.services import model_register
from tests.support.safetensors import write_safetensors


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path_factory.mktemp("registry") / "tiny"
    build_demo_model(path)
    return path


def test_it_reads_the_demo_models_shape(demo_model):
    facts = inspect_checkpoint(demo_model)
    config = json.loads((demo_model / "config.json").read_text())
    assert facts.architecture == "Qwen2ForCausalLM" and facts.model_type == "qwen2"
    assert (facts.num_layers, facts.num_attention_heads, facts.num_kv_heads) == (
        config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"])
    assert facts.head_dim == config["hidden_size"] // config["num_attention_heads"]
    assert facts.max_position_embeddings == config["max_position_embeddings"]
    assert facts.quantization == {} and facts.dtype == "bfloat16"
    # Parameters by hand from the config: embeddings, LM head, and per layer q/k/v (with biases), o, MLP, norms.
    h, i = config["hidden_size"], config["intermediate_size"]
    v, layers = config["vocab_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    attention = h * h + h + 2 * (h * kv + kv) + h * h
    per_layer = attention + 3 * h * i + 2 * h
    expected = v * h * 2 + layers * per_layer + h
    assert facts.parameter_count == expected
    assert facts.linear_parameter_count == layers * (2 * h * h + 2 * h * kv + 3 * h * i)
    assert facts.size_bytes > facts.parameter_count * 2


def test_it_recognises_an_awq_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "max_position_embeddings": 4096, "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                                "version": "gemm"}}))
    write_safetensors(tmp_path / "model.safetensors", {
        "model.layers.0.mlp.up_proj.qweight": ("I32", [256, 96]),  # 256 x 768 packed 8 per int32
        "model.layers.0.mlp.up_proj.qzeros": ("I32", [2, 96]),
        "model.layers.0.mlp.up_proj.scales": ("F16", [2, 768]),
        "model.embed_tokens.weight": ("F16", [100, 256]),
    })
    facts = inspect_checkpoint(tmp_path)
    assert facts.quantization["method"] == "awq" and facts.quantization["bits"] == 4
    assert facts.quantization["group_size"] == 128
    assert facts.parameter_count == 256 * 768 + 100 * 256
    assert facts.linear_parameter_count == 256 * 768


def test_it_recognises_a_gptq_quantize_config(demo_model, tmp_path):
    folder = tmp_path / "gptq"
    shutil.copytree(demo_model, folder)
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    assert inspect_checkpoint(folder).quantization["method"] == "gptq"


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text("x"), "is a file"),
    (lambda p: p.mkdir(), "has no config.json"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{not json")), "config.json is not valid JSON (line 1"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("[1, 2]")), "not a JSON object"),
    (lambda p: (p.mkdir(), (p / "config.json").write_bytes(b"\xff\xfe")), "not UTF-8"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}")), "has no .safetensors weights"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}"), (p / "pytorch_model.bin").write_bytes(b"x")),
     "only .bin/.pt weights"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}"), (p / "m.safetensors").write_bytes(b"\x05")),
     "is truncated"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}"),
                (p / "m.safetensors").write_bytes(struct.pack("<Q", 5) + b"nope!")), "corrupt header"),
])
def test_it_explains_what_is_wrong_with_a_folder(tmp_path, make, message):
    target = tmp_path / "candidate"
    make(target)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(".", r"\.")):
        inspect_checkpoint(target)


def test_it_refuses_a_config_without_sizes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [2, 2])})
    with pytest.raises(CheckpointError, match="not a decoder-only language model"):
        inspect_checkpoint(tmp_path)


def test_it_finds_a_hub_id_only_in_the_local_cache(demo_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(Exception, match="is not in the local hub cache .* never downloads"):
        resolve_hub_id("Qwen/Qwen2.5-7B-Instruct")
    repo = tmp_path / "hub" / "models--acme--tiny"
    shutil.copytree(demo_model, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert resolve_hub_id("acme/tiny") == repo / "snapshots" / "abc123"


def test_it_estimates_memory_by_hand(db):
    model = RegisteredModel(parameter_count=7_000_000_000, linear_parameter_count=6_500_000_000, num_layers=28,
                            num_kv_heads=4, head_dim=128, max_position_embeddings=32768)
    assert memory.kv_bytes_per_token(layers=28, kv_heads=4, head_dim=128) == 2 * 28 * 4 * 128 * 2 == 57344
    assert memory.weight_bytes(parameters=7e9, linear_parameters=6.5e9, precision="fp16") == 14e9
    assert memory.weight_bytes(parameters=7e9, linear_parameters=6.5e9, precision="fp8") == 6.5e9 + 1e9
    int4 = memory.weight_bytes(parameters=7e9, linear_parameters=6.5e9, precision="int4")
    assert int4 == int(6.5e9 * (0.5 + 2.5 / 128)) + 1e9
    estimate = memory.estimate(model)
    fp16_24gb = estimate["rows"][0]["cells"][0]
    expected = int((24 * 2**30 * 0.9 - 14e9 - 1.5 * 2**30) // 57344)  # about 133K tokens
    assert fp16_24gb["fits"] and fp16_24gb["tokens"] == expected
    assert fp16_24gb["full_sequences"] == expected // 32768
    int4_80gb = estimate["rows"][2]["cells"][2]
    assert int4_80gb["tokens"] == int((80 * 2**30 * 0.9 - int4 - 1.5 * 2**30) // 57344)
    assert 0.6 < estimate["rows"][2]["saving"] < 0.75
    big = RegisteredModel(parameter_count=14_000_000_000, linear_parameter_count=13_000_000_000, num_layers=48,
                          num_kv_heads=8, head_dim=128, max_position_embeddings=32768)
    cells = memory.estimate(big)["rows"][0]["cells"]
    assert [cell["fits"] for cell in cells] == [False, True, True, True]  # 28 GB of FP16 weights
    assert cells[0]["tokens"] == 0


def test_it_registers_a_model_and_shows_its_page(client, team_setup, demo_model):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("model_create"), {"source": str(demo_model), "name": "tiny"})
    model = RegisteredModel.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("model_detail", args=[model.pk])
    assert model.team == team_setup["team_a"] and model.path == str(demo_model)
    page = client.get(response["Location"]).content.decode()
    assert "What fits where" in page and "KV cache per token" in page and "Quantize" in page and "Quality" in page


def sparse_checkpoint(folder, *, layers, layers_in_files):
    """SmolLM2-135M's shape (576 wide, 49,152 tokens) with `layers` in config.json and the weights of the first
    `layers_in_files` in its file: zero-filled and sparse on disk (inspection reads the header only)."""
    import json
    import struct

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": layers,
        "max_position_embeddings": 8192, "vocab_size": 49152, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"}))
    shapes = {"model.embed_tokens.weight": [49152, 576], "model.norm.weight": [576]}
    for layer in range(layers_in_files):
        prefix = f"model.layers.{layer}."
        shapes.update({prefix + "self_attn.q_proj.weight": [576, 576], prefix + "self_attn.k_proj.weight": [192, 576],
                       prefix + "self_attn.v_proj.weight": [192, 576], prefix + "self_attn.o_proj.weight": [576, 576],
                       prefix + "mlp.gate_proj.weight": [1536, 576], prefix + "mlp.up_proj.weight": [1536, 576],
                       prefix + "mlp.down_proj.weight": [576, 1536]})
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)
    return folder


def test_registering_a_folder_of_a_real_models_size_queues_its_check_as_a_model(client, team_setup, demo_model,
                                                                                 tmp_path):
    from panel.registry.models import ModelCheckJob

    folder = sparse_checkpoint(tmp_path / "smol", layers=30, layers_in_files=30)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("model_create"), {"source": str(folder), "name": "smol"}, follow=True)
    model = RegisteredModel.objects.get(name="smol")
    [job] = ModelCheckJob.objects.filter(model=model)
    assert model.parameter_count >= 100_000_000 and job.state == "pending" and job.queue == "gpu"
    assert "It is being checked as a model on a GPU worker" in response.content.decode()
    assert f"Check #{job.pk} of smol: it stays ready" in response.content.decode()  # its first check, no re-check
    # The demo model is too small for the check's bounds: registered without one.
    tiny = model_register(team=team_setup["team_a"], user=None, source=str(demo_model), name="tiny")
    assert not ModelCheckJob.objects.filter(model=tiny).exists()


def test_a_folder_whose_files_lack_most_of_its_weights_is_refused_and_nothing_is_saved(client, team_setup, tmp_path):
    folder = sparse_checkpoint(tmp_path / "cut", layers=30, layers_in_files=2)  # a copy that stopped early
    client.force_login(team_setup["alice"])
    response = client.post(reverse("model_create"), {"source": str(folder), "name": "cut"})
    assert response.status_code == 400
    assert ("Its weight files hold 7,077,888 of the 106,168,320 decoder weights its config.json describes (7%): "
            "shards are missing or a copy did not finish") in response.content.decode()
    assert not RegisteredModel.objects.exists()


@pytest.mark.parametrize("source, message", [
    ("", "This field is required"),
    ("models/qwen/7b", "neither an absolute path nor a hub id"),
    ("/nonexistent/model", "is outside the folders models are registered from"),
    (tempfile.gettempdir() + "/nonexistent/model", "does not exist"),
    ("nobody/nothing", "is not in the local hub cache"),
])
def test_it_refuses_bad_sources_and_saves_nothing(client, team_setup, source, message):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("model_create"), {"source": source})
    assert response.status_code == 400
    assert message in response.content.decode()
    assert RegisteredModel.objects.count() == 0


def test_it_refuses_a_duplicate_name(team_setup, demo_model):
    model_register(team=team_setup["team_a"], user=None, source=str(demo_model), name="tiny")
    with pytest.raises(ValidationError, match="already has a model named 'tiny'"):
        model_register(team=team_setup["team_a"], user=None, source=str(demo_model), name="tiny")
    # Another team may use the name, but not team A's folder (it reads as missing: nothing to learn from).
    with pytest.raises(ValidationError, match="does not exist"):
        model_register(team=team_setup["team_b"], user=None, source=str(demo_model), name="tiny")
    copy = demo_model.parent / "tiny-copy"
    shutil.copytree(demo_model, copy)
    model_register(team=team_setup["team_b"], user=None, source=str(copy), name="tiny")
    assert RegisteredModel.objects.count() == 2


def test_it_hides_another_teams_model(client, team_setup, demo_model):
    model = model_register(team=team_setup["team_b"], user=None, source=str(demo_model))
    client.force_login(team_setup["alice"])
    assert client.get(reverse("model_detail", args=[model.pk])).status_code == 404
    assert client.get(reverse("quantization_create", args=[model.pk])).status_code == 404


def test_it_keeps_viewers_from_registering(client, team_setup, demo_model):
    client.force_login(team_setup["vera"])
    assert client.post(reverse("model_create"), {"source": str(demo_model)}).status_code == 403
    assert RegisteredModel.objects.count() == 0


def test_the_pages_describe_quantization_as_it_is_now(client, team_setup):
    """Home, Models and Quantization once promised "AWQ quantization jobs ... about 70%": the product quantizes in
    several schemes, each with a quality report."""
    client.force_login(team_setup["alice"])
    for name in ("home", "models", "quantization"):
        text = client.get(reverse(name)).content.decode()
        assert "70%" not in text and "AWQ quantization jobs" not in text and "AWQ jobs" not in text, name
        assert "quality report" in text, name
