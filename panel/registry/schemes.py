"""The quantization schemes Tokenwise offers, in users' words: which backend runs each, whether a host's engine
can serve the result (from its engine check), the size to expect from the model's own tensors, and the time.

The engine side (engine/llmc_quantize.py, engine/quant_schemes.py) knows the same keys; a test keeps them equal."""
from dataclasses import dataclass
from pathlib import Path

from panel.registry.inspection import CheckpointError, safetensors_header

AUTOAWQ, LLMC = "autoawq", "llm-compressor"
CPU_CALIBRATION = (32, 256)  # samples × tokens: a CPU host calibrates a demo-sized model in seconds
GPU_CALIBRATION = (128, 512)


@dataclass(frozen=True)
class Scheme:
    key: str
    label: str
    words: str
    backends: tuple  # the first is the default
    calibrated: bool
    weight_bits: int
    kernel: str  # the engine check's kernel that serves it on a CPU host ("" = none does)
    gpu_capability: float = 0.0  # the lowest CUDA compute capability that serves it (0: any)


SCHEMES = {scheme.key: scheme for scheme in [
    Scheme("w8a8-int8", "W8A8 INT8", "8-bit integer weights (one scale per output channel) and 8-bit activations "
           "quantized per token at run time; SmoothQuant first moves activation outliers into the weights.",
           (LLMC,), False, 8, "int8_scaled_mm", 7.5),
    Scheme("fp8-dynamic", "FP8 dynamic", "8-bit floating-point weights and activations (per token at run time). "
           "No calibration text: the fastest job.", (LLMC,), False, 8, "", 8.9),
    Scheme("w4a16-awq", "W4A16 AWQ", "4-bit weights in groups with activation-aware scales (AWQ); activations "
           "stay 16-bit.", (LLMC, AUTOAWQ), True, 4, "w4a16", 7.5),
    Scheme("w4a16-gptq", "W4A16 GPTQ", "4-bit weights in groups, rounded by GPTQ's error-correcting pass; "
           "activations stay 16-bit.", (LLMC,), True, 4, "w4a16", 7.5),
    Scheme("w4a16-rtn", "W4A16 round-to-nearest", "4-bit weights rounded to the nearest step, no calibration text: "
           "quick, and the crudest of the 4-bit schemes (with one scale per row, visibly so).",
           (LLMC,), False, 4, "w4a16", 7.5),
    Scheme("mixed", "Mixed precision", "4-bit GPTQ for most linear layers; the layers you name stay BF16 (or "
           "FP8), e.g. the last blocks, which JSON output is most sensitive to.", (LLMC,), True, 4, "w4a16", 7.5),
]}
DEFAULT_SCHEME = "w8a8-int8"


def uses_calibration(scheme_key, *, smoothquant=None):
    """Whether a run of `scheme_key` reads calibration text: the calibrated schemes, and W8A8 with SmoothQuant."""
    return SCHEMES[scheme_key].calibrated or (scheme_key == "w8a8-int8" and smoothquant is not None)


def calibration_default(host):
    """(samples, tokens per sample) that suit `host`: a CPU host needs far fewer than a GPU's 128 × 512."""
    if host is not None and not host.get("gpus"):
        return CPU_CALIBRATION
    return GPU_CALIBRATION


# --- can the host serve it ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Servable:
    answer: bool | None  # None: nobody checked the host's engine
    reason: str


SERVABLE_BITS = (4, 8)  # vLLM's integer weight kernels
COMPARISON_ONLY = ("vLLM serves 4- and 8-bit integer weights only: a 2- or 3-bit model is kept for comparison, and "
                   "its quality report measures it with transformers")


