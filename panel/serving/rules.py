"""Whether a serving profile can run, before anything is launched: each rule turns a start-up crash of vLLM, or an
entry of the usual vLLM troubleshooting list, into a reason the user reads next to the field.

`check_profile` takes the profile dict, the RegisteredModel it serves and, when known, the host it will run on.
Memory numbers come from panel.registry.memory, the same estimates the model page shows."""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from panel.registry import memory
from panel.registry.models import ModelState
from panel.registry.schemes import SCHEMES, host_serves
from panel.registry.services import check_failed_refusal
from panel.serving.configfile import ENGINE_HAS_SWAP_SPACE
from panel.serving.profile_fields import BLOCK_SIZES, FIELDS_BY_NAME, defaults

GENERAL = "__all__"  # Django's key for errors that belong to no single field
STABLE_UTILIZATION = (0.85, 0.92)  # where vLLM runs stably: lower wastes memory, higher risks OOM at peaks
ALLOWED_UTILIZATION = (0.5, 0.98)
DEFAULT_CPU_KV_CACHE_BYTES = memory.GIB
NEEDS_QUANTIZED_CHECKPOINT = ("awq", "gptq")  # vLLM loads these, it cannot produce them
BITS = {"none": (None,), "awq": (4,), "gptq": (4, 8), "fp8": (8,), "bitsandbytes": (4, 8)}


@dataclass
class Verdict:
    """Errors per profile field (GENERAL for the whole profile) and warnings; `ok` when there is no error."""

    errors: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.errors

    def error(self, name, message):
        self.errors.setdefault(name, []).append(message)


def suggest_quantization(model):
    """The quantization a profile must use for this checkpoint: its own method if it is quantized, else "none"."""
    return str((model.quantization or {}).get("method") or "none").lower()


def checkpoint_quantization(model):
    """(quantization, quantization_bits) as a profile names them for this checkpoint: its own method ("none" when
    unquantized) and bits (None when a profile has no such choice)."""
    bits = (model.quantization or {}).get("bits")
    return suggest_quantization(model), (bits if bits in FIELDS_BY_NAME["quantization_bits"].choice_values else None)


def suggest_values(model):
    """A new profile for this model: the defaults, its quantization, a context length it supports, and tool calling
    where its chat template writes tool calls."""
    values = defaults()
    quantization, bits = checkpoint_quantization(model)
    values.update(model_name=getattr(model, "hub_id", "") or getattr(model, "path", "") or model.name,
                  quantization=quantization, quantization_bits=bits,
                  max_model_len=min(values["max_model_len"], model.max_position_embeddings or values["max_model_len"]),
                  tool_call_parser=tool_parser_for(getattr(model, "path", "")))
    return values


# What a chat template writes around a tool call, and the vLLM parser that reads it back (first match wins).
TOOL_CALL_MARKERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"), ("[TOOL_CALLS]", "mistral"),
                     ("<|tool_call|>", "granite"), ("<|channel|>", "openai"))


def tool_parser_for(path):
    """The tool-call parser for a checkpoint whose chat template renders tools and their calls, or "" (a template
    that never shows the model its tools: tool calling would give it nothing to call)."""
    folder = Path(path) if path else None
    if folder is None or not folder.is_dir():
        return ""
    template = ""
    try:
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(errors="replace")
        elif (folder / "tokenizer_config.json").is_file():
            found = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template") or ""
            template = found if isinstance(found, str) else json.dumps(found)
    except (OSError, ValueError):
        return ""
    if "tools" not in template:
        return ""
    return next((parser for marker, parser in TOOL_CALL_MARKERS if marker in template), "")


