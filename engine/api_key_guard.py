"""Runs inside the vLLM server (the panel adds `--middleware engine.api_key_guard.ApiKeyGuard`): every path needs the
engine's key, `Authorization: Bearer <VLLM_API_KEY>`.

vLLM's own --api-key check covers only /v1, /v2, /inference and /cohere: /invocations (SageMaker's door to the same
generation), /tokenize, /detokenize, /pooling, /metrics (a separate Prometheus app mounted on the server), /health
and the rest would answer anyone who reaches the port. This middleware wraps the whole application, mounts
included, so nothing stays open: the panel's own callers (readiness probe, local channel, scraper, benchmarks) all
send the key. A server started without a key refuses to start rather than run open."""
import hashlib
import hmac
import json
import os

UNAUTHORIZED = json.dumps({"error": {
    "message": "this engine needs its key: send Authorization: Bearer <VLLM_API_KEY>",
    "type": "authentication_error", "code": "invalid_api_key"}}).encode()


def key_digest():
    """SHA-256 of the engine's key (VLLM_API_KEY), or RuntimeError when it has none."""
    key = os.environ.get("VLLM_API_KEY", "")
    if not key:
        raise RuntimeError("engine.api_key_guard: VLLM_API_KEY is empty; the engine refuses to start without a key "
                           "(it would answer anyone who reaches its port)")
    return hashlib.sha256(key.encode()).digest()


# Read on import: vLLM imports this module while it builds the server, so a missing key stops the start there
# (Starlette builds middleware lazily, and uvicorn would only log a failure then, serving 500s).
WANTED = key_digest()


class ApiKeyGuard:
    """Pure ASGI middleware: an HTTP request or WebSocket without the key gets 401 (a WebSocket is closed before it
    is accepted, which servers answer with 403); lifespan events pass."""

    def __init__(self, app):
        self.app = app

    def allows(self, scope):
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                # Compare digests: equal length, so the comparison's time says nothing about the key.
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(token.strip().encode()).digest(), WANTED)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                    (b"content-length", str(len(UNAUTHORIZED)).encode())]})
            await send({"type": "http.response.body", "body": UNAUTHORIZED})