def host_serves(scheme_key, engine, *, group_size=128, keep_as="bf16", bits=None):
    """Whether an engine (the engine check's result, {} when never checked) serves `scheme_key`, with why."""
    scheme = SCHEMES[scheme_key]
    if bits is not None and bits not in SERVABLE_BITS:
        return Servable(False, COMPARISON_ONLY)
    if not engine:
        return Servable(None, "not known yet: run Check engine on the Workers page")
    gpus = engine.get("cuda_devices") or []
    if gpus:
        capability = min(float(gpu.get("compute_capability") or 0) for gpu in gpus)
        needed = scheme.gpu_capability if scheme_key != "mixed" or keep_as != "fp8" else 8.9
        if capability and capability < needed:
            return Servable(False, f"needs a GPU of compute capability {needed} or higher; this host's is "
                                   f"{capability}")
        return Servable(True, f"vLLM's CUDA kernels (compute capability {capability or 'unknown'})")
    kernels = engine.get("kernels") or {}
    if scheme_key == "fp8-dynamic" or (scheme_key == "mixed" and keep_as == "fp8"):
        if engine.get("fp8_checked_by") != "multiplication":
            return Servable(None, "the engine check predates the FP8 probe: run Check engine again")
        if kernels.get("fp8"):
            return Servable(True, "the CPU engine's FP8 fallback (torch's scaled-mm; the engine check multiplied "
                                  "with it)")
        return Servable(False, "this CPU cannot multiply FP8 weights (the engine check tried): vLLM would stop "
                               "at the first request")
    if scheme.kernel == "int8_scaled_mm":
        if kernels.get("int8_scaled_mm") is None and "kernels" not in engine:
            return Servable(None, "the engine check predates the int8 probe: run Check engine again")
        if kernels.get("int8_scaled_mm") and engine.get("int8_exact") is False:
            return Servable(True, "the CPU engine's int8 scaled-mm kernel (oneDNN), but this processor's int8 "
                                  f"products saturate (no VNNI: {100 * (engine.get('int8_error') or 0):.0f}% error in "
                                  "the engine check's test product): W8A8 answers here are worse than on a GPU")
        if kernels.get("int8_scaled_mm"):
            return Servable(True, "the CPU engine's int8 scaled-mm kernel (oneDNN)")
        return Servable(False, "this CPU engine has no int8 scaled-mm kernel")
    has_w4a16 = kernels.get("w4a16", engine.get("awq_cpu_kernel"))
    if has_w4a16:
        return Servable(True, "the CPU engine's W4A16 kernel (cpu_gemm_wna16, AVX-512 build)")
    return Servable(False, "the CPU engine's W4A16 kernel (cpu_gemm_wna16) needs vLLM's AVX-512 build, which this "
                           "processor does not run: the engine would die at the first request")


# --- expected size ------------------------------------------------------------------------------------------

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def tensors(model):
    """[(name, shape, bytes)] of the model's checkpoint, read from its safetensors headers."""
    rows = []
    for path in sorted(Path(model.path).glob("*.safetensors")):
        for name, spec in safetensors_header(path).items():
            shape = spec.get("shape") or []
            count = 1
            for dimension in shape:
                count *= dimension
            rows.append((name, shape, count * DTYPE_BYTES.get(spec.get("dtype"), 2)))
    return rows


def is_quantizable(name, shape):
    """A decoder block's linear weight: what every scheme quantizes (embeddings, lm_head and norms are not)."""
    return ".layers." in name and name.endswith(".weight") and len(shape) == 2


def linear_layers(model):
    """The names of the model's quantizable linear layers (module names, without '.weight')."""
    try:
        return [name[:-len(".weight")] for name, shape, _ in tensors(model) if is_quantizable(name, shape)]
    except (CheckpointError, OSError):
        return []


PREFERRED_GROUP_SIZES = (128, 64, 32)  # largest first: the default is the first that fits


def input_widths(model):
    """{layer name: input width} of the model's quantizable linear layers: a group of weights is cut along the
    input, so a group size must divide every one of them. From the record's widths when the checkpoint cannot be
    read from here."""
    try:
        return {name[:-len(".weight")]: shape[1] for name, shape, _ in tensors(model) if is_quantizable(name, shape)}
    except (CheckpointError, OSError):
        return {key: width for key, width in (("hidden_size", model.hidden_size),
                                              ("intermediate_size", model.intermediate_size)) if width}


def group_size_default(model):
    """The largest of 128, 64 and 32 that divides every quantized layer's input width (SmolLM2-135M's hidden size is
    576: 64); 0, one scale per output channel, when none does."""
    widths = set(input_widths(model).values())
    for size in PREFERRED_GROUP_SIZES:
        if all(width % size == 0 for width in widths):
            return size
    return 0


def group_size_refusal(model, group_size):
    """Why `group_size` cannot cut `model`'s layers into whole groups, in words; None when it can (0, one scale per
    output channel, always can)."""
    if not group_size:
        return None
    for name, width in input_widths(model).items():
        if width % group_size:
            fits = group_size_default(model)
            instead = f"{fits} is the largest that fits" if fits else "choose one scale per output channel"
            return (f"Group size {group_size} does not divide {model.name}'s layer {name}, which takes {width} "
                    f"inputs: {instead}.")
    return None


def quantized_bytes(out_features, in_features, *, bits, group_size, zero_point, backend):
    weights = out_features * in_features * bits / 8
    groups = in_features / group_size if group_size > 0 else 1
    scales = out_features * groups * 2
    zeros = out_features * groups * (4 if backend == AUTOAWQ else 0.5) if zero_point else 0
    return int(weights + scales + zeros)


