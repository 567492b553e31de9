"""What went wrong with an upstream call, in words: the usual troubleshooting list of an OpenAI-compatible call as a
table the Test button and the gateway share.

`describe_upstream_error(status=None, exception=None, body=None)` is the one entry point; the keyword-only extras
(which step, the model id, the ids /models listed, the timeout, the key) sharpen the message when the caller
knows them. Messages never contain the key: a body that echoes it is redacted."""
import re
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from panel.core import safejson

MESSAGES = {
    "unauthorized": "401 Unauthorized: the server refused the key. It is missing, wrong or revoked: copy it again "
                    "from the provider's API Keys page, and check that the environment variable the channel reads is "
                    "set for the panel.",
    "bearer": " The key itself starts with \"Bearer\": the client adds \"Bearer \" to the Authorization header, so "
              "the server received \"Bearer Bearer…\". Store only the key (sk-…).",
    "forbidden": "403 Forbidden: the key was recognised but may not use this model or endpoint (plan, quota "
                 "group, region or permissions). Check the key's permissions in the provider's console.",
    "not_found_path": "404 on GET /models: the path is wrong. OpenAI-compatible servers answer under /v1, so "
                      "base_url should end in /v1 (http://127.0.0.1:8000/v1, https://taotoken.net/api/v1): check it "
                      "is not missing and not doubled (/v1/v1).",
    "not_found_model": "404 on the chat completion: the model id {model} is not served here.",
    "not_found": "404 Not Found: either the path is wrong (base_url must end in /v1, once) or the model id is not "
                 "served by this server.",
    "bad_request": "400 Bad Request: the server refused the request itself.",
    "rate_limited": "429 Too Many Requests: over the provider's quota or rate limit. Check usage and "
                    "quota in its console; raise max_retries and retry_backoff so requests back off, and route "
                    "local_first so the local vLLM takes the load first.",
    "server_error": "{status} from the server: it failed while answering (a crash, an overload, or its own upstream "
                    "failing). Check its log; the gateway retries 5xx answers and then falls back.",
    "http_error": "HTTP {status} from the server.",
    "redirect": "{status} redirect: the server sends the request elsewhere, and Tokenwise never follows a redirect "
                "(it would carry the request and its key to an address no check has seen). Set base_url to the "
                "address the provider serves its API at (often https:// instead of http://, or with /v1).",
    "connection_refused": "Connection refused at {where}: nothing listens there. The server is down or the port is "
                          "wrong: check that it runs (ps aux | grep vllm), that it listens on that port "
                          "(netstat -tlnp), and that it did not die while loading (CUDA out of memory in its log).",
    "dns": "The host name {host} does not resolve (DNS failure): check the spelling of base_url and this "
           "machine's DNS.",
    "connect_timeout": "No connection to {where}{within}: the host is unreachable (firewall, wrong address) or "
                       "overloaded.",
    "read_timeout": "The server took the request but gave no answer{within}: it is too slow or stuck (a long "
                    "queue, a model still loading). If it is only slow, raise timeout_seconds.",
    "timeout": "No answer{within}: the server is too slow or unreachable. Raise timeout_seconds if it is only slow.",
    "tls": "The TLS handshake with {where} failed: the server may speak plain http (use http://), or its "
           "certificate is not trusted here.",
    "protocol": "The connection broke or the answer was not HTTP: another service on that port, or the server "
                "crashed mid-answer.",
    "unsupported_protocol": "base_url must start with http:// or https://.",
    "network": "The request failed: {error}.",
    "not_json": "The server answered {status} but not with JSON ({snippet}): base_url points at a web page or a "
                "proxy, not the API. OpenAI SDKs need base_url to end in /v1.",
    "no_choices": "The answer has no \"choices\" (a client says \"KeyError: choices\"): base_url is probably "
                  "wrong. The SDK appends /chat/completions to base_url, so it must end in /v1: "
                  "http://127.0.0.1:8000/v1, not http://127.0.0.1:8000.",
}

# A few words for the step's own line; the full message goes into the diagnosis.
SHORT = {
    "unauthorized": "key refused", "bearer": "key refused", "forbidden": "not allowed", "not_found_path": "path not "
    "found", "not_found_model": "model not served", "not_found": "not found", "bad_request": "request refused",
    "rate_limited": "rate limited", "server_error": "server error", "http_error": "unexpected status",
    "redirect": "redirected (not followed)",
    "connection_refused": "connection refused", "dns": "host name does not resolve", "connect_timeout": "no "
    "connection", "read_timeout": "no answer in time", "timeout": "timed out", "tls": "TLS handshake failed",
    "protocol": "connection broken", "unsupported_protocol": "not http(s)", "network": "request failed",
    "not_json": "not JSON", "no_choices": "no choices in the answer",
}

KEY_LIKE = re.compile(r"\b(sk|pk|rk|tk|key)-[A-Za-z0-9_\-]{8,}")
ERRNO_REFUSED = {111, 61, 10061}


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    message: str


