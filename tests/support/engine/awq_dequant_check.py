"""Runs inside the engine venv (torch and safetensors only; AutoAWQ is deliberately not imported, so this is an
independent reading of its format): unpack an AWQ GEMM checkpoint, dequantize it and compare it with the original.

    ENGINE_PYTHON tests/support/engine/awq_dequant_check.py ORIGINAL_DIR QUANTIZED_DIR [--group-size 128] [--device cpu]

Prints one JSON object: per quantized linear the relative Frobenius error after fitting AWQ's input-channel
scales, and the same error for plain round-to-nearest quantization of the original (no scales, no clipping) as a
baseline; plus a check of the scales against the RMSNorm weights they were folded into.

The format (AutoAWQ's WQLinear_GEMM): for a Linear with weight W [out, in],
    qweight [in, out/8] int32: eight 4-bit values a word; nibble i (bits 4i..4i+3) holds column 8c + ORDER[i]
    qzeros  [in/group, out/8] int32, packed the same way
    scales  [in/group, out] float16
    W_deq[o, j] = (q[j, o] - z[j // group, o]) * scales[j // group, o]

AWQ quantizes W * diag(s) (s > 0 per input channel, 1/s folded into the previous RMSNorm or Linear) after
clipping each group's range, so W_deq ~ W * diag(s). s is not stored; it is fitted per input column j by least
squares: s_j = <W_deq[:, j], W[:, j]> / <W[:, j], W[:, j]>. The error reported (rel_error) is
||W_deq - W diag(s)||_F / ||W diag(s)||_F. two_sided_rel_error also fits a scale per output row (see
fitted_two_sided); rtn_rel_error is what plain round-to-nearest 4-bit quantization of W gives, the baseline.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AWQ's GEMM pack order: nibble i holds column ORDER[i] of each group of 8
BITS = 4


def unpack(packed):
    """[rows, cols/8] int32 -> [rows, cols] int64 in 0..15, in column order."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int64, device=packed.device)
    nibbles = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF  # [rows, cols/8, 8]: nibble i at index i
    columns = torch.empty_like(nibbles)
    columns[..., ORDER] = nibbles
    return columns.reshape(packed.shape[0], -1)


def dequantize(qweight, qzeros, scales, group_size):
    """W_deq [out, in] float32."""
    q = unpack(qweight)  # [in, out]
    z = unpack(qzeros)  # [in/group, out]
    groups = torch.arange(q.shape[0], device=q.device) // group_size
    w = (q - z[groups]).to(torch.float32) * scales.to(torch.float32)[groups]
    return w.t().contiguous()


def rtn_error(w, group_size):
    """Relative error of plain round-to-nearest asymmetric 4-bit quantization, groups along the input axis."""
    groups = w.reshape(-1, group_size)
    low, high = groups.amin(dim=1, keepdim=True), groups.amax(dim=1, keepdim=True)
    step = (high - low).clamp(min=1e-5) / (2 ** BITS - 1)
    zero = (-torch.round(low / step)).clamp(0, 2 ** BITS - 1)
    quantized = (torch.clamp(torch.round(groups / step) + zero, 0, 2 ** BITS - 1) - zero) * step
    return float((quantized - groups).norm() / groups.norm())


def fitted_scales(w_deq, w):
    """s minimizing ||W_deq - W diag(s)||_F, one least-squares problem per input column."""
    return (w_deq * w).sum(dim=0) / (w * w).sum(dim=0).clamp(min=1e-30)


def fitted_two_sided(w_deq, w, rounds=8):
    """r, s minimizing ||W_deq - diag(r) W diag(s)||_F by alternating least squares. A Linear whose output
    feeds the next scaled Linear (up_proj before down_proj; v_proj before o_proj when their shapes match) had its
    rows divided by that Linear's scales too, which a column scale alone cannot express."""
    r = torch.ones(w.shape[0], device=w.device)
    for _ in range(rounds):
        scaled_rows = w * r[:, None]
        s = (w_deq * scaled_rows).sum(dim=0) / (scaled_rows * scaled_rows).sum(dim=0).clamp(min=1e-30)
        scaled_columns = w * s[None, :]
        r = (w_deq * scaled_columns).sum(dim=1) / (scaled_columns * scaled_columns).sum(dim=1).clamp(min=1e-30)
    return r, s


