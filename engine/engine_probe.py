"""Runs inside the engine venv: report what this host's engine can do, as JSON lines (see jobrunner.py).

Python, torch, vLLM, transformers and AutoAWQ versions, the CPU's vector extensions (the CPU engine
serves AWQ only where its AVX-512 ops load), and CUDA devices."""
import importlib
import json
import platform
import sys


def say(**message):
    print(json.dumps(message), flush=True)


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


def awq_cpu_kernel():
    """True when the CPU build of vLLM's ops that loads on this processor has the AWQ (W4A16) GEMM."""
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  loads _C_AVX512 or _C_AVX2, whichever this processor runs

        return hasattr(torch.ops._C, "cpu_gemm_wna16")
    except Exception:
        return False


def main():
    result = {"python": platform.python_version(), "packages": {}, "errors": {}}
    names = ["torch", "transformers", "vllm", "awq"]
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
    result["awq_cpu_kernel"] = awq_cpu_kernel() if result["packages"].get("vllm") else False
    gpus = []
    if result["packages"].get("torch"):
        import torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                gpus.append({"index": index, "name": props.name, "memory_bytes": props.total_memory})
    result["cuda_devices"] = gpus
    # On a GPU host vLLM's CUDA kernels serve AWQ; on a CPU host only the AVX-512 build of vLLM's ops has the
    # W4A16 GEMM (on an AVX2-only processor the engine dies at the first request without it).
    result["serves_awq"] = bool(gpus) or result["awq_cpu_kernel"]
    say(phase="done", progress=100)
    say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
