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
