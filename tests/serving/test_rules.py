"""The serving rules: each one fires on a profile made to trigger it, with a reason in words, and stays quiet on
a good profile. Models are RegisteredModel instances built in memory (never saved)."""
import json

import pytest

from panel.registry import memory
from panel.registry.models import RegisteredModel
from panel.serving.profile_fields import PRESETS, defaults
from panel.serving.rules import check_profile, suggest_quantization, suggest_values

GIB = memory.GIB
AWQ = {"method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def qwen14b(**changes):
    """The seeds' 14B example (Qwen2.5-14B-Instruct's shape: 40 heads, 8 KV heads)."""
    facts = dict(name="qwen2.5-14b", hub_id="Qwen/Qwen2.5-14B-Instruct", path="/models/qwen2.5-14b",
                 parameter_count=14_770_000_000, linear_parameter_count=13_210_000_000, num_layers=48,
                 num_attention_heads=40, num_kv_heads=8, hidden_size=5120, head_dim=128,
                 max_position_embeddings=32768, dtype="bfloat16", quantization={})
    facts.update(changes)
    return RegisteredModel(**facts)


def tiny(**changes):
    """The demo model's shape: 4 layers, 4 heads, 2 KV heads, 4096 positions, 5.2 M parameters."""
    facts = dict(name="tiny", path="/models/tiny", parameter_count=5_247_232, linear_parameter_count=3_145_728,
                 num_layers=4, num_attention_heads=4, num_kv_heads=2, hidden_size=256, head_dim=64,
                 max_position_embeddings=4096, dtype="bfloat16", quantization={})
    facts.update(changes)
    return RegisteredModel(**facts)


def gpu_host(count=2, gib=24):
    return {"kind": "gpu", "gpus": [{"memory_bytes": gib * GIB}] * count, "memory_available_bytes": 64 * GIB,
            "serves_awq": None}


def cpu_host(serves_awq=None, available_gib=8):
    return {"kind": "cpu", "gpus": [], "memory_available_bytes": available_gib * GIB, "serves_awq": serves_awq}


def seeds_profile(**changes):
    """Seeds §3.1 for the AWQ checkpoint of the 14B model, with swap_space 0 (this vLLM has none)."""
    values = {**defaults(), "model_name": "Qwen/Qwen2.5-14B-Instruct", "dtype": "float16", "quantization": "awq",
              "quantization_bits": 4, "max_model_len": 8192, "gpu_memory_utilization": 0.90,
              "tensor_parallel_size": 2, "max_num_seqs": 256, "max_num_batched_tokens": 8192}
    values.update(changes)
    return values


def check(values=None, model=None, host="gpu", **keywords):
    host = gpu_host() if host == "gpu" else host
    return check_profile(values or seeds_profile(), model=model or qwen14b(quantization=AWQ), host=host, **keywords)


def messages(verdict, field):
    return "\n".join(verdict.errors.get(field, []))


def test_it_passes_the_seeds_profile_quietly():
    verdict = check()
    assert verdict.ok and verdict.errors == {} and verdict.warnings == []
    assert check(host=None).ok
    tiny_on_cpu = check_profile({**defaults(), "model_name": "/models/tiny", "max_model_len": 4096,
                                 "block_size": 32}, model=tiny(), host=cpu_host())
    assert tiny_on_cpu.ok and tiny_on_cpu.warnings == []


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_it_passes_each_preset(preset):
    assert set(PRESETS[preset]) == {"label", "description", "values"}
    verdict = check(seeds_profile(**PRESETS[preset]["values"]))
    assert verdict.ok and verdict.warnings == []


def test_it_refuses_a_tensor_parallel_size_that_does_not_divide_the_heads():
    verdict = check(seeds_profile(tensor_parallel_size=3), host=gpu_host(count=4))
    text = messages(verdict, "tensor_parallel_size")
    assert "40 attention heads" in text and "8 KV heads" in text and "refuses to start" in text
    assert "Use 1, 2, 4 or 8." in text
    # 48 heads split by 8, but 12 KV heads neither split by 8 nor replicate evenly onto 8 GPUs.
    odd = qwen14b(num_attention_heads=48, num_kv_heads=12, quantization=AWQ)
    text = messages(check(seeds_profile(tensor_parallel_size=8), model=odd, host=gpu_host(count=8)),
                    "tensor_parallel_size")
    assert "48 attention heads and 12 KV heads" in text and "Use 1, 2, 3, 4 or 6." in text
    # vLLM replicates KV heads when the GPU count is a multiple of them: 32 heads, 4 KV heads on 8 GPUs runs.
    replicated = qwen14b(num_attention_heads=32, num_kv_heads=4, quantization=AWQ)
    assert check(seeds_profile(tensor_parallel_size=8), model=replicated, host=gpu_host(count=8)).ok


@pytest.mark.parametrize("utilization, error, warning", [
    (0.88, False, False), (0.85, False, False), (0.92, False, False), (0.95, False, True), (0.80, False, True),
    (0.99, True, False), (0.45, True, False)])
def test_it_checks_gpu_memory_utilization(utilization, error, warning):
    verdict = check(seeds_profile(gpu_memory_utilization=utilization))
    assert ("gpu_memory_utilization" in verdict.errors) is error
    assert any("0.85-0.92" in text and "stable" in text for text in verdict.warnings) is warning
    if error:
        assert "outside 0.5-0.98" in messages(verdict, "gpu_memory_utilization")


@pytest.mark.parametrize("wanted", ["gptq", "fp8", "none"])
def test_it_holds_an_already_quantized_checkpoint_to_its_method(wanted):
    bits = {"gptq": 4, "fp8": 8, "none": None}[wanted]
    text = messages(check(seeds_profile(quantization=wanted, quantization_bits=bits)), "quantization")
    assert "qwen2.5-14b is already quantized (AWQ 4-bit g128)" in text
    assert 'set quantization to "awq"' in text.lower() and "reads the method from the checkpoint" in text
    if wanted != "none":
        assert "twice is refused" in text


def test_it_sends_an_unquantized_model_to_a_quantization_job():
    for method in ("awq", "gptq"):
        verdict = check(seeds_profile(quantization=method), model=qwen14b())
        assert "Quantize it first: Models → qwen2.5-14b → Quantize" in messages(verdict, "quantization")
    assert check(seeds_profile(quantization="none", quantization_bits=None, tensor_parallel_size=2),
                 model=qwen14b(), host=gpu_host(count=2, gib=80)).ok


def test_it_refuses_a_context_longer_than_the_model_supports():
    text = messages(check(seeds_profile(max_model_len=65536, max_num_batched_tokens=65536)), "max_model_len")
    assert "65,536" in text and "32,768 positions" in text
    assert check(seeds_profile(max_model_len=32768, max_num_batched_tokens=32768)).ok


def test_it_refuses_awq_on_a_cpu_engine_without_the_kernel():
    model = tiny(quantization=AWQ, name="tiny-awq")
    values = {**defaults(), "quantization": "awq", "quantization_bits": 4, "max_model_len": 4096, "block_size": 32}
    text = messages(check(values, model=model, host=cpu_host(serves_awq=False)), "quantization")
    assert "cpu_gemm_wna16" in text and "AVX-512" in text and "dies at the first request" in text
    assert "FP16/BF16 parent" in text
    assert check(values, model=model, host=cpu_host(serves_awq=True)).ok
    assert check(values, model=model, host=cpu_host(serves_awq=True)).warnings == []
    unknown = check(values, model=model, host=cpu_host(serves_awq=None))  # never checked: allowed, with a warning
    assert unknown.ok and len(unknown.warnings) == 1 and "Run Check engine on the Workers page" in unknown.warnings[0]
    assert check(values, model=model, host=gpu_host(count=1)).ok


def test_it_refuses_fp8_on_a_cpu_engine():
    values = {**defaults(), "quantization": "fp8", "quantization_bits": 8, "max_model_len": 4096}
    assert "cannot quantize weights to FP8 as it loads them" in messages(check(values, model=tiny(), host=cpu_host()),
                                                                         "quantization")
    assert check(values, model=tiny(), host=gpu_host(count=1)).ok


def test_it_refuses_bitsandbytes_which_this_vllm_dropped():
    text = messages(check(seeds_profile(quantization="bitsandbytes"), model=qwen14b()), "quantization")
    assert "Unknown quantization method: bitsandbytes" in text


@pytest.mark.parametrize("quantization, bits, ok", [
    ("awq", 4, True), ("awq", 8, False), ("awq", None, False), ("gptq", 4, True), ("gptq", 8, True),
    ("fp8", 8, True), ("fp8", 4, False), ("none", None, True), ("none", 4, False)])
def test_it_checks_quantization_bits(quantization, bits, ok):
    model = qwen14b(quantization={"method": quantization, "bits": bits} if quantization in ("awq", "gptq") else {})
    verdict = check(seeds_profile(quantization=quantization, quantization_bits=bits), model=model,
                    host=gpu_host(count=2, gib=80))
    assert ("quantization_bits" not in verdict.errors) is ok, verdict.errors
    assert verdict.ok is ok


def test_it_refuses_bits_that_differ_from_the_checkpoint():
    text = messages(check(seeds_profile(quantization="gptq", quantization_bits=8),
                          model=qwen14b(quantization={"method": "gptq", "bits": 4})), "quantization_bits")
    assert "holds 4-bit weights" in text


def test_it_checks_that_the_weights_fit_the_gpus():
    fp16 = seeds_profile(quantization="none", quantization_bits=None, tensor_parallel_size=1)
    text = messages(check(fp16, model=qwen14b(), host=gpu_host(count=1)), "__all__")
    # 14.77e9 parameters x 2 bytes = 27.5 GiB; 0.90 x 24 GiB = 21.6 GiB.
    assert "27.5 GiB of 16-bit weights per GPU (split over 1)" in text
    assert "0.90 × 24.0 GiB = 21.6 GiB per GPU" in text and "AWQ" in text
    assert check(fp16, model=qwen14b(), host=gpu_host(count=1, gib=80)).ok
    assert check(seeds_profile(tensor_parallel_size=1)).ok  # AWQ: about 9.3 GiB
    text = messages(check(seeds_profile(tensor_parallel_size=4)), "tensor_parallel_size")
    assert "= 4 GPUs, but this host has 2" in text
    text = messages(check(seeds_profile(tensor_parallel_size=2, pipeline_parallel_size=2)), "tensor_parallel_size")
    assert "= 4 GPUs, but this host has 2" in text


def test_it_checks_that_one_full_sequence_fits_the_kv_cache():
    # AWQ weights (~9.3 GiB) + 1.5 GiB reserve on one 16 GiB GPU at 0.90 leave ~3.6 GiB; a 32k-token sequence
    # needs 2 x 48 layers x 8 KV heads x 128 x 2 bytes x 32768 = 6 GiB.
    values = seeds_profile(tensor_parallel_size=1, max_model_len=32768, max_num_batched_tokens=32768)
    text = messages(check(values, host=gpu_host(count=1, gib=16)), "max_model_len")
    assert "No room for one 32,768-token sequence: it needs 6.0 GiB" in text
    assert check(seeds_profile(tensor_parallel_size=1), host=gpu_host(count=1, gib=16)).ok


def test_it_checks_that_the_model_fits_a_cpu_host():
    fp16 = seeds_profile(quantization="none", quantization_bits=None, tensor_parallel_size=1, block_size=32)
    text = messages(check(fp16, model=qwen14b(), host=cpu_host(available_gib=16)), "__all__")
    assert "27.5 GiB of 16-bit weights + 1.0 GiB KV cache space = 28.5 GiB, but 16.0 GiB is available" in text
    assert check(fp16, model=qwen14b(), host=cpu_host(available_gib=64), cpu_kv_cache_bytes=2 * GIB).ok
    small_kv = check(fp16, model=qwen14b(), host=cpu_host(available_gib=64), cpu_kv_cache_bytes=GIB // 2)
    assert "One 8,192-token sequence needs 1.5 GiB of KV cache" in messages(small_kv, "max_model_len")


def test_it_refuses_scheduler_settings_vllm_would_stop_on():
    verdict = check(seeds_profile(enable_chunked_prefill=False, max_num_batched_tokens=4096))
    assert "at least the max model length (8,192)" in messages(verdict, "max_num_batched_tokens")
    assert check(seeds_profile(enable_chunked_prefill=True, max_num_batched_tokens=4096)).ok
    verdict = check(seeds_profile(max_num_seqs=512, max_num_batched_tokens=256))
    assert "Max concurrent sequences (512) exceeds max batched tokens (256)" in messages(verdict, "max_num_seqs")
    assert "must be one of 8, 16, 32, 64 or 128, got 24" in messages(check(seeds_profile(block_size=24)),
                                                                      "block_size")


def test_it_warns_that_swap_space_is_not_used():
    verdict = check(seeds_profile(swap_space=4))
    assert verdict.ok and len(verdict.warnings) == 1 and "no --swap-space" in verdict.warnings[0]


def test_it_suggests_the_checkpoints_own_quantization():
    assert suggest_quantization(qwen14b(quantization=AWQ)) == "awq"
    assert suggest_quantization(qwen14b(quantization={"method": "GPTQ", "bits": 8})) == "gptq"
    assert suggest_quantization(qwen14b()) == "none"
    values = suggest_values(tiny(quantization=AWQ))
    assert (values["quantization"], values["quantization_bits"], values["max_model_len"]) == ("awq", 4, 4096)
    assert values["model_name"] == "/models/tiny"
    assert suggest_values(qwen14b())["model_name"] == "Qwen/Qwen2.5-14B-Instruct"
    assert check_profile({**suggest_values(tiny()), "block_size": 32}, model=tiny(), host=cpu_host()).ok


QWEN_TOOLS = ("{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools> Return "
              "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>{%- endif %}")
LLAMA_TOOLS = "{%- if tools is not none %}Environment: ipython{%- endif %}<|python_tag|>{{ tool_call | tojson }}"


@pytest.mark.parametrize("files, parser", [
    ({"chat_template.jinja": QWEN_TOOLS}, "hermes"),
    ({"tokenizer_config.json": json.dumps({"chat_template": LLAMA_TOOLS})}, "llama3_json"),
    ({"chat_template.jinja": "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>"}, ""),  # SmolLM2
    ({"tokenizer_config.json": "not json"}, ""), ({}, ""),
])
def test_it_turns_tool_calling_on_where_the_chat_template_writes_tool_calls(tmp_path, files, parser):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert suggest_values(tiny(path=str(tmp_path)))["tool_call_parser"] == parser
    assert suggest_values(tiny(path=str(tmp_path / "gone")))["tool_call_parser"] == ""


def test_it_refuses_a_block_size_the_cpu_engine_cannot_use():
    values = {**defaults(), "model_name": "/models/tiny", "max_model_len": 4096, "block_size": 16}
    text = messages(check_profile(values, model=tiny(), host=cpu_host()), "block_size")
    assert "multiple of 32 (got 16" in text
    assert check_profile({**values, "block_size": 64}, model=tiny(), host=cpu_host()).ok
    assert check_profile(values, model=tiny(), host=gpu_host(count=1)).ok  # 16 is the seeds' GPU value
