"""TTFT p50/p95 at concurrency 1, direct and through the gateway of the tree given as argv[1] (bench/gateway_bench.py's
own functions, without the wrk throughput part), for A/B runs of two trees on a shared machine:

  git archive 37dd726 | tar -x -C /tmp/old && ln -s $PWD/.venv /tmp/old/.venv
  export REDIS_URL=redis://127.0.0.1:<a redis-server's port>/0 TOKENWISE_OUTBOUND_ALLOW=127.0.0.1/32
  AB=$PWD/bench/gateway_ttft_ab.py
  for tree in /tmp/old $PWD /tmp/old $PWD; do (cd $tree && .venv/bin/python $AB $tree 400); done
"""
import json
import sys
import tempfile
from pathlib import Path

root = Path(sys.argv[1])
sys.path.insert(0, str(root))
import bench.gateway_bench as gb  # noqa: E402

requests = int(sys.argv[2]) if len(sys.argv) > 2 else 500
up_port, gw_port = gb.free_port(), gb.free_port()
upstream = gb.start([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(up_port), "--chunks", "20",
                     "--model", "fake-model"], ready_url=f"http://127.0.0.1:{up_port}/v1/models")
upstream_url = f"http://127.0.0.1:{up_port}/v1"
env, key = gb.prepare_panel(Path(tempfile.mkdtemp(prefix="tw-ab-")), upstream_url)
gateway = gb.start([sys.executable, "-m", "uvicorn", "panel.asgi:application", "--port", str(gw_port), "--loop",
                    "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"], env=env,
                   ready_url=f"http://127.0.0.1:{gw_port}/login/")
try:
    gb.BODY["model"] = "fake-model"
    direct = gb.ttft(f"{upstream_url}/chat/completions", {}, requests)
    gb.BODY["model"] = "chat"
    through = gb.ttft(f"http://127.0.0.1:{gw_port}/v1/chat/completions", {"Authorization": f"Bearer {key}"}, requests)
finally:
    gb.stop(gateway)
    gb.stop(upstream)
print(json.dumps({"tree": str(root), "direct": direct, "gateway": through,
                  "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3)}))