def _chain(exception):
    """The exception and everything it was raised from (httpx wraps httpcore, which wraps the OSError)."""
    seen = []
    while exception is not None and exception not in seen:
        seen.append(exception)
        exception = exception.__cause__ or exception.__context__
    return seen


def exception_kind(exception):
    """The failure class of a transport exception: connection_refused, dns, connect_timeout, read_timeout..."""
    chain = _chain(exception)
    text = " ".join(str(error) for error in chain).lower()
    if any(isinstance(error, httpx.ConnectTimeout) for error in chain):
        return "connect_timeout"
    if any(isinstance(error, (httpx.ReadTimeout, httpx.WriteTimeout)) for error in chain):
        return "read_timeout"
    if any(isinstance(error, (httpx.TimeoutException, TimeoutError, socket.timeout)) for error in chain):
        return "timeout"
    if any(isinstance(error, socket.gaierror) for error in chain) or any(
            marker in text for marker in ("name or service not known", "temporary failure in name resolution",
                                          "nodename nor servname", "no address associated", "getaddrinfo failed",
                                          "does not resolve")):
        return "dns"
    if any(isinstance(error, ConnectionRefusedError) or getattr(error, "errno", None) in ERRNO_REFUSED
           for error in chain) or "connection refused" in text:
        return "connection_refused"
    if any(isinstance(error, ssl.SSLError) for error in chain) or "ssl" in text or "certificate" in text:
        return "tls"
    if any(isinstance(error, httpx.UnsupportedProtocol) for error in chain):
        return "unsupported_protocol"
    if any(isinstance(error, (httpx.RemoteProtocolError, httpx.LocalProtocolError, ConnectionResetError))
           for error in chain):
        return "protocol"
    return "network"


def status_kind(status, *, step=None, body=None, model_listed=None):
    if status == 401:
        return "unauthorized"
    if status == 403:
        return "forbidden"
    if status == 404:
        if step == "models":
            return "not_found_path"
        if step == "chat" and model_listed is False:
            return "not_found_model"
        return "not_found_model" if _mentions_model(body) else "not_found"
    if status == 400 and _mentions_model(body):
        return "not_found_model"
    if status == 400:
        return "bad_request"
    if status == 429:
        return "rate_limited"
    if status is not None and status >= 500:
        return "server_error"
    if status is not None and 300 <= status < 400:
        return "redirect"
    return "http_error"


def _mentions_model(body):
    text = _text(body).lower()
    return "model" in text and any(word in text for word in ("not exist", "not found", "does not", "unknown",
                                                              "not supported", "no such", "invalid model"))


def _text(body):
    if body is None:
        return ""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body[:4000]).decode("utf-8", "replace")
    return str(body)[:4000]


def server_said(body, *, secret=""):
    """The error message inside an OpenAI-style error body (or the start of the body), redacted and short."""
    text = _text(body).strip()
    if not text:
        return ""
    try:
        data = safejson.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(data.get("message"), str):
            text = data["message"]
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
    return redact(" ".join(text.split())[:300], secret=secret)


def redact(text, *, secret=""):
    if secret and len(secret) >= 4:
        text = text.replace(secret, "••••")
    return KEY_LIKE.sub(lambda match: match.group(1) + "-••••", text)


def diagnose(status=None, exception=None, body=None, *, step=None, model_id="", served_ids=None, url="",
             timeout=None, key=""):
    """A Diagnosis (kind, message) for a failed upstream call: an HTTP status with its body, or an exception."""
    parts = urlsplit(url) if url else None
    host = (parts.hostname or "") if parts else ""
    where = f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}" if parts and host else "the server"
    within = f" within {timeout:g} s" if timeout else ""
    if exception is not None:
        kind = exception_kind(exception)
        message = MESSAGES[kind].format(where=where, host=host or "the server", within=within,
                                        error=redact(str(exception)[:200] or type(exception).__name__, secret=key))
        return Diagnosis(kind, message)
    model_listed = None if served_ids is None or not model_id else model_id in served_ids
    kind = status_kind(status, step=step, body=body, model_listed=model_listed)
    message = MESSAGES[kind].format(status=status, model=repr(model_id) if model_id else "")
    if kind == "unauthorized" and key.strip().lower().startswith("bearer"):
        message += MESSAGES["bearer"]
    if kind == "not_found_model" and served_ids is not None:
        message += (" /models lists: " + ", ".join(served_ids[:20]) + "." if served_ids
                    else " /models lists no model at all.")
        message += " Set model_id to one of them (a local vLLM serves the name given by --served-model-name)."
    said = server_said(body, secret=key)
    if said:
        message += f" The server said: {said}"
    return Diagnosis(kind, message)


def describe_upstream_error(status=None, exception=None, body=None, **context):
    """One sentence or three about an upstream failure, for the Test button, the gateway's errors and its log."""
    return diagnose(status, exception, body, **context).message


def describe_not_json(status, body):
    snippet = " ".join(_text(body)[:80].split()) or "an empty body"
    return Diagnosis("not_json", MESSAGES["not_json"].format(status=status, snippet=repr(snippet)))


def describe_no_choices():
    return Diagnosis("no_choices", MESSAGES["no_choices"])
