"""The tiny demo model: built reproducibly, a real checkpoint the engine venv's transformers loads, and a clear
error without an engine venv."""
import hashlib
import io
import json
import os
import re
import subprocess
import textwrap

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from panel.registry.demo_model import DEMO_MODEL_DIRNAME, DemoModelError, build_demo_model

LOAD_AND_GENERATE = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(rendered, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    print(json.dumps({
        "rendered": rendered,
        "new_tokens": output.shape[1] - inputs["input_ids"].shape[1],
        "dtype": str(model.dtype),
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
    }))
""")


def file_digests(folder):
    return {item.name: hashlib.sha256(item.read_bytes()).hexdigest() for item in sorted(folder.iterdir())}


SHORT_STEPS = 12  # a fresh build that proves the builder without a second full training (10 s, not 130 s)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    """One real build per module (training included, not a copy of the cached one), through the command; a short
    one: the run's full build is the cached one (the `demo_model_cache` fixture)."""
    path = tmp_path_factory.mktemp("first") / DEMO_MODEL_DIRNAME
    out = io.StringIO()
    call_command("make_demo_model", str(path), "--force", "--steps", str(SHORT_STEPS), stdout=out)
    return path, out.getvalue()


def test_it_builds_byte_identical_files_twice(demo_model, tmp_path):
    first, output = demo_model
    assert "training tokenizer" in output and f"Demo model at {first}" in output
    assert f"training step {SHORT_STEPS} of {SHORT_STEPS}" in output

    second = tmp_path / DEMO_MODEL_DIRNAME
    result = build_demo_model(second, force=True, steps=SHORT_STEPS)  # a second, independent build

    assert result["path"] == str(second)
    assert file_digests(first) == file_digests(second)
    assert set(file_digests(first)) >= {"config.json", "generation_config.json", "model.safetensors",
                                        "tokenizer.json", "tokenizer_config.json", "training.json"}
    assert [item.name for item in tmp_path.iterdir()] == [DEMO_MODEL_DIRNAME]  # no temporary folder left


def test_it_learned_from_its_corpus(demo_model_cache):
    from panel.registry.demo_model import cache_path

    training = json.loads((cache_path() / "training.json").read_text())  # the run's one full build
    assert training["steps"] == 240 and training["last_loss"] < training["first_loss"] - 2
    # Far below a random model's perplexity on text neither training nor calibration saw.
    assert training["held_out_perplexity"] * 10 < training["random_model_held_out_perplexity"]
    assert training["random_model_held_out_perplexity"] > 1000 and training["held_out_tokens"] > 3000


def test_it_copies_the_cached_build_instead_of_training_again(demo_model_cache, tmp_path):
    from panel.registry.demo_model import cache_path

    copy = build_demo_model(tmp_path / "copy")
    assert copy["reused"] is True and file_digests(tmp_path / "copy") == file_digests(cache_path())
    assert json.loads((tmp_path / "copy" / "training.json").read_text())["steps"] == 240


def test_a_build_with_its_own_steps_is_always_a_fresh_one(tmp_path):
    with pytest.raises(CommandError, match="--steps must be a positive number"):
        call_command("make_demo_model", str(tmp_path / DEMO_MODEL_DIRNAME), "--force", "--steps", "0",
                     stdout=io.StringIO())
    with pytest.raises(DemoModelError, match="always a fresh build"):
        build_demo_model(tmp_path / DEMO_MODEL_DIRNAME, steps=5)
    assert not (tmp_path / DEMO_MODEL_DIRNAME).exists()


def test_it_reuses_a_complete_model(demo_model):
    path, _ = demo_model
    before = file_digests(path)

    result = build_demo_model(path)

    assert result["reused"] is True and result["path"] == str(path)
    assert file_digests(path) == before


def test_it_is_a_small_qwen2_checkpoint(demo_model):
    path, _ = demo_model
    config = json.loads((path / "config.json").read_text())

    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert config["num_hidden_layers"] == 4
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2
    assert config["hidden_size"] % 128 == 0 and config["intermediate_size"] % 128 == 0
    assert config["max_position_embeddings"] == 4096
    assert config["dtype"] == "bfloat16"
    assert (path / "model.safetensors").stat().st_size < 20_000_000
    assert "<|im_start|>" in json.loads((path / "tokenizer_config.json").read_text())["chat_template"]


def test_it_loads_and_generates_in_the_engine_venv(demo_model):
    path, _ = demo_model
    completed = subprocess.run([settings.ENGINE_PYTHON, "-c", LOAD_AND_GENERATE, str(path)], capture_output=True,
                               text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])

    assert report["rendered"].endswith("<|im_start|>assistant\n")
    assert report["rendered"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert report["new_tokens"] == 5
    assert report["dtype"] == "torch.bfloat16"
    assert (report["eos_token"], report["pad_token"]) == ("<|im_end|>", "<|endoftext|>")


def test_it_names_a_missing_engine_python(settings, tmp_path):
    missing = tmp_path / "no-engine-venv" / "bin" / "python"
    settings.ENGINE_PYTHON = str(missing)

    with pytest.raises(CommandError, match=re.escape(f"engine venv not found at {missing}")):
        call_command("make_demo_model", str(tmp_path / DEMO_MODEL_DIRNAME), stdout=io.StringIO())

    assert not (tmp_path / DEMO_MODEL_DIRNAME).exists()
