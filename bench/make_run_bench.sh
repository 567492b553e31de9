#!/usr/bin/env bash
# `make run` timed from the user's side, for docs/benchmarks.md (a script, not a test): a fresh clone of this
# repository started cold (venvs, first start) and then warm, each until the sign-in page answers and until the
# starter model (SmolLM2-135M-Instruct) is registered ready. Each start is stopped with Ctrl-C (SIGINT).
#   bench/make_run_bench.sh [CLONE_DIR]   # default /tmp/make-run-bench; port 8765, Redis 6399
set -u
repo="$(cd "$(dirname "$0")/.." && pwd)"
clone="${1:-/tmp/make-run-bench}"
rm -rf "$clone" && git clone -q "$repo" "$clone" && cd "$clone" || exit 1
measure() {  # $1: cold or warm
  local start answered="" ready=""
  start=$(date +%s.%N)
  (TOKENWISE_PORT=8765 TOKENWISE_REDIS_PORT=6399 PYTHONUNBUFFERED=1 make run > "$clone/make-run-$1.log" 2>&1 &)
  for _ in $(seq 1 3000); do
    if [ -z "$answered" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' -m 1 http://127.0.0.1:8765/login/)" = 200 ]; then
      answered=$(echo "$(date +%s.%N) - $start" | bc)
    fi
    if [ -n "$answered" ] && .venv/bin/python manage.py shell -c "from panel.registry.models import RegisteredModel as M; import sys; sys.exit(0 if M.objects.filter(name='SmolLM2-135M-Instruct', state='ready').exists() else 1)" >/dev/null 2>&1; then
      ready=$(echo "$(date +%s.%N) - $start" | bc)
      break
    fi
    sleep 0.2
  done
  echo "$1: the panel answers after ${answered:-never} s, SmolLM2 ready after ${ready:-never} s"
  pkill -INT -f "panel.launcher"
  sleep 20
}
measure cold
measure warm