def check_profile(values, *, model, host=None, cpu_kv_cache_bytes=DEFAULT_CPU_KV_CACHE_BYTES):
    """A Verdict for serving `model` with the profile `values` (missing keys take their defaults) on `host`
    (None: not placed yet; else {"kind": "gpu"|"cpu", "gpus": [{"memory_bytes"}], "memory_available_bytes",
    "serves_awq": bool|None}). `cpu_kv_cache_bytes` is the KV space a CPU engine gets (VLLM_CPU_KVCACHE_SPACE)."""
    profile = {**defaults(), **values}
    verdict = Verdict()
    # A model that failed its check as a model starts, and answers nonsense: refused whatever the profile says.
    if getattr(model, "state", ModelState.READY) == ModelState.BROKEN:
        verdict.error("model", check_failed_refusal(model, doing="served"))
    _check_tensor_parallel(verdict, profile, model)
    _check_utilization(verdict, profile)
    _check_quantization(verdict, profile, model)
    _check_bits(verdict, profile)
    _check_scheduler(verdict, profile, model)
    if host is not None:
        _check_host(verdict, profile, model, host, cpu_kv_cache_bytes)
    if profile["swap_space"] and not ENGINE_HAS_SWAP_SPACE:
        verdict.warnings.append(
            f"swap_space = {profile['swap_space']} GiB is kept for config.toml but not used: vLLM 0.32 has no "
            "--swap-space (a preempted request is recomputed instead of swapped to CPU memory).")
    return verdict


