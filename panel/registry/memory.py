"""What a model costs in GPU memory: weights at each precision, KV cache per token, and what fits where.

Estimates, not measurements: vLLM also reserves activation memory (profiled at start-up) and CUDA graphs;
RUNTIME_RESERVE stands for that."""
from dataclasses import dataclass

GIB = 1024 ** 3
GPUS = [("24 GB", "L4, RTX 4090, A10", 24), ("48 GB", "L40S, A6000", 48), ("80 GB", "A100, H100", 80),
        ("141 GB", "H200", 141)]
RUNTIME_RESERVE_BYTES = int(1.5 * GIB)
DEFAULT_UTILIZATION = 0.90
# AWQ/GPTQ 4-bit with group size g stores per group an fp16 scale and a 4-bit zero: 2.5 bytes per g weights.
INT4_BYTES_PER_WEIGHT = 0.5
GROUP_OVERHEAD_BYTES = 2.5


@dataclass(frozen=True)
class Precision:
    key: str
    label: str


PRECISIONS = [Precision("fp16", "FP16 / BF16"), Precision("fp8", "FP8"), Precision("int4", "INT4 (AWQ, g128)")]


def weight_bytes(*, parameters, linear_parameters, precision, group_size=128):
    """Bytes of weights. Only decoder linear layers are quantized; embeddings, norms and the LM head stay 16-bit."""
    other = max(0, parameters - linear_parameters)
    if precision == "fp16":
        return parameters * 2
    if precision == "fp8":
        return linear_parameters * 1 + other * 2
    if precision == "int4":
        per_weight = INT4_BYTES_PER_WEIGHT + GROUP_OVERHEAD_BYTES / group_size
        return int(linear_parameters * per_weight) + other * 2
    raise ValueError(f"unknown precision {precision!r}")


def kv_bytes_per_token(*, layers, kv_heads, head_dim, dtype_bytes=2):
    """2 (K and V) x layers x KV heads x head dim x bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_tokens_that_fit(*, gpu_bytes, weights, kv_per_token, utilization=DEFAULT_UTILIZATION):
    free = gpu_bytes * utilization - weights - RUNTIME_RESERVE_BYTES
    if free <= 0 or kv_per_token <= 0:
        return 0
    return int(free // kv_per_token)


def estimate(model):
    """Plain data for the model page: weights per precision, KV bytes per token, and the fit table."""
    kv = kv_bytes_per_token(layers=model.num_layers, kv_heads=model.num_kv_heads, head_dim=model.head_dim)
    rows = []
    for precision in PRECISIONS:
        weights = weight_bytes(parameters=model.parameter_count, linear_parameters=model.linear_parameter_count,
                               precision=precision.key)
        cells = []
        for label, examples, gib in GPUS:
            tokens = kv_tokens_that_fit(gpu_bytes=gib * GIB, weights=weights, kv_per_token=kv)
            sequences = tokens // model.max_position_embeddings if model.max_position_embeddings else None
            cells.append({"gpu": label, "examples": examples, "tokens": tokens, "fits": tokens > 0,
                          "full_sequences": sequences})
        rows.append({"precision": precision, "weights_bytes": weights, "cells": cells})
    fp16 = rows[0]["weights_bytes"]
    for row in rows:
        row["saving"] = 1 - row["weights_bytes"] / fp16 if fp16 else 0
    return {"kv_bytes_per_token": kv, "rows": rows, "gpus": GPUS, "utilization": DEFAULT_UTILIZATION,
            "reserve_bytes": RUNTIME_RESERVE_BYTES}