def expected_size(model, scheme_key, *, group_size=128, backend=LLMC, kept=(), bits=None):
    """{"bytes", "quantized_bytes_before", "other_bytes", "share"} for `model` quantized with `scheme_key`:
    every decoder linear at the scheme's bits plus its scales; everything else (embeddings, lm_head, norms) as
    it is now. `kept` names layers that stay as they are (mixed precision). None when the checkpoint cannot be
    read from here."""
    scheme = SCHEMES[scheme_key]
    try:
        rows = tensors(model)
    except (CheckpointError, OSError):
        return None
    total = quantized_before = other = 0
    zero_point = scheme_key == "w4a16-awq"
    for name, shape, size in rows:
        if not is_quantizable(name, shape) or name[:-len(".weight")] in kept:
            other += size
            total += size
            continue
        quantized_before += size
        out_features, in_features = shape
        if scheme.weight_bits == 8:
            total += out_features * in_features + out_features * 4
        else:
            total += quantized_bytes(out_features, in_features, bits=bits or 4, group_size=group_size,
                                     zero_point=zero_point, backend=backend)
    before = quantized_before + other
    return {"bytes": total, "before_bytes": before, "quantized_bytes_before": quantized_before,
            "other_bytes": other, "reduction": 1 - total / before if before else 0.0,
            "quantized_share": quantized_before / before if before else 0.0}


# --- time ---------------------------------------------------------------------------------------------------

# Rates measured with engine/llmc_quantize.py (docs/benchmarks.md, "Quantization time on the CPU"): the demo model
# (5.2 M parameters, 4 layers) and SmolLM2-135M's shape (134.5 M, 30 layers) on this 2-core CPU; Qwen2.5-1.5B's
# shape on an H200. A job is start-up (imports), reading and writing the weights, and for a calibrated run a cost
# per sample and decoder layer (each layer runs every sample, one call at a time: on a small model this overhead
# is most of the time; AWQ also runs each sample once per grid point) plus a cost per calibration token and
# billion linear parameters. Shown as "about".
STARTUP_SECONDS = {"cpu": 6.0, "gpu": 11.0}
WEIGHTS_SECONDS_PER_BILLION = {"cpu": 40.0, "gpu": 2.6}  # load, quantize the weights, save
SECONDS_PER_SAMPLE_LAYER = {"cpu": {"w4a16-awq": 0.5, "w4a16-gptq": 0.03, "mixed": 0.03, "w8a8-int8": 0.01},
                            "gpu": {"w4a16-awq": 0.0, "w4a16-gptq": 0.0, "mixed": 0.0, "w8a8-int8": 0.0}}
# Seconds per million calibration tokens per billion linear parameters. The GPU's GPTQ and SmoothQuant rates are
# not measured: half and a tenth of AWQ's.
SECONDS_PER_TOKEN_MILLION_BILLION = {"cpu": {"w4a16-awq": 5e5, "w4a16-gptq": 1.8e5, "mixed": 1.8e5, "w8a8-int8": 3e4},
                                     "gpu": {"w4a16-awq": 1000.0, "w4a16-gptq": 500.0, "mixed": 500.0,
                                             "w8a8-int8": 100.0}}


def expected_seconds(model, scheme_key, *, samples, tokens, device, smoothquant=None):
    """About how long a job takes: from the model's parameters and layers, and the calibration text it reads."""
    billions = max(model.parameter_count, 1) / 1e9
    seconds = STARTUP_SECONDS[device] + WEIGHTS_SECONDS_PER_BILLION[device] * billions
    if uses_calibration(scheme_key, smoothquant=smoothquant):
        linear = max(model.linear_parameter_count or model.parameter_count, 1) / 1e9
        seconds += SECONDS_PER_SAMPLE_LAYER[device][scheme_key] * samples * max(model.num_layers, 1)
        seconds += SECONDS_PER_TOKEN_MILLION_BILLION[device][scheme_key] * samples * tokens / 1e6 * linear
    return seconds


def scheme_table(model, hosts, *, engines, samples, tokens):
    """One row per scheme for the quantization form: what it is, whether each online GPU host serves the result,
    the size to expect, and about how long the job takes. `engines` maps a host's pk to its engine check."""
    device = "gpu" if any(host.gpus for host in hosts) else "cpu"
    group_size = group_size_default(model)
    rows = []
    for key, scheme in SCHEMES.items():
        size = expected_size(model, key, group_size=group_size)
        rows.append({
            "scheme": scheme,
            "serving": [(host, host_serves(key, engines.get(host.pk) or {})) for host in hosts],
            "size": size,
            "seconds": expected_seconds(model, key, samples=samples, tokens=tokens, device=device),
            "device": device,
        })
    return rows