def _listing(numbers):
    words = [str(number) for number in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _tp_fits(tp, heads, kv_heads):
    # vLLM splits the query heads evenly; KV heads are split, or replicated when tp is a multiple of them.
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def _check_tensor_parallel(verdict, profile, model):
    tp, heads, kv_heads = profile["tensor_parallel_size"], model.num_attention_heads, model.num_kv_heads
    if _tp_fits(tp, heads, kv_heads):
        return
    # Suggest what fits in one node: 8 GPUs at most in practice.
    valid = [size for size in range(1, min(heads, 8) + 1) if _tp_fits(size, heads, kv_heads)]
    verdict.error("tensor_parallel_size", (
        f"Tensor parallel size {tp} does not split {model.name}'s {heads} attention heads and {kv_heads} KV heads "
        f"evenly across GPUs: vLLM refuses to start. Use {_listing(valid)}."))


def _check_utilization(verdict, profile):
    value = profile["gpu_memory_utilization"]
    low, high = ALLOWED_UTILIZATION
    if not low <= value <= high:
        why = ("leaves no room for the CUDA context and other processes: start-up fails or the server runs out of "
               "memory" if value > high else "leaves most of the GPU idle and the KV cache tiny")
        verdict.error("gpu_memory_utilization",
                      f"GPU memory utilization {value:.2f} is outside {low}-{high}: it {why}.")
    elif not STABLE_UTILIZATION[0] <= value <= STABLE_UTILIZATION[1]:
        verdict.warnings.append(
            f"GPU memory utilization {value:.2f} is outside the stable 0.85-0.92 range: "
            "higher risks out-of-memory under load, lower wastes KV cache space.")


def _check_quantization(verdict, profile, model):
    wanted, checkpoint = profile["quantization"], (model.quantization or {})
    method = str(checkpoint.get("method") or "").lower()
    label = getattr(model, "quantization_label", "") or method.upper()
    if method and wanted == "none":
        verdict.error("quantization", (
            f"{model.name} is already quantized ({label}): its weights cannot be served as FP16/BF16. Set "
            f"quantization to \"{method}\"; vLLM reads the method from the checkpoint."))
    elif method and wanted != method:
        verdict.error("quantization", (
            f"{model.name} is already quantized ({label}); set quantization to \"{method}\". Quantizing a "
            "quantized checkpoint twice is refused: vLLM reads the method from the checkpoint itself."))
    elif not method and wanted in NEEDS_QUANTIZED_CHECKPOINT:
        verdict.error("quantization", (
            f"{model.name} is not quantized, and vLLM cannot quantize to {wanted.upper()} while loading: it needs a "
            f"{wanted.upper()} checkpoint. Quantize it first: Models → {model.name} → Quantize, then serve "
            "the quantized model."))
    if method and checkpoint.get("bits") and profile["quantization_bits"] not in (None, checkpoint["bits"]):
        verdict.error("quantization_bits", (
            f"{model.name} holds {checkpoint['bits']}-bit weights; quantization bits "
            f"{profile['quantization_bits']} does not match the checkpoint."))
    if method == "compressed-tensors" and checkpoint.get("bits") in (2, 3):
        verdict.error("quantization", (
            f"{model.name} holds {checkpoint['bits']}-bit weights, which vLLM cannot load (its integer kernels take "
            "4 or 8 bits): it was quantized for comparison. Serve a 4- or 8-bit sibling."))
    if wanted == "bitsandbytes":
        verdict.error("quantization", (
            "vLLM 0.32 no longer has bitsandbytes quantization: it stops at start-up with \"Unknown quantization "
            "method: bitsandbytes\". Use AWQ for 4-bit (Models → Quantize) or fp8 for 8-bit."))


def _check_bits(verdict, profile):
    wanted, bits = profile["quantization"], profile["quantization_bits"]
    allowed = BITS.get(wanted, (bits,))
    if bits in allowed:
        return
    if wanted == "none":
        verdict.error("quantization_bits", f"Without quantization there are no bits: leave it empty (got {bits}).")
    else:
        shown = _listing([str(option) for option in allowed if option])
        got = "empty" if bits is None else bits
        verdict.error("quantization_bits", f"{wanted.upper()} uses {shown}-bit weights, got {got}.")


def _check_scheduler(verdict, profile, model):
    max_len, tokens, seqs = profile["max_model_len"], profile["max_num_batched_tokens"], profile["max_num_seqs"]
    if max_len > model.max_position_embeddings:
        verdict.error("max_model_len", (
            f"Max model length {max_len:,} is longer than {model.name} was trained for "
            f"({model.max_position_embeddings:,} positions): vLLM refuses to start."))
    if tokens < max_len and not profile["enable_chunked_prefill"]:
        verdict.error("max_num_batched_tokens", (
            f"Without chunked prefill a whole prompt is processed in one step, so max batched tokens ({tokens:,}) "
            f"must be at least the max model length ({max_len:,}); vLLM refuses to start otherwise. Raise it or "
            "turn chunked prefill on."))
    if seqs > tokens:
        verdict.error("max_num_seqs", (
            f"Max concurrent sequences ({seqs:,}) exceeds max batched tokens ({tokens:,}): each sequence needs at "
            "least one token per step, and vLLM refuses to start."))
    if profile["block_size"] not in BLOCK_SIZES:
        verdict.error("block_size", f"Block size must be one of {_listing(BLOCK_SIZES)}, "
                                    f"got {profile['block_size']}.")


def _weight_precision(profile):
    """(memory.weight_bytes precision key, words for the message) for the profile's quantization."""
    wanted, bits = profile["quantization"], profile["quantization_bits"]
    if wanted in ("awq", "gptq", "bitsandbytes") and bits != 8:
        return "int4", f"4-bit {wanted.upper()}"
    if wanted in ("fp8", "gptq", "bitsandbytes"):
        return "fp8", f"8-bit {wanted.upper()}"
    return "fp16", "16-bit"


def _gib(number):
    return f"{number / memory.GIB:.1f} GiB"


def weight_bytes(profile, model):
    """The bytes of the weights as this profile serves the model."""
    precision, _ = _weight_precision(profile)
    group_size = (model.quantization or {}).get("group_size") or 128
    return memory.weight_bytes(parameters=model.parameter_count, linear_parameters=model.linear_parameter_count,
                               precision=precision, group_size=group_size)


def _check_host(verdict, profile, model, host, cpu_kv_cache_bytes):
    _, words = _weight_precision(profile)
    weights = weight_bytes(profile, model)
    uses_awq = profile["quantization"] == "awq" or suggest_quantization(model) == "awq"
    if host.get("kind") == "cpu":
        if uses_awq and host.get("serves_awq") is False:
            verdict.error("quantization", (
                "This host's CPU engine cannot serve AWQ: its W4A16 kernel (cpu_gemm_wna16) needs vLLM's AVX-512 "
                "build, and without it the engine dies at the first request. Serve the FP16/BF16 parent model "
                "here instead, or use a GPU host."))
        elif uses_awq and host.get("serves_awq") is None:
            verdict.warnings.append(
                "Nobody has checked this host's engine yet, so it is not known whether it can serve AWQ: the CPU "
                "engine's W4A16 kernel (cpu_gemm_wna16) needs vLLM's AVX-512 build, and without it the engine dies "
                "at the first request. Run Check engine on the Workers page first.")
        scheme = (model.quantization or {}).get("scheme")
        if scheme and host.get("engine"):
            serves = host_serves(scheme, host["engine"], keep_as=(model.quantization or {}).get("keep_as") or "bf16")
            if serves.answer is False:
                verdict.error("quantization", (
                    f"This host's CPU engine cannot serve {SCHEMES[scheme].label}: {serves.reason}. Serve the "
                    "FP16/BF16 parent here instead, or use another host."))
        if profile["quantization"] == "fp8":
            verdict.error("quantization", (
                "The CPU engine cannot quantize weights to FP8 as it loads them: vLLM 0.32's CPU build has only a "
                "stub of that kernel (_C::static_scaled_fp8_quant) and the engine stops at start-up. Quantize the "
                "model to FP8 dynamic first and serve that child where the engine check says the host multiplies "
                "FP8, or use FP8 on a GPU host."))
        if profile["block_size"] % 32:
            # Measured here: vLLM 0.32's CPU attention backend stops at start-up with "No common block size
            # for 16 (CPU_ATTN: [MultipleOf(32)])".
            verdict.error("block_size", (
                f"The CPU engine needs a block_size that is a multiple of 32 (got {profile['block_size']}; the "
                "16 is a GPU value): use 32, 64 or 128 on this host."))
        _check_cpu_fit(verdict, profile, model, host, weights, words, cpu_kv_cache_bytes)
    else:
        _check_gpu_fit(verdict, profile, model, host, weights, words)


def _kv_per_token_per_device(profile, model):
    tp, pp = profile["tensor_parallel_size"], profile["pipeline_parallel_size"]
    return memory.kv_bytes_per_token(layers=math.ceil(model.num_layers / pp),
                                     kv_heads=max(1, model.num_kv_heads // tp), head_dim=model.head_dim)


def _check_cpu_fit(verdict, profile, model, host, weights, words, kv_space):
    available = host.get("memory_available_bytes") or 0
    if weights + kv_space > available:
        verdict.error(GENERAL, (
            f"Does not fit in this host's memory: {_gib(weights)} of {words} weights + {_gib(kv_space)} KV cache "
            f"space = {_gib(weights + kv_space)}, but {_gib(available)} is available."))
    sequence = profile["max_model_len"] * _kv_per_token_per_device(profile, model)
    if sequence > kv_space:
        verdict.error("max_model_len", (
            f"One {profile['max_model_len']:,}-token sequence needs {_gib(sequence)} of KV cache but the CPU "
            f"engine gets {_gib(kv_space)}: vLLM refuses to start. Lower max model length or raise the KV space."))


def _check_gpu_fit(verdict, profile, model, host, weights, words):
    gpus = sorted((gpu["memory_bytes"] for gpu in host.get("gpus") or []), reverse=True)
    devices = profile["tensor_parallel_size"] * profile["pipeline_parallel_size"]
    if devices > len(gpus):
        verdict.error("tensor_parallel_size", (
            f"Tensor parallel × pipeline parallel = {devices} GPUs, but this host has {len(gpus)}."))
        return
    per_gpu, reserve = weights / devices, memory.RUNTIME_RESERVE_BYTES
    usable = gpus[devices - 1] * profile["gpu_memory_utilization"]  # the smallest GPU of the best placement
    budget = f"{profile['gpu_memory_utilization']:.2f} × {_gib(gpus[devices - 1])} = {_gib(usable)} per GPU"
    if per_gpu + reserve > usable:
        verdict.error(GENERAL, (
            f"The weights do not fit: {_gib(per_gpu)} of {words} weights per GPU (split over {devices}) + "
            f"{_gib(reserve)} runtime reserve = {_gib(per_gpu + reserve)}, but {budget}. Quantize to INT4 with AWQ "
            "(about 75% smaller), use more GPUs, or a larger GPU."))
        return
    sequence = profile["max_model_len"] * _kv_per_token_per_device(profile, model)
    if per_gpu + reserve + sequence > usable:
        verdict.error("max_model_len", (
            f"No room for one {profile['max_model_len']:,}-token sequence: it needs {_gib(sequence)} of KV cache "
            f"per GPU, and {_gib(usable - per_gpu - reserve)} is left after the weights ({budget}). vLLM refuses "
            "to start: lower max model length, quantize, or use more GPUs."))
