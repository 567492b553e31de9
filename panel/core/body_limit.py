"""The panel's outermost size check, in front of Django (panel/asgi.py).

Django's ASGI handler reads a whole request body into a spooled temporary file before any view, form or upload
handler sees it, so `UploadSizeLimit` (panel/core/limits.py) refuses a 10 GB upload only after 10 GB reached the
disk. `BodyLimit` refuses a body larger than anything a page accepts (the larger of the form and the upload limit)
on its Content-Length at once, and a body without one (chunked) as soon as it passes the limit, with the same 413
page. Bodies under the limit go on to Django, whose own checks keep their more precise words."""
from django.conf import settings
from django.template.loader import render_to_string

from panel.core.limits import too_large_context


class BodyTooLarge(Exception):
    pass


def body_limit():
    return max(settings.MAX_UPLOAD_BYTES, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def declared_length(scope):
    """The Content-Length header as a number, or None (absent; the HTTP server refuses one that is not a number)."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


class BodyLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit()
        length = declared_length(scope)
        if length is not None and length > limit:
            return await refuse(send, limit)
        received = 0

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge()
            return message

        try:
            await self.app(scope, counted_receive, send)
        except BodyTooLarge:  # raised while Django read the body: no response has started
            await refuse(send, limit)


async def refuse(send, limit):
    words = f"The request is larger than {limit / (1024 * 1024):g} MB."
    page = render_to_string("core/too_large.html", {**too_large_context(), "words": words}).encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(page)).encode()),
               (b"connection", b"close")]  # the rest of the body is not read
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": page})
