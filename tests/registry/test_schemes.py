"""Every scheme the quantization form offers works on the host it offers it for: a group size the model's shapes
allow is chosen by default (and one they do not is a form error, not a failed job), the time shown is within a
factor of two of what a job of that size took here, and a job's header names calibration text only when the run
reads some."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.registry.models import QuantizationJob, RegisteredModel
from panel.registry.schemes import expected_seconds, group_size_default, group_size_refusal
from panel.registry.services import model_register, quantization_launch
from tests.support.safetensors import write_safetensors

SMOLLM2 = {"hidden": 576, "intermediate": 1536, "heads": 9, "kv_heads": 3}  # SmolLM2-135M: 576 = 64 x 9
DEMO = {"hidden": 256, "intermediate": 768, "heads": 4, "kv_heads": 2}


def one_layer_checkpoint(folder, *, hidden, intermediate, heads, kv_heads, vocab=64):
    """A Llama checkpoint of one decoder layer with these widths (zeroed weights: only the shapes are read)."""
    folder.mkdir()
    head_dim = hidden // heads
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": 2048, "vocab_size": vocab,
        "torch_dtype": "bfloat16"}))
    layer = "model.layers.0."
    write_safetensors(folder / "model.safetensors", {
        "model.embed_tokens.weight": ("BF16", [vocab, hidden]),
        layer + "self_attn.q_proj.weight": ("BF16", [hidden, hidden]),
        layer + "self_attn.k_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
        layer + "self_attn.v_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
        layer + "self_attn.o_proj.weight": ("BF16", [hidden, hidden]),
        layer + "mlp.gate_proj.weight": ("BF16", [intermediate, hidden]),
        layer + "mlp.up_proj.weight": ("BF16", [intermediate, hidden]),
        layer + "mlp.down_proj.weight": ("BF16", [hidden, intermediate]),
        layer + "input_layernorm.weight": ("BF16", [hidden]),
        "model.norm.weight": ("BF16", [hidden]),
    })
    return folder


@pytest.fixture
def smollm2_shaped(team_setup, tmp_path):
    return model_register(team=team_setup["team_a"], user=team_setup["alice"], name="smol",
                          source=str(one_layer_checkpoint(tmp_path / "smol", **SMOLLM2)))


def test_the_default_group_size_is_the_largest_the_shapes_allow(team_setup, tmp_path, smollm2_shaped):
    demo_shaped = model_register(team=team_setup["team_a"], user=team_setup["alice"], name="demo",
                                 source=str(one_layer_checkpoint(tmp_path / "demo", **DEMO)))
    odd = model_register(team=team_setup["team_a"], user=team_setup["alice"], name="odd", source=str(
        one_layer_checkpoint(tmp_path / "odd", hidden=600, intermediate=1600, heads=10, kv_heads=2)))
    assert group_size_default(demo_shaped) == 128
    assert group_size_default(smollm2_shaped) == 64  # 576 is 4.5 groups of 128
    assert group_size_default(odd) == 0  # 600 = 8 x 75: no group of 32 fits, one scale per output channel

    refusal = group_size_refusal(smollm2_shaped, 128)
    assert "Group size 128 does not divide smol's layer model.layers.0.self_attn.q_proj" in refusal
    assert "576 inputs: 64 is the largest that fits" in refusal
    assert group_size_refusal(smollm2_shaped, 64) is None and group_size_refusal(smollm2_shaped, 0) is None
    assert "choose one scale per output channel" in group_size_refusal(odd, 32)


def test_the_form_picks_the_fitting_group_size_and_refuses_one_that_does_not_fit(client, team_setup,
                                                                               smollm2_shaped,
                                                                               django_capture_on_commit_callbacks):
    client.force_login(team_setup["alice"])
    url = reverse("quantization_create", args=[smollm2_shaped.pk])
    page = client.get(url).content.decode()
    assert '<option value="64" selected>64</option>' in page
    assert '<option value="128">128</option>' in page

    data = {"scheme": "w4a16-gptq", "keep_as": "bf16", "version": "GEMM", "calibration": "builtin",
            "max_calib_samples": 32, "max_calib_seq_len": 256}
    response = client.post(url, dict(data, q_group_size=128))
    assert response.status_code == 400
    assert "Group size 128 does not divide smol&#x27;s layer" in response.content.decode()
    assert QuantizationJob.objects.count() == 0

    # W8A8 has no groups: the size does not matter there. A size that fits starts the job.
    with django_capture_on_commit_callbacks(execute=False):
        assert client.post(url, dict(data, scheme="w8a8-int8", q_group_size=128)).status_code == 302
        assert client.post(url, dict(data, q_group_size=64)).status_code == 302
    assert list(QuantizationJob.objects.order_by("pk").values_list("scheme", "q_group_size")) == [
        ("w8a8-int8", 128), ("w4a16-gptq", 64)]


# Jobs timed with engine/llmc_quantize.py on this 2-core CPU at the form's CPU calibration, 32 samples x 256 tokens
# (docs/benchmarks.md, "Quantization time on the CPU"): (parameters, linear parameters, layers), scheme, seconds.
# Quiet figures where there are some; the 135M GPTQ and the demo AWQ were timed on a busy machine.
DEMO_SIZE, SMOL_SIZE = (5_242_880, 3_145_728, 4), (134_543_808, 106_168_320, 30)
MEASURED = [
    (DEMO_SIZE, "w8a8-int8", 7.4), (DEMO_SIZE, "w4a16-rtn", 7.2), (DEMO_SIZE, "w4a16-gptq", 9.1),
    (DEMO_SIZE, "w4a16-awq", 145.8),
    (SMOL_SIZE, "w8a8-int8", 10.0), (SMOL_SIZE, "w4a16-rtn", 13.6), (SMOL_SIZE, "w4a16-gptq", 381.7),
]


@pytest.mark.parametrize("size, scheme, seconds", MEASURED)
def test_the_time_shown_is_within_a_factor_of_two_of_a_measured_job(size, scheme, seconds):
    parameters, linear, layers = size
    model = RegisteredModel(name="m", parameter_count=parameters, linear_parameter_count=linear, num_layers=layers)
    estimate = expected_seconds(model, scheme, samples=32, tokens=256, device="cpu")
    assert seconds / 2 <= estimate <= seconds * 2, (scheme, estimate, seconds)


def test_the_service_defaults_to_the_fitting_group_size(team_setup, smollm2_shaped):
    launch = {"team": team_setup["team_a"], "user": team_setup["alice"], "source": smollm2_shaped,
              "scheme": "w4a16-awq", "enqueue": False}
    assert quantization_launch(**launch).q_group_size == 64
    with pytest.raises(ValidationError, match="Group size 128 does not divide"):
        quantization_launch(**launch, q_group_size=128)
    assert QuantizationJob.objects.count() == 1


@pytest.mark.parametrize("scheme, smoothquant, header", [
    ("w8a8-int8", None, "no calibration text"),
    ("w4a16-rtn", None, "no calibration text"),
    ("w8a8-int8", 0.5, "calibration: built-in corpus (32 samples × 256 tokens)"),
    ("w4a16-gptq", None, "calibration: built-in corpus (32 samples × 256 tokens)"),
])
def test_a_jobs_header_names_calibration_text_only_when_the_run_reads_some(client, team_setup, smollm2_shaped,
                                                                          scheme, smoothquant, header):
    job = quantization_launch(team=team_setup["team_a"], user=team_setup["alice"], source=smollm2_shaped,
                              scheme=scheme, smoothquant=smoothquant, max_calib_samples=32, max_calib_seq_len=256,
                              enqueue=False)
    client.force_login(team_setup["alice"])
    page = client.get(reverse("quantization_job", args=[job.pk])).content.decode()
    assert header in page
    if header == "no calibration text":
        assert "built-in corpus" not in page and "samples ×" not in page
