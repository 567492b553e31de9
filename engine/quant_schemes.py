"""The quantization schemes engine/llmc_quantize.py knows (the panel's panel/registry/schemes.py describes the
same keys to users; a test keeps the two lists equal)."""

SCHEMES = ("w8a8-int8", "fp8-dynamic", "w4a16-gptq", "w4a16-awq", "w4a16-rtn", "mixed")
CALIBRATED = ("w4a16-gptq", "w4a16-awq", "mixed")  # w8a8-int8 too, when SmoothQuant runs first

# vLLM loads these projections of one block as one fused layer, so they must share one scheme.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_groups(name):
    """The full names of the layers fused with `name` (itself included), e.g. a block's q/k/v projections."""
    prefix, _, leaf = name.rpartition(".")
    for group in FUSED:
        if leaf in group:
            yield {f"{prefix}.{member}" if prefix else member for member in group}
