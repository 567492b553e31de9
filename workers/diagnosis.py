"""Turn the last lines of an engine's output into a reason a user can act on."""
import re

# (kind, pattern, reason). The first match wins, so the specific entries come before the general ones.
RULES = [
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError", re.I),
     "the GPU ran out of memory: use a smaller model or batch, lower gpu_memory_utilization, or pick a larger GPU"),
    ("oom", re.compile(r"\bMemoryError\b|Cannot allocate memory|std::bad_alloc|Killed\b", re.I),
     "the host ran out of memory (RAM): free memory on the host or use a smaller model"),
    ("disk_full", re.compile(r"No space left on device|Disk quota exceeded", re.I),
     "the disk is full: free space in TOKENWISE_DATA_DIR"),
    ("engine_missing", re.compile(r"No module named '?(vllm|awq|torch|transformers|accelerate)", re.I),
     "a package is missing from the engine venv (ENGINE_PYTHON): rerun `make run` to rebuild it"),
    ("engine_missing", re.compile(r"ModuleNotFoundError|ImportError", re.I),
     "the engine venv cannot import what it needs: rebuild it with `make run`"),
    ("unsupported_architecture", re.compile(r"not supported|NotImplementedError|is not a supported", re.I),
     "the engine does not support this model's architecture"),
]


def classify(tail, returncode):
    """(kind, reason) for a runner that ended with `returncode` after printing `tail`."""
    text = "\n".join(tail)
    for kind, pattern, reason in RULES:
        if pattern.search(text):
            return kind, reason
    if returncode is not None and returncode < 0:
        return "killed", f"the runner was killed by signal {-returncode}"
    last = next((line for line in reversed(tail) if line.strip()), "no output")
    return "failed", f"the runner exited with code {returncode}: {last[-300:]}"


# What kills a vLLM server, from its log (the seeds' troubleshooting list and what was measured here).
ENGINE_RULES = [
    ("unsupported_quantization", re.compile(r"cpu_gemm_wna16|Unknown quantization method|quantization method .* "
                                            r"is not supported|not supported for quantization|Cannot find the "
                                            r"config file for (awq|gptq)", re.I),
     "the engine cannot run this quantization here (the CPU engine's AWQ kernel needs vLLM's AVX-512 build): "
     "serve the FP16/BF16 model on this host, or the AWQ model on a GPU host"),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                       r"insufficient memory|Cannot allocate memory|MemoryError|KV cache .* larger than the "
                       r"available", re.I),
     "out of memory: lower max_model_len or max_num_seqs, raise gpu_memory_utilization carefully, quantize the "
     "model, or use a larger GPU (on a CPU host: lower VLLM_CPU_KVCACHE_SPACE)"),
    ("port_in_use", re.compile(r"Address already in use|\[Errno 98\]", re.I),
     "the port was taken by another process: leave the port empty so the panel picks a free one"),
    ("model_not_found", re.compile(r"does not appear to have a file named config\.json|No such file or "
                                   r"directory: .*config\.json|Repository Not Found|is not a local folder and "
                                   r"is not a valid model identifier|Can't load the configuration", re.I),
     "the engine cannot find the model: check that the model's folder exists on this host"),
    ("bad_block_size", re.compile(r"No common block size for (\d+)", re.I),
     "this engine does not support the profile's block_size (the CPU engine needs a multiple of 32)"),
    ("engine_missing", re.compile(r"No module named '?vllm|ModuleNotFoundError|ImportError", re.I),
     "the engine venv cannot import vLLM: rebuild it (`make engine`) or fix ENGINE_PYTHON"),
    ("bad_config", re.compile(r"(ValueError|TypeError|argument|error): .{0,300}", re.I), None),
]


def classify_engine(tail, returncode, *, became_ready=False):
    """(kind, reason) for a vLLM server that exited with `returncode` after printing `tail`. A signal wins over
    the log (the log of a killed engine is a healthy one); a refused configuration only explains a start-up."""
    if returncode is not None and returncode < 0:
        return "killed", (f"the engine was killed by signal {-returncode} (by someone, or by the kernel's "
                          "out-of-memory killer: check the host's memory)")
    text = "\n".join(tail)
    for kind, pattern, reason in ENGINE_RULES:
        if kind == "bad_config" and became_ready:
            continue
        match = pattern.search(text)
        if match:
            if reason is None:
                return kind, f"the engine refused its configuration: {match.group(0)[:300]}"
            return kind, reason
    return classify(tail, returncode)
