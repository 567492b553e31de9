"""A small OpenAI-compatible provider (http.server in a thread) for the channel Test button: it answers, refuses keys,
lacks models, stalls or breaks on demand."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD_KEY = "sk-fake-provider-key-1234"


class FakeProvider:
    """An OpenAI-compatible server on 127.0.0.1. `behaviour`: ok, slow, html, 500, 429, no_choices, no_models."""

    def __init__(self):
        self.key = GOOD_KEY
        self.models = ["qwen2.5-7b-instruct", "tiny"]
        self.behaviour = "ok"
        self.delay = 2.0
        self.seen = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                provider.handle(self)

            def do_POST(self):
                provider.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request):
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length) or b"null") if length else None
        self.seen.append((request.command, request.path, request.headers.get("Authorization"), body))
        if self.behaviour == "slow":
            time.sleep(self.delay)
        if not request.path.startswith("/v1/") or (self.behaviour == "no_models" and request.path == "/v1/models"):
            return self.send(request, 404, {"detail": "Not Found"})
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return self.send(request, 401, {"error": {"message": "Incorrect API key provided: "
                                                      f"{(request.headers.get('Authorization') or '')[7:]}",
                                                      "type": "invalid_request_error", "code": "invalid_api_key"}})
        if self.behaviour == "html":
            return self.send(request, 200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
        if self.behaviour in ("500", "429"):
            return self.send(request, int(self.behaviour), {"error": {"message": "Rate limit reached for requests"
                                                                      if self.behaviour == "429" else "boom"}})
        if request.path == "/v1/models":
            return self.send(request, 200, {"object": "list", "data": [{"id": name, "object": "model"}
                                                                       for name in self.models]})
        if request.path == "/v1/chat/completions":
            if self.behaviour == "no_choices":
                return self.send(request, 200, {"result": "OK"})
            if body.get("model") not in self.models:
                return self.send(request, 404, {"object": "error", "type": "NotFoundError", "code": 404,
                                                "message": f"The model `{body.get('model')}` does not exist."})
            return self.send(request, 200, {
                "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}})
        return self.send(request, 404, {"detail": "Not Found"})

    @staticmethod
    def send(request, status, payload, content_type="application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)
