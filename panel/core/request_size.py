"""Request size limits for the panel's pages (the gateway has its own: GATEWAY_MAX_BODY_BYTES).

Three places, from the outside in:
- `BodyLimit`, in front of Django (panel/asgi.py): Django's ASGI handler reads a whole request body into a spooled
  temporary file before any view, form or upload handler sees it, so this refuses a body larger than anything a page
  accepts (the larger of the form and the upload limit) on its Content-Length at once, and a body without one
  (chunked) as soon as it passes the limit. Bodies under the limit go on to Django, whose own checks keep their more
  precise words.
- Django refuses a form body over DATA_UPLOAD_MAX_MEMORY_SIZE, but it counts no file uploads, and its answer is a
  bare "Bad Request (400)". `UploadSizeLimit` refuses a multipart body over MAX_UPLOAD_BYTES before any file is
  written.
- `bad_request` turns every too-large refusal into a 413 page that says which limit was hit."""
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.files.uploadhandler import FileUploadHandler
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views import defaults


def _mb(size):
    return f"{size / (1024 * 1024):g} MB"


class UploadSizeLimit(FileUploadHandler):
    """First in FILE_UPLOAD_HANDLERS: a multipart request larger than MAX_UPLOAD_BYTES stops here."""

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        if content_length > settings.MAX_UPLOAD_BYTES:
            raise RequestDataTooBig(f"The upload is larger than {_mb(settings.MAX_UPLOAD_BYTES)}.")
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        # A body that lied about its length is counted as it arrives.
        self.received += len(raw_data)
        if self.received > settings.MAX_UPLOAD_BYTES:
            raise RequestDataTooBig(f"The upload is larger than {_mb(settings.MAX_UPLOAD_BYTES)}.")
        return raw_data

    def file_complete(self, file_size):
        return None


def bad_request(request, exception=None):
    """handler400: too-large requests get 413 and the limit in words; other bad requests Django's page."""
    if isinstance(exception, (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)):
        if isinstance(exception, RequestDataTooBig) and "upload" in str(exception):
            words = str(exception)
        elif isinstance(exception, RequestDataTooBig):
            words = f"The form is larger than {_mb(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)}."
        else:
            words = "The form has too many fields or files."
        return render(request, "core/too_large.html", {**too_large_context(), "words": words}, status=413)
    return defaults.bad_request(request, exception)


def too_large_context():
    return {"form_limit": _mb(settings.DATA_UPLOAD_MAX_MEMORY_SIZE), "upload_limit": _mb(settings.MAX_UPLOAD_BYTES)}


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
