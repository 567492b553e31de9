"""Small checkpoints written by hand (config.json and zero-filled safetensors), shaped as a Qwen2 parent and the
children its quantization jobs leave: llm-compressor's compressed-tensors and AutoAWQ's AWQ. They are registered
through the registry's own services, for tests that need a model's facts but no engine."""
import json

import pytest

from panel.registry.inspection import inspect_checkpoint
from panel.registry.models import ModelState, RegisteredModel
from panel.registry.services import model_create, model_register
from tests.support.safetensors import write_safetensors

HIDDEN, INTERMEDIATE, VOCAB = 256, 768, 1000
CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
          "intermediate_size": INTERMEDIATE, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 1, "max_position_embeddings": 4096, "vocab_size": VOCAB, "torch_dtype": "bfloat16"}

# What llm-compressor 0.14 writes into config.json (compressed-tensors), trimmed to the keys Tokenwise reads.
INT8_WEIGHTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None,
                "dynamic": False}
INT8_TOKENS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
LLM_COMPRESSOR_W8A8 = {"quant_method": "compressed-tensors", "format": "int-quantized",
                       "quantization_status": "compressed", "ignore": ["lm_head"],
                       "config_groups": {"group_0": {"targets": ["Linear"], "weights": INT8_WEIGHTS,
                                                     "input_activations": INT8_TOKENS}}}
INT4_GROUPS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
               "dynamic": False}
LLM_COMPRESSOR_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                        "quantization_status": "compressed", "ignore": ["lm_head"],
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": INT4_GROUPS,
                                                      "input_activations": None}}}
# AutoAWQ 0.2.9's GEMM checkpoint.
AUTOAWQ_W4 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def _tensors(quantization_config):
    method = (quantization_config or {}).get("quant_method")
    up = "model.layers.0.mlp.up_proj"
    if method == "awq":  # [in, out / 8] int32, zeros and scales per group of 128 inputs
        linear = {f"{up}.qweight": ("I32", [HIDDEN, INTERMEDIATE // 8]),
                  f"{up}.qzeros": ("I32", [HIDDEN // 128, INTERMEDIATE // 8]),
                  f"{up}.scales": ("F16", [HIDDEN // 128, INTERMEDIATE])}
    elif quantization_config and quantization_config["format"] == "pack-quantized":  # [out, in / 8] int32
        linear = {f"{up}.weight_packed": ("I32", [INTERMEDIATE, HIDDEN // 8]),
                  f"{up}.weight_scale": ("BF16", [INTERMEDIATE, HIDDEN // 128])}
    elif quantization_config:
        linear = {f"{up}.weight": ("I8", [INTERMEDIATE, HIDDEN]), f"{up}.weight_scale": ("BF16", [INTERMEDIATE, 1])}
    else:
        linear = {f"{up}.weight": ("BF16", [INTERMEDIATE, HIDDEN])}
    return {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN]), **linear}


def checkpoint_write(folder, quantization_config=None):
    """A checkpoint folder: the Qwen2 shape above, quantized as `quantization_config` says (None: bf16)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, **({"quantization_config": quantization_config} if quantization_config else {}))
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", _tensors(quantization_config))
    return folder


def parent_register(team, folder, name="tiny"):
    """The unquantized parent, registered as a user does."""
    return model_register(team=team, user=None, source=str(checkpoint_write(folder)), name=name)


def child_register(parent, folder, *, quantization_config, backend, scheme, name):
    """A child as `registry.services.quantized_model_record` registers a finished job's output."""
    facts = inspect_checkpoint(checkpoint_write(folder, quantization_config))
    facts.quantization["backend"] = backend
    if backend != "autoawq":
        facts.quantization.update(scheme=scheme, keep_as=None)
    return model_create(team=parent.team, user=None, name=name, folder=folder, facts=facts, parent=parent)


# A model as a failed check as a model leaves it (after a GGUF import, or a Re-check), and the words every path
# that would serve the parent ("tiny") refuses it in.
CHECK_PROBLEM = "its greedy answer repeats one token (20 of 24 tokens): '!!!!'"
SERVING_REFUSED = ("tiny failed its check as a model (" + CHECK_PROBLEM + "): it cannot be served. Re-check it "
                   "(Models → tiny → Re-check) once its files are fixed, or import it again.")


def check_failed(model):
    """Mark `model` broken with the check's figures, as engine/model_check.py's verdict does."""
    RegisteredModel.objects.filter(pk=model.pk).update(state=ModelState.BROKEN, check_figures={
        "perplexity": 12.0, "tokens_scored": 511, "question": "What is the capital of France? Answer in one word.",
        "answer": "!!!!", "problems": [CHECK_PROBLEM], "max_perplexity": 100})
    model.refresh_from_db()
    return model


# Fixtures of the tests that serve these checkpoints (tests/serving, tests/api): import them by name.
@pytest.fixture
def parent(team_setup, tmp_path):
    return parent_register(team_setup["team_a"], tmp_path / "tiny")


@pytest.fixture
def w8a8(parent, tmp_path):
    return child_register(parent, tmp_path / "tiny-w8a8-int8", quantization_config=LLM_COMPRESSOR_W8A8,
                          backend="llm-compressor", scheme="w8a8-int8", name="tiny-w8a8-int8")