def tensors(folder):
    found = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        handle = safe_open(str(path), "pt")
        for name in handle.keys():
            found[name] = (handle, name)
    return found


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("original", type=Path)
    parser.add_argument("quantized", type=Path)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--device", default="cpu", help="where to compute (cuda for a large model on a GPU host)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    def load(index, name):
        handle, key = index[name]
        return handle.get_tensor(key).to(device)

    original, quantized = tensors(args.original), tensors(args.quantized)
    per_linear, scales_by_linear = {}, {}
    q_low, q_high = 15, 0
    for name in sorted(quantized):
        if not name.endswith(".qweight"):
            continue
        base = name[: -len(".qweight")]
        qweight = load(quantized, name)
        q = unpack(qweight)
        q_low, q_high = min(q_low, int(q.min())), max(q_high, int(q.max()))
        w_deq = dequantize(qweight, load(quantized, base + ".qzeros"), load(quantized, base + ".scales"),
                           args.group_size)
        w = load(original, base + ".weight").to(torch.float32)
        if w.shape != w_deq.shape:
            raise SystemExit(f"{base}: original {tuple(w.shape)} but dequantized {tuple(w_deq.shape)}")
        s = fitted_scales(w_deq, w)
        target = w * s
        r, s2 = fitted_two_sided(w_deq, w)
        target2 = r[:, None] * w * s2[None, :]
        per_linear[base] = {
            "rel_error": float((w_deq - target).norm() / target.norm()),
            "two_sided_rel_error": float((w_deq - target2).norm() / target2.norm()),
            "unscaled_rel_error": float((w_deq - w).norm() / w.norm()),
            "rtn_rel_error": rtn_error(w, args.group_size),
            "scale_min": float(s.min()),
            "scale_max": float(s.max()),
        }
        scales_by_linear[base] = s

    # The scales of q/k/v (and gate/up) were folded into input_layernorm (post_attention_layernorm): the norm's
    # weight became norm / s. The fitted s must match original_norm / quantized_norm.
    norm_checks = []
    for base, s in scales_by_linear.items():
        layer, _, leaf = base.rpartition(".")
        parent = layer.rpartition(".")[0]  # model.layers.N
        norm = {"q_proj": "input_layernorm", "k_proj": "input_layernorm", "v_proj": "input_layernorm",
                "gate_proj": "post_attention_layernorm", "up_proj": "post_attention_layernorm"}.get(leaf)
        if norm is None:
            continue
        key = f"{parent}.{norm}.weight"
        if key not in original or key not in quantized:
            continue
        folded = load(original, key).to(torch.float32) / load(quantized, key).to(torch.float32)
        norm_checks.append(float(((s - folded).abs() / folded.abs()).median()))

    errors = [item["rel_error"] for item in per_linear.values()]
    rtn = [item["rtn_rel_error"] for item in per_linear.values()]
    two_sided = [item["two_sided_rel_error"] for item in per_linear.values()]
    worst = max(per_linear, key=lambda key: per_linear[key]["rel_error"]) if per_linear else None
    print(json.dumps({
        "linears": len(per_linear),
        "max_rel_error": max(errors) if errors else None,
        "mean_rel_error": sum(errors) / len(errors) if errors else None,
        "worst": worst,
        "max_two_sided_rel_error": max(two_sided) if two_sided else None,
        "max_rtn_rel_error": max(rtn) if rtn else None,
        "mean_rtn_rel_error": sum(rtn) / len(rtn) if rtn else None,
        "max_unscaled_rel_error": max(item["unscaled_rel_error"] for item in per_linear.values()) if per_linear
        else None,
        "scale_range": [min(item["scale_min"] for item in per_linear.values()),
                        max(item["scale_max"] for item in per_linear.values())] if per_linear else None,
        "norm_fold_checks": len(norm_checks),
        "norm_fold_max_median_rel_dev": max(norm_checks) if norm_checks else None,
        "q_range": [q_low, q_high],
        "per_linear": per_linear,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
