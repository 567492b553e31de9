"""Request size limits for the panel's pages (the gateway has its own: GATEWAY_MAX_BODY_BYTES).

Django already refuses a form body over DATA_UPLOAD_MAX_MEMORY_SIZE, but it counts no file uploads, and its answer
is a bare "Bad Request (400)". `UploadSizeLimit` refuses a multipart body over MAX_UPLOAD_BYTES before any file is
written, and `bad_request` turns every too-large refusal into a 413 page that says which limit was hit."""
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.files.uploadhandler import FileUploadHandler
from django.shortcuts import render
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
