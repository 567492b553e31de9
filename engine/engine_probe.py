"""Runs inside the engine venv: report what this host's engine can do, as JSON lines (engine/protocol.py).

Python, torch, vLLM, transformers, AutoAWQ and llm-compressor versions, the CPU's vector extensions, the kernels
the engine really has (read from the ops vLLM loaded on this processor, not inferred from CPU flags): int8
scaled-mm (W8A8), the W4A16 GEMM (AWQ/GPTQ), FP8; and CUDA devices with their compute capability."""
import importlib
import platform
import sys

from engine import protocol, serve
from engine.protocol import JsonArgumentParser, say


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def version_of(name):
    try:
        module = importlib.import_module(name)
    except Exception as error:  # a broken install raises more than ImportError
        return None, f"{type(error).__name__}: {error}"[:300]
    return getattr(module, "__version__", "unknown"), None


# The ops each kernel of vLLM's CPU build calls (vllm/model_executor/kernels/linear/...): the W8A8 kernel
# (CPUInt8ScaledMMLinearKernel) quantizes activations and multiplies through oneDNN; W4A16 (CPUWNA16, AWQ and
# GPTQ/compressed-tensors alike) needs cpu_gemm_wna16. FP8 has no op of its own on the CPU: vLLM 0.32 picks
# ChannelWiseTorchFP8ScaledMMLinearKernel, torch's scaled-mm, so the check multiplies with it (fp8_multiplies).
CPU_KERNEL_OPS = {
    "int8_scaled_mm": ("create_onednn_scaled_mm_handler", "onednn_scaled_mm"),
    "w4a16": ("cpu_gemm_wna16",),
}


def cpu_kernels():
    """{kernel: bool} for the CPU build of vLLM's ops that loads on this processor (_C_AVX512 or _C_AVX2), and
    whether it multiplies FP8 weights."""
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  loads the build this processor runs

        kernels = {kernel: all(hasattr(torch.ops._C, op) for op in ops) for kernel, ops in CPU_KERNEL_OPS.items()}
    except Exception:
        return {kernel: False for kernel in (*CPU_KERNEL_OPS, "fp8")}
    kernels["fp8"] = fp8_multiplies(torch)
    return kernels


def fp8_multiplies(torch):
    """Whether torch's scaled-mm multiplies FP8 (e4m3) matrices on this CPU as vLLM's FP8 fallback kernel calls it
    (per-tensor scales, float32 out) and gets the product of the same values in float32: a layer served, not an
    op's name looked up (the name check said "no FP8" on a Xeon whose engine then served an FP8 model)."""
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(8, 64, generator=generator).to(torch.float8_e4m3fn)
        b = torch.randn(32, 64, generator=generator).to(torch.float8_e4m3fn).t()  # column-major, as vLLM keeps it
        one = torch.ones(1, dtype=torch.float32)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
        out = out[0] if isinstance(out, tuple) else out
        return bool(torch.allclose(out, a.float() @ b.float(), rtol=1e-3, atol=1e-3))
    except Exception:  # no float8 dtype, no CPU scaled-mm, or a wrong product
        return False


INT8_EXACT_ERROR = 1e-3  # above this, the int8 kernel's products are not the products of its int8 values


def int8_product_error(torch):
    """The largest relative error of vLLM's CPU int8 scaled-mm (oneDNN, the W8A8 kernel) against the exact product
    of the same int8 values, or None where it cannot run. About 1e-7 where the processor multiplies int8 exactly
    (AVX512-VNNI, AVX-VNNI, AMX); about 0.1 on AVX2 alone, whose u8×s8 instruction sums pairs of products into a
    saturating int16 (measured 12.6% on an AVX2-only EPYC, and exact there once the weights kept to 7 bits)."""
    try:
        from vllm import _custom_ops as ops

        generator = torch.Generator().manual_seed(0)
        weights = torch.randn(64, 512, generator=generator)
        scales = weights.abs().amax(dim=1, keepdim=True) / 127
        quantized = torch.round(weights / scales).clamp(-128, 127).to(torch.int8)
        handler = ops.create_onednn_scaled_mm(quantized.t(), scales.t(), torch.float32, True, False, 32)
        x_q, x_s, x_zp = ops.onednn_scaled_int8_quant(torch.randn(8, 512, generator=generator), None, None, True)
        out = torch.empty((8, 64), dtype=torch.float32)
        ops.onednn_scaled_mm(handler, x_q, out, x_s, x_zp, None, None)
        exact = (x_q.double() * x_s.double()) @ (quantized.double() * scales.double()).t()
        return round(float((out.double() - exact).abs().max() / exact.abs().max()), 6)
    except Exception:  # no CPU build of vLLM's ops, or a kernel that refuses
        return None


