"""A small OpenAI-compatible provider (http.server in a thread) for the channel Test button: it answers, refuses keys,
lacks models, stalls or breaks on demand; and, for budgets, bills prompts as a real chat template does."""
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD_KEY = "sk-fake-provider-key-1234"
WORD = "ok"  # each token of a templated answer


def template_tokens(body):
    """The prompt tokens a request is billed with SmolLM2's chat template: its default system prompt (21 tokens with
    its markers) when the conversation has none, 5 markers per message, 3 for the answer's header, and a token per 3
    bytes of each message's text (a stand-in for its tokenizer, above the gateway's chars/4 estimate); a completions
    prompt is its text's tokens and a start token."""
    if "prompt" in body:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        return sum(math.ceil(len(text.encode()) / 3) + 1 for text in prompts)
    messages = body.get("messages") or []
    system = 0 if messages and messages[0].get("role") == "system" else 21
    return system + 3 + sum(5 + math.ceil(len(_text(message.get("content")).encode()) / 3) for message in messages)


def _text(content):
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


class FakeProvider:
    """An OpenAI-compatible server on 127.0.0.1. `behaviour`: ok, slow, html, 500, 429, no_choices, no_models, or
    template: chat and completions answers (streamed or whole) billed as a chat template does (`template_tokens`),
    each answer `answer_tokens` tokens or max_tokens when lower, its tokens `chunk_delay` seconds apart."""

    def __init__(self):
        self.key = GOOD_KEY
        self.models = ["qwen2.5-7b-instruct", "tiny"]
        self.behaviour = "ok"
        self.delay = 2.0
        self.answer_tokens = 30
        self.chunk_delay = 0.0
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
        if self.behaviour == "template" and request.path in ("/v1/chat/completions", "/v1/completions"):
            return self.templated(request, body)
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

    def templated(self, request, body):
        """An answer billed as a chat template bills: its usage in the last stream event or in the whole answer."""
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        tokens = min(limit or self.answer_tokens, self.answer_tokens)
        usage = {"prompt_tokens": template_tokens(body), "completion_tokens": tokens,
                 "total_tokens": template_tokens(body) + tokens}
        chat = request.path == "/v1/chat/completions"
        finish = "length" if limit and limit <= tokens else "stop"
        if not body.get("stream"):
            text = " ".join([WORD] * tokens)
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {
                "index": 0, "text": text}
            return self.send(request, 200, {"id": "fake-1", "object": "chat.completion" if chat else "text_completion",
                                            "model": body["model"], "choices": [dict(choice, finish_reason=finish)],
                                            "usage": usage})
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()  # HTTP/1.0: the stream ends with the connection
        for index in range(tokens):
            piece = (WORD if index == 0 else " " + WORD)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            self.event(request, {"id": "fake-1", "model": body["model"], "choices": [dict(choice, finish_reason=None)]})
            time.sleep(self.chunk_delay)
        self.event(request, {"id": "fake-1", "model": body["model"], "choices": [
            {"index": 0, "delta": {}, "finish_reason": finish} if chat else {"index": 0, "text": "",
                                                                             "finish_reason": finish}]})
        self.event(request, {"id": "fake-1", "model": body["model"], "choices": [], "usage": usage})
        request.wfile.write(b"data: [DONE]\n\n")

    @staticmethod
    def event(request, payload):
        request.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        request.wfile.flush()

    @staticmethod
    def send(request, status, payload, content_type="application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)
