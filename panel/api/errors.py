"""Every refusal of the API in one shape: {"detail": words, "errors": {field: [words]}} with 400 (nothing was
saved), 401, 403 or 404; the OpenAPI schema lists them on every operation. A launch of long work answers 429 while the
team has as many long runs as it may (panel/jobs/queues.py)."""
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.http import Http404
from ninja import Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as SchemaError

from panel.jobs.queues import LongRunsFull


class Problem(Schema):
    detail: str
    errors: dict[str, list[str]] = {}


class Invalid(Exception):
    """A refusal with field errors (from a page's form or a service's ValidationError)."""

    def __init__(self, errors, detail=None):
        self.errors = {str(field): [str(message) for message in messages] for field, messages in errors.items()}
        first = next((messages[0] for messages in self.errors.values() if messages), "The request is not valid.")
        self.detail = detail or first
        super().__init__(self.detail)


def invalid_from(error):
    """An Invalid from a Django ValidationError (field errors kept; others under "__all__")."""
    if hasattr(error, "error_dict"):
        return Invalid({("__all__" if field == "__all__" or field is None else field): list(ValidationError(
            messages).messages) for field, messages in error.error_dict.items()})
    return Invalid({"__all__": error.messages})


def form_invalid(form):
    return Invalid({field: [item["message"] for item in items] for field, items in form.errors.get_json_data().items()})


def errors(ok, *, long_run=False):
    """The responses of an operation whose success is `ok` ({status: schema}); a launch of long work (`long_run`)
    may also answer 429."""
    return {**ok, 400: Problem, 401: Problem, 403: Problem, 404: Problem, **({429: Problem} if long_run else {})}


def install(api):
    def answer(request, status, detail, errors=None):
        return api.create_response(request, {"detail": detail, "errors": errors or {}}, status=status)

    api.exception_handler(Invalid)(lambda request, exc: answer(request, 400, exc.detail, exc.errors))
    api.exception_handler(ValidationError)(
        lambda request, exc: answer(request, 400, invalid_from(exc).detail, invalid_from(exc).errors))
    api.exception_handler(LongRunsFull)(
        lambda request, exc: answer(request, 429, invalid_from(exc).detail, invalid_from(exc).errors))
    api.exception_handler(PermissionDenied)(
        lambda request, exc: answer(request, 403, str(exc) or "You may not do this."))
    api.exception_handler(Http404)(lambda request, exc: answer(request, 404, "Not found in your team."))
    api.exception_handler(AuthenticationError)(
        lambda request, exc: answer(request, 401, "Sign in, or send a personal access token: "
                                                  "Authorization: Bearer twp-…"))
    api.exception_handler(RequestDataTooBig)(
        lambda request, exc: answer(request, 413, f"The request body is larger than "
                                                  f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes "
                                                  "(TOKENWISE_MAX_FORM_BYTES)."))
    api.exception_handler(HttpError)(lambda request, exc: answer(request, exc.status_code, str(exc)))

    def schema_error(request, exc):
        found = {}
        for item in exc.errors:
            location = [str(part) for part in item.get("loc", ()) if part not in ("body", "payload", "query")]
            found.setdefault(".".join(location) or "__all__", []).append(item.get("msg", "not valid"))
        return answer(request, 400, "The request does not match the schema: " + "; ".join(
            f"{field}: {messages[0]}" for field, messages in found.items()), found)

    api.exception_handler(SchemaError)(schema_error)
