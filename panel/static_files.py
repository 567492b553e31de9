"""A small ASGI layer that serves collected static files (CSS, JS, plotly.js) from STATIC_ROOT."""
import mimetypes
import os
from pathlib import Path

CHUNK = 256 * 1024


class StaticFiles:
    def __init__(self, app, *, url_prefix, root):
        self.app = app
        self.prefix = url_prefix
        self.root = Path(root).resolve()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed")
            return
        path = self.resolve(scope["path"][len(self.prefix):])
        if path is None:
            await respond(send, 404, b"not found")
            return
        await self.send_file(scope, send, path)

    def resolve(self, relative):
        """The file for `relative`, or None if it is missing or escapes the root."""
        candidate = (self.root / relative).resolve()
        if self.root not in candidate.parents or not candidate.is_file():
            return None
        return candidate

    async def send_file(self, scope, send, path):
        content_type, encoding = mimetypes.guess_type(str(path))
        if content_type is None:
            content_type = "application/octet-stream"
        if content_type.startswith("text/") or content_type in ("application/javascript", "text/javascript"):
            content_type += "; charset=utf-8"
        stat = os.stat(path)
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(stat.st_size).encode()),
            (b"cache-control", b"public, max-age=3600"),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        with open(path, "rb") as handle:
            while True:
                chunk = handle.read(CHUNK)
                more = len(chunk) == CHUNK
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
                if not more:
                    break


async def respond(send, status, body):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
