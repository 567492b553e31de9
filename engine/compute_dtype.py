"""The dtype the runners compute in (calibration, evaluation). On a GPU, and on a CPU with bf16 arithmetic
(AVX512-BF16 or AMX), the checkpoint's own. On a CPU without it, float32: there bf16 and fp16 are emulated, a
512x576 by 576x1536 matmul took 73.6 ms in bf16 against 6.4 ms in float32 on one core (oneDNN held to AVX2),
and a quantization job that took 34 s on an AVX-512 Xeon ran past 4 minutes on an AVX2-only EPYC. What the
runners write keeps the checkpoint's own dtype (checkpoint.store_as). torch is passed in, never imported here.

ONEDNN_MAX_CPU_ISA, when set to an instruction set without bf16 (AVX2, AVX512_CORE, ...), counts as the processor:
oneDNN then runs bf16 emulated whatever the processor has."""
import os

NATIVE_ISA_WORDS = ("BF16", "AMX", "ALL")


def native_half_on_cpu(torch):
    """Whether this CPU multiplies bf16 natively (and oneDNN is allowed to)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if limit and not any(word in limit for word in NATIVE_ISA_WORDS):
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def compute_dtype(torch, device):
    """torch.float32 on a CPU without bf16 arithmetic, else None (the checkpoint's own dtype)."""
    if str(device).startswith("cuda") or native_half_on_cpu(torch):
        return None
    return torch.float32


def describe(torch, device):
    """A log line for the job: which dtype the work runs in, and why."""
    if compute_dtype(torch, device) is None:
        return None
    return "computing in float32: this CPU has no bf16 arithmetic (emulated bf16 is about ten times slower)"