def speculative_ngram():
    """(True, "") when this vLLM has the n-gram proposer (prompt-lookup speculative decoding, no draft model),
    else (False, why). vLLM 0.32's CPU runner runs it too ("supported on CPU with C++ native impls")."""
    try:
        importlib.import_module("vllm.v1.spec_decode.ngram_proposer")
    except Exception as error:
        return False, f"vLLM has no n-gram proposer here ({type(error).__name__}: {error})"[:300]
    return True, ""


def sleep_mode(gpus):
    """(True, "") when vLLM's sleep mode runs here (its weights moved off the GPU and its KV cache dropped, the
    process kept, awake again in seconds), else (False, why): vLLM offers it on CUDA, ROCm and XPU platforms."""
    if not gpus:
        return False, "sleep mode frees GPU memory, and this host has no GPU: an idle engine stops instead"
    try:
        from vllm.platforms import current_platform

        available = current_platform.is_sleep_mode_available()
    except Exception as error:
        return False, f"vLLM's platform could not be read ({type(error).__name__}: {error})"[:300]
    return (True, "") if available else (False, "this vLLM platform has no sleep mode")


def engine_flags():
    """(every option string of this vLLM's server, "") as its own parser knows them, or (None, why): the panel
    refuses a profile's extra flag that the host's vLLM does not know (argparse would read `--unknown= x` as a
    positional word)."""
    try:
        return serve.known_flags(), ""
    except Exception as error:
        return None, f"vLLM's server options could not be read ({type(error).__name__}: {error})"[:300]


def parse_args(argv):
    parser = JsonArgumentParser(description="Report what this host's engine can do (versions, CPU, kernels, GPUs).")
    return parser.parse_args(argv)


def probe(args):
    result = {"python": platform.python_version(), "packages": {}, "errors": {}}
    names = ["torch", "transformers", "vllm", "awq", "llmcompressor", "compressed_tensors"]
    for index, name in enumerate(names):
        say(phase=f"importing {name}", progress=int(100 * index / (len(names) + 1)))
        version, error = version_of(name)
        result["packages"][name] = version
        if error:
            result["errors"][name] = error
    flags = cpu_flags()
    result["cpu"] = {
        "model": platform.processor() or platform.machine(),
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
        "amx": "amx_tile" in flags,
    }
    kernels = (cpu_kernels() if result["packages"].get("vllm")
               else {kernel: False for kernel in (*CPU_KERNEL_OPS, "fp8")})
    result["awq_cpu_kernel"] = kernels["w4a16"]
    gpus = []
    if result["packages"].get("torch"):
        import torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                gpus.append({"index": index, "name": props.name, "memory_bytes": props.total_memory,
                             "compute_capability": float(f"{props.major}.{props.minor}")})
    result["cuda_devices"] = gpus
    if gpus:  # vLLM's CUDA build: W8A8 and W4A16 from compute capability 7.5, FP8 from 8.9 (Ada, Hopper)
        capability = min(gpu["compute_capability"] for gpu in gpus)
        kernels = {"int8_scaled_mm": capability >= 7.5, "w4a16": capability >= 7.5, "fp8": capability >= 8.9}
    result["kernels"] = kernels
    if not gpus and kernels.get("int8_scaled_mm"):
        import torch

        result["int8_error"] = int8_product_error(torch)
        result["int8_exact"] = result["int8_error"] is not None and result["int8_error"] < INT8_EXACT_ERROR
    result["fp8_checked_by"] = "multiplication"  # engine checks before this one looked up an op's name
    # On a GPU host vLLM's CUDA kernels serve AWQ; on a CPU host only the AVX-512 build of vLLM's ops has the
    # W4A16 GEMM (on an AVX2-only processor the engine dies at the first request without it).
    result["serves_awq"] = bool(gpus) or result["awq_cpu_kernel"]
    result["serves"] = {"w8a8-int8": kernels["int8_scaled_mm"], "w4a16": kernels["w4a16"], "fp8": kernels["fp8"]}
    if result["packages"].get("vllm"):
        result["speculative_ngram"], result["speculative_ngram_reason"] = speculative_ngram()
    else:
        result["speculative_ngram"], result["speculative_ngram_reason"] = False, "vLLM is not installed"
    if result["packages"].get("vllm"):
        result["sleep_mode"], result["sleep_mode_reason"] = sleep_mode(gpus)
    else:
        result["sleep_mode"], result["sleep_mode_reason"] = False, "vLLM is not installed"
    if result["packages"].get("vllm"):
        result["engine_flags"], result["engine_flags_reason"] = engine_flags()
    say(phase="done", progress=100)
    return result


def main(argv=None):
    return protocol.run(probe, parse_args=parse_args, classify=protocol.describe, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
