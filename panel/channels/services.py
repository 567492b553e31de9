"""Channels and routes: validation (the usual mistakes with an OpenAI-compatible base URL as rules), create/update in
one transaction, the Test button, local channels for deployments, key rotation."""
import logging
import math
import os
import re
import time
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from panel.channels import diagnosis, pools, rules
from panel.channels.credential_env import env_binding_refusal, env_name_refusal
from panel.channels.models import (
    EMPTY_KEY,
    Channel,
    ChannelApis,
    ChannelKind,
    CredentialError,
    CredentialKind,
    Route,
    RouteBalance,
    RouteChannel,
    RouteStrategy,
    WhileWaking,
)
from panel.channels.routing import routing_changed
from panel.core import crypto, outbound, safejson
from panel.env import EnvError

log = logging.getLogger(__name__)

TAOTOKEN = {"name": "taotoken", "kind": ChannelKind.REMOTE, "base_url": "https://taotoken.net/api/v1",
            "credential_kind": CredentialKind.ENV, "credential_env": "TAOTOKEN_API_KEY",
            "model_id": "qwen2.5-7b-instruct", "apis": ChannelApis.CHAT_ONLY}
PRESETS = {"taotoken": {"label": "TaoToken", "description": "TaoToken's unified key and API: base URL "
                        "https://taotoken.net/api/v1, key read from TAOTOKEN_API_KEY.", "values": TAOTOKEN}}

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
MODEL_RE = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")
KEY_CHARS_RE = re.compile(r"^[\x21-\x7e]+$")
VERSION_SEGMENT_RE = re.compile(r"^v\d+[a-z0-9]*$")
ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/models", "/embeddings")
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}

LIMITS = {  # field: (minimum, maximum, words)
    "connect_timeout_seconds": (0.1, 600, "seconds"),
    "first_byte_timeout_seconds": (0.1, 3600, "seconds"),
    "idle_timeout_seconds": (0.1, 3600, "seconds"),
    "timeout_seconds": (0.1, 3600, "seconds"),
    "max_retries": (0, 10, "retries"),
    "retry_backoff": (0, 60, "seconds"),
    "priority": (0, 100_000, ""),
    "weight": (0, 1000, ""),
    "price_input_per_million": (0, 999_999, ""),
    "price_output_per_million": (0, 999_999, ""),
    "price_cached_per_million": (0, 999_999, ""),
    "price_cache_write_per_million": (0, 999_999, ""),
    "price_tool_calls_per_thousand": (0, 999_999, ""),
}
OPTIONAL = ("price_cache_write_per_million",)  # empty is allowed: see the field
TEST_TIMEOUT_CAP = 20.0  # the Test button runs in a page request: it waits at most this long per step
MAX_TEST_BODY = 2 * 1024 * 1024


# ------------------------------------------------------------------------------------------------- rules

def base_url_check(url):
    """(cleaned url, errors, warnings) for a channel's base URL, with the usual mistakes explained."""
    if not isinstance(url, str) or not url.strip():
        return "", ["Enter the server's base URL, for example http://127.0.0.1:8000/v1."], []
    url = url.strip()
    if len(url) > 300:
        return url, ["The base URL is longer than 300 characters."], []
    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return url, ["The base URL contains spaces or control characters."], []
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return url, ["The base URL must start with http:// or https://."], []
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return url, ["The base URL has a port that is not a number from 1 to 65535."], []
    if not host:
        return url, ["The base URL has no host name."], []
    if port == 0:
        return url, ["The base URL has a port that is not a number from 1 to 65535."], []
    if parts.username or parts.password:
        return url, ["Put the key in the credential field, not in the URL (a URL ends up in logs)."], []
    if parts.query or parts.fragment:
        return url, ["The base URL cannot have a query string or #fragment: the client appends paths to it."], []
    path = re.sub(r"/+$", "", parts.path)
    cleaned = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    segments = [segment for segment in path.split("/") if segment]
    if len(segments) >= 2 and segments[-1] == "v1" and segments[-2] == "v1":
        fixed = urlunsplit((parts.scheme, parts.netloc, path[:-3], "", ""))
        return cleaned, [f"The base URL ends in /v1/v1: /v1 is there twice. The SDK appends /chat/completions to "
                         f"base_url as it is, so the server would see /v1/v1/chat/completions and answer 404. "
                         f"Remove one: {fixed}"], []
    lowered = path.lower()
    for suffix in ENDPOINT_SUFFIXES:
        if lowered.endswith(suffix):
            fixed = urlunsplit((parts.scheme, parts.netloc, path[:-len(suffix)], "", ""))
            return cleaned, [f"The base URL ends in {suffix}: that is an endpoint, not the base. The client appends "
                             f"{suffix} itself; use {fixed}"], []
    warnings = []
    if not any(VERSION_SEGMENT_RE.match(segment) for segment in segments):
        suggestion = urlunsplit((parts.scheme, parts.netloc, path + "/v1", "", ""))
        warnings.append(f"The base URL has no /v1. Most OpenAI-compatible servers need it (vLLM: "
                        f"http://127.0.0.1:8000/v1, TaoToken: https://taotoken.net/api/v1); without it the SDK "
                        f"calls {path or ''}/chat/completions and gets 404. Did you mean {suggestion}?")
    return cleaned, [], warnings


def api_key_errors(key):
    """Errors for a key typed into the form (or found literally in a settings.json)."""
    stripped = key.strip()
    if stripped.lower().startswith("bearer"):
        return ["Enter the key without \"Bearer\": the client adds \"Bearer \" to the Authorization header itself, "
                "so the server would receive \"Bearer Bearer sk-…\" and answer 401."]
    if stripped == EMPTY_KEY:
        return ["EMPTY means \"no key\" (a local vLLM): choose the credential None instead."]
    match = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", stripped)
    if match:
        return [f"That is a reference to an environment variable: choose \"Environment variable\" and enter "
                f"{match.group(1)}."]
    if not KEY_CHARS_RE.match(stripped):
        return ["A key is plain ASCII without spaces or line breaks: copy it again from the provider's page."]
    if len(stripped) < 8:
        return ["That is too short to be an API key."]
    if len(stripped) > 500:
        return ["That is longer than any API key (500 characters at most)."]
    return []


def env_name_errors(name):
    if not name:
        return ["Name the environment variable that holds the key, for example TAOTOKEN_API_KEY."]
    if not ENV_RE.match(name):
        return ["An environment variable name is letters, digits and underscores, not starting with a digit "
                "(TAOTOKEN_API_KEY)."]
    refusal = env_name_refusal(name)
    return [refusal[:1].upper() + refusal[1:]] if refusal else []


def model_id_errors(model_id):
    if not isinstance(model_id, str) or not MODEL_RE.match(model_id):
        return ["Enter the model id the server serves (no spaces), for example qwen2.5-7b-instruct or "
                "Qwen/Qwen2.5-7B-Instruct-AWQ; GET /models lists them."]
    return []


def name_errors(name):
    if not isinstance(name, str) or not NAME_RE.match(name):
        return ["A channel name is 1-100 letters, digits, '-', '_' or '.', starting with a letter or digit."]
    return []


def number_errors(field, value):
    minimum, maximum, unit = LIMITS[field]
    if isinstance(value, bool) or value is None:
        return ["Enter a number."]
    try:
        number = Decimal(str(value)) if isinstance(value, (Decimal, str)) else value
        finite = math.isfinite(float(number))
    except (InvalidOperation, ValueError, TypeError, OverflowError):
        return ["Enter a number."]
    if not finite or number < minimum or number > maximum:
        return [f"Enter a value from {minimum:g} to {maximum:g}{' ' + unit if unit else ''}."]
    return []


def is_loopback(url):
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def is_engine_channel(channel):
    return channel.is_engine_channel


def channel_check(channel, *, api_key="", scrape_token=""):
    """Every rule for a channel about to be saved: ({field: [errors]}, [warnings]). Cleans base_url (and a pool's
    scrape URLs) in place."""
    errors, warnings = {}, []

    def add(field, messages):
        if messages:
            errors.setdefault(field, []).extend(messages)

    add("name", name_errors(channel.name))
    taken = Channel.objects.filter(team_id=channel.team_id, name=channel.name).exclude(pk=channel.pk)
    if not errors.get("name") and taken.exists():
        add("name", [f"This team already has a channel named {channel.name!r}."])
    if channel.kind not in ChannelKind.values:
        add("kind", ["Choose local, remote or vLLM pool."])
    cleaned, url_errors, url_warnings = base_url_check(channel.base_url)
    add("base_url", url_errors)
    warnings += url_warnings
    if not url_errors:
        channel.base_url = cleaned
        refusal = outbound.url_refusal(cleaned, loopback_ok=is_engine_channel(channel))
        if refusal:
            add("base_url", [f"The panel does not call this address: {refusal}."])
    add("model_id", model_id_errors(channel.model_id))
    for field in LIMITS:
        if not (field in OPTIONAL and getattr(channel, field) is None):
            add(field, number_errors(field, getattr(channel, field)))
    if channel.apis not in ChannelApis.values:
        add("apis", ["Choose the APIs the server speaks."])
    if channel.deployment_id and channel.deployment.team_id != channel.team_id:
        add("deployment", ["That deployment belongs to another team."])
    if channel.deployment_id and channel.kind != ChannelKind.LOCAL:
        add("deployment", ["Only a local channel is linked to a deployment."])
    kind = channel.credential_kind
    if kind not in CredentialKind.values:
        add("credential_kind", ["Choose how the key is provided."])
    elif kind == CredentialKind.STORED:
        if api_key:
            add("api_key", api_key_errors(api_key))
        elif not channel.credential_ciphertext:
            add("api_key", ["Enter the key to store (it is encrypted at rest and never shown again)."])
    elif kind == CredentialKind.ENV:
        add("credential_env", env_name_errors(channel.credential_env))
        if not errors.get("credential_env") and not errors.get("base_url"):
            refusal = env_binding_refusal(channel)  # the operator's key goes only where the operator bound it
            if refusal:
                add(refusal[0], [refusal[1][:1].upper() + refusal[1][1:]])
        if not errors.get("credential_env"):
            if not os.environ.get(channel.credential_env):
                warnings.append(f"{channel.credential_env} is not set in the panel's environment: the gateway "
                                "reports this channel as misconfigured until it is set where the panel runs.")
    if kind == CredentialKind.NONE and channel.kind == ChannelKind.REMOTE and not is_loopback(channel.base_url):
        warnings.append("A remote provider usually needs a key: with none, it will answer 401.")
    if (not errors.get("price_input_per_million") and not errors.get("price_cached_per_million")
            and channel.price_input_per_million and not channel.price_cached_per_million):
        warnings.append("Cached prompt tokens are billed at the cached price, which is 0: set it to the input price "
                        "if this provider gives no discount for cached tokens.")
    pool_errors, pool_warnings = pools.pool_check(channel, scrape_token=scrape_token)
    for field, messages in pool_errors.items():
        add(field, messages)
    return errors, warnings + pool_warnings


# ------------------------------------------------------------------------------------------------- channels

CHANNEL_FIELDS = ("name", "kind", "deployment", "base_url", "model_id", "apis", "credential_kind", "credential_env",
                  "connect_timeout_seconds", "first_byte_timeout_seconds", "idle_timeout_seconds",
                  "timeout_seconds", "max_retries", "retry_backoff", "priority", "weight", "price_input_per_million",
                  "price_output_per_million", "price_cached_per_million", "price_cache_write_per_million",
                  "price_tool_calls_per_thousand", "enabled", *pools.POOL_ONLY)


def _channel_save(channel, *, api_key, scrape_token="", before_urls=""):
    errors, warnings = channel_check(channel, api_key=api_key, scrape_token=scrape_token)
    if errors:
        raise ValidationError(errors)
    errors = pools.pool_token_store(channel, scrape_token, before_urls=before_urls)
    if errors:
        raise ValidationError(errors)
    if channel.credential_kind == CredentialKind.STORED:
        if api_key:
            key = api_key.strip()
            try:
                channel.credential_ciphertext = crypto.encrypt(key)
            except EnvError as error:
                raise ValidationError({"api_key": [f"The key cannot be stored: {error}"]}) from None
            channel.credential_last4 = key[-4:]
    else:
        channel.credential_ciphertext = ""
        channel.credential_last4 = ""
    if channel.credential_kind != CredentialKind.ENV:
        channel.credential_env = ""
    channel.misconfigured = channel.credential_problem()
    channel.save()
    routing_changed(channel.team_id)
    channel.warnings = warnings
    return channel


@transaction.atomic
def channel_create(*, team, user=None, api_key="", scrape_token="", **fields):
    """Create a channel after every check (ValidationError {field: [messages]} otherwise; nothing saved).
    A stored key (and a pool's scrape token) is encrypted here; the returned channel carries `.warnings`."""
    unknown = set(fields) - set(CHANNEL_FIELDS)
    if unknown:
        raise TypeError(f"unknown channel fields: {sorted(unknown)}")
    channel = Channel(team=team, created_by=user, **fields)
    return _channel_save(channel, api_key=api_key, scrape_token=scrape_token)


def _origin(url):
    try:
        parts = urlsplit((url or "").strip())
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return url


@transaction.atomic
def channel_update(*, channel, api_key="", scrape_token="", **fields):
    """Change a channel. An empty `api_key` keeps the stored key; a new one replaces it, and is required when the
    base URL moves to another origin (scheme, host, port), so a stored key never follows the URL to a new server.
    The returned channel carries `.changes`: {field: (before, after)} for base_url and credential_kind."""
    unknown = set(fields) - set(CHANNEL_FIELDS)
    if unknown:
        raise TypeError(f"unknown channel fields: {sorted(unknown)}")
    # As stored, not as given: a ModelForm has already written the new values onto the instance.
    saved = Channel.objects.filter(pk=channel.pk).values("base_url", "credential_kind", "credential_ciphertext",
                                                         "scrape_urls").first()
    saved = saved or {"base_url": channel.base_url, "credential_kind": channel.credential_kind,
                      "credential_ciphertext": channel.credential_ciphertext, "scrape_urls": channel.scrape_urls}
    before = {"base_url": saved["base_url"], "credential_kind": saved["credential_kind"]}
    had_stored_key = saved["credential_kind"] == CredentialKind.STORED and bool(saved["credential_ciphertext"])
    for name, value in fields.items():
        setattr(channel, name, value)
    if (had_stored_key and channel.credential_kind == CredentialKind.STORED and not api_key
            and _origin(channel.base_url) != _origin(before["base_url"])):
        raise ValidationError({"api_key": ["The base URL now points at another server: enter the key again (a stored "
                                           "key is never sent to a new server without someone typing it)."]})
    channel = _channel_save(channel, api_key=api_key, scrape_token=scrape_token, before_urls=saved["scrape_urls"])
    channel.changes = {name: (value, getattr(channel, name)) for name, value in before.items()
                       if value != getattr(channel, name)}
    return channel


@transaction.atomic
def channel_delete(*, channel):
    team_id = channel.team_id
    channel.delete()
    routing_changed(team_id)


def credentials_rotate():
    """Re-encrypt every stored key with the first key of TOKENWISE_ENCRYPTION_KEYS. Returns (rotated, problems):
    a key no configured key opens is left as it is and its channel marked misconfigured."""
    rotated, problems = 0, []
    for channel in Channel.objects.filter(credential_kind=CredentialKind.STORED).exclude(credential_ciphertext=""):
        try:
            token = crypto.rotate(channel.credential_ciphertext)
        except CredentialError as error:
            Channel.objects.filter(pk=channel.pk).update(misconfigured=str(error))
            problems.append(f"{channel.team} / {channel.name}: {error}")
            continue
        Channel.objects.filter(pk=channel.pk).update(credential_ciphertext=token, misconfigured="")
        rotated += 1
    return rotated, problems


# ------------------------------------------------------------------------------------------------- routes

def route_check(*, team, route, model_name, strategy, entries):
    errors = {}
    if not isinstance(model_name, str) or not MODEL_RE.match(model_name):
        errors["model_name"] = ["Enter the model name clients send (no spaces, 200 characters at most), for example "
                                "qwen2.5-14b-instruct."]
    elif Route.objects.filter(team=team, model_name=model_name).exclude(pk=route.pk if route else None).exists():
        errors["model_name"] = [f"This team already has a route for {model_name!r}."]
    if strategy not in RouteStrategy.values:
        errors["strategy"] = ["Choose local_first, priority or weighted."]
    if not entries:
        errors["channels"] = ["Pick at least one channel."]
    channels = [channel for channel, _, _ in entries]
    if any(channel.team_id != team.pk for channel in channels):
        errors["channels"] = ["A channel of another team cannot be used."]
    elif len({channel.pk for channel in channels}) != len(channels):
        errors["channels"] = ["A channel appears twice."]
    for _, position, weight in entries:
        if not (isinstance(position, int) and 0 <= position <= 10_000 and isinstance(weight, int)
                and 0 <= weight <= 1000):
            errors["channels"] = ["Positions are 0-10000 and weights 0-1000."]
    if strategy == RouteStrategy.WEIGHTED and entries and not any(weight > 0 for _, _, weight in entries
                                                                  if isinstance(weight, int)):
        errors.setdefault("channels", []).append("A weighted route needs at least one channel with a weight above 0.")
    return errors


ROUTE_DEADLINE_LIMITS = (1, 3600)
SPILL_WAIT_LIMITS = (50, 600_000)  # milliseconds; 0 turns spilling off


@transaction.atomic
def route_save(*, team, user=None, route=None, model_name, strategy=RouteStrategy.LOCAL_FIRST,
               fallback_on_error=True, enabled=True, entries=(), deadline_seconds=None, balance=None,
               affinity_header=None, while_waking=None, spill_wait_ms=None):
    """Create (route=None) or replace a route with its channels. `entries` is [(channel, position, weight)].
    `balance` and `affinity_header` (None: left as they are) spread requests over the leading local channels;
    `while_waking` (None: left as it is) says what a request does while the route's local engine wakes;
    `spill_wait_ms` (None: left as it is; 0: off) sends a request to the remote channels first when the local
    engine would keep it waiting longer (gateway/spill.py)."""
    entries = list(entries)
    errors = route_check(team=team, route=route, model_name=model_name, strategy=strategy, entries=entries)
    if deadline_seconds is not None and not (
            isinstance(deadline_seconds, (int, float)) and not isinstance(deadline_seconds, bool)
            and ROUTE_DEADLINE_LIMITS[0] <= deadline_seconds <= ROUTE_DEADLINE_LIMITS[1]):
        errors["deadline_seconds"] = ["The deadline is a number of seconds from 1 to 3600."]
    if while_waking is not None and while_waking not in WhileWaking.values:
        errors["while_waking"] = [f"While waking is one of: {', '.join(repr(v) for v in WhileWaking.values)}."]
    if spill_wait_ms is not None and not (
            isinstance(spill_wait_ms, int) and not isinstance(spill_wait_ms, bool)
            and (spill_wait_ms == 0 or SPILL_WAIT_LIMITS[0] <= spill_wait_ms <= SPILL_WAIT_LIMITS[1])):
        errors["spill_wait_ms"] = [f"The spill wait is 0 (off) or a whole number of milliseconds from "
                                   f"{SPILL_WAIT_LIMITS[0]} to {SPILL_WAIT_LIMITS[1]:,}."]
    if balance is not None and balance not in RouteBalance.values:
        errors["balance"] = [f"Balancing is one of: {', '.join(repr(v) for v in RouteBalance.values)}."]
    if affinity_header:
        if not rules.HEADER_NAME_RE.match(affinity_header):
            errors["affinity_header"] = ["A header name: letters, digits, - and _, at most 100 characters."]
        elif affinity_header.lower() in rules.SECRET_HEADERS:
            errors["affinity_header"] = ["A credential header cannot keep sessions together (its value is a "
                                         "secret): use x-session-id or a header of your own."]
    if errors:
        raise ValidationError(errors)
    if route is None:
        route = Route(team=team, created_by=user)
    route.model_name, route.strategy = model_name, strategy
    route.fallback_on_error, route.enabled = bool(fallback_on_error), bool(enabled)
    if deadline_seconds is not None:
        route.deadline_seconds = float(deadline_seconds)
    if balance is not None:
        route.balance = balance
    if while_waking is not None:
        route.while_waking = while_waking
    if spill_wait_ms is not None:
        route.spill_wait_ms = spill_wait_ms
    if affinity_header is not None:
        route.affinity_header = affinity_header.strip()
    route.save()
    route.routechannel_set.all().delete()
    RouteChannel.objects.bulk_create([RouteChannel(route=route, channel=channel, position=position, weight=weight)
                                      for channel, position, weight in entries])
    routing_changed(team.pk)
    return route


@transaction.atomic
def route_delete(*, route):
    team_id = route.team_id
    route.delete()
    routing_changed(team_id)


# ------------------------------------------------------------------------------------------------- the Test button

def _call(client, method, url, *, loopback_ok=False, **kwargs):
    """(status, body bytes, latency ms, exception) for one request; the body is read up to MAX_TEST_BODY. The
    request goes to the address the outbound policy checked (no DNS rebinding between check and call)."""
    started = time.perf_counter()
    try:
        url, headers, extensions = outbound.pinned(url, loopback_ok=loopback_ok)
    except outbound.OutboundRefused as error:
        return None, b"", 0.0, httpx.ConnectError(f"the panel does not call this address: {error}")
    try:
        with client.stream(method, url, headers=headers, extensions=extensions, **kwargs) as response:
            body, _ = outbound.read_capped(response, MAX_TEST_BODY)  # decoded a step at a time: no gzip bomb
            return response.status_code, body, (time.perf_counter() - started) * 1000, None
    except httpx.HTTPError as error:
        return None, b"", (time.perf_counter() - started) * 1000, error


def _json(body):
    try:
        return safejson.loads(body)
    except ValueError:  # UnicodeDecodeError included
        return None


def channel_test(channel, *, timeout_cap=TEST_TIMEOUT_CAP):
    """The Test button: GET {base_url}/models, then a one-token chat completion to model_id. Returns (and stores
    on the channel as last_test) {"ok", "kind", "diagnosis", "notes", "models", "steps": [{"name", "url", "status",
    "latency_ms", "ok", "detail"}], "timeout_seconds", "tested_at"}. Retries are off: one request per step."""
    timeout = min(float(channel.timeout_seconds), timeout_cap)
    result = {"ok": False, "kind": "", "diagnosis": "", "notes": [], "models": None, "steps": [],
              "timeout_seconds": timeout, "base_url": channel.base_url, "model_id": channel.model_id,
              "tested_at": timezone.now().isoformat()}
    credential_problem = ""
    loopback_ok = is_engine_channel(channel)
    refusal = outbound.url_refusal(channel.base_url, loopback_ok=loopback_ok)
    if refusal:
        result["kind"] = "credential"
        result["diagnosis"] = f"No request was sent: the panel does not call this address: {refusal}."
        return _test_store(channel, result, f"the panel does not call its base URL: {refusal}")
    try:
        key = channel.api_key()
    except CredentialError as error:
        credential_problem = str(error)
        result["kind"] = "credential"
        result["diagnosis"] = f"No request was sent: {error}."
        return _test_store(channel, result, credential_problem)
    context = {"model_id": channel.model_id, "url": channel.base_url, "timeout": timeout, "key": key}
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
    transport = httpx.HTTPTransport(retries=0)
    with httpx.Client(timeout=httpx.Timeout(timeout), transport=transport, follow_redirects=False,
                      headers=headers) as client:
        models_url = channel.base_url + "/models"
        status, body, latency, error = _call(client, "GET", models_url, loopback_ok=loopback_ok)
        step = {"name": "GET /models", "url": models_url, "status": status, "latency_ms": round(latency, 1),
                "ok": status == 200, "detail": ""}
        result["steps"].append(step)
        models_failure = None
        if error is not None or status != 200:
            found = diagnosis.diagnose(status, error, body, step="models", **context)
            if status == 404:
                models_failure = found  # some servers have no /models: the chat decides
                step["detail"] = "no /models here"
            else:
                step["detail"] = diagnosis.SHORT[found.kind]
                result.update(kind=found.kind, diagnosis=found.message)
                return _test_store(channel, result, "")
        else:
            data = _json(body)
            if data is None:
                found = diagnosis.describe_not_json(status, body)
                step.update(ok=False, detail=diagnosis.SHORT[found.kind])
                result.update(kind=found.kind, diagnosis=found.message)
                return _test_store(channel, result, "")
            ids = [entry.get("id") for entry in data.get("data", []) if isinstance(entry, dict)
                   and isinstance(entry.get("id"), str)] if isinstance(data, dict) and isinstance(
                data.get("data"), list) else []
            result["models"] = ids[:200]
            step["detail"] = f"lists {len(ids)} model{'s' if len(ids) != 1 else ''}" + (
                ": " + ", ".join(ids[:10]) + ("…" if len(ids) > 10 else "") if ids else "")
            if ids and channel.model_id not in ids:
                result["notes"].append(f"{channel.model_id!r} is not among the models /models lists.")

        chat_url = channel.base_url + "/chat/completions"
        payload = {"model": channel.model_id, "messages": [{"role": "user", "content": "Reply with OK."}],
                   "max_tokens": 1, "stream": False}
        status, body, latency, error = _call(client, "POST", chat_url, json=payload, loopback_ok=loopback_ok)
        step = {"name": "chat completion (max_tokens 1)", "url": chat_url, "status": status,
                "latency_ms": round(latency, 1), "ok": False, "detail": ""}
        result["steps"].append(step)
        if error is not None or status != 200:
            if models_failure is not None and status == 404:
                found = models_failure  # both 404: the path is wrong, not the model
            else:
                found = diagnosis.diagnose(status, error, body, step="chat", served_ids=result["models"], **context)
            step["detail"] = diagnosis.SHORT[found.kind]
            result.update(kind=found.kind, diagnosis=found.message)
            return _test_store(channel, result, "")
        data = _json(body)
        if data is None:
            found = diagnosis.describe_not_json(status, body)
        elif not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            found = diagnosis.describe_no_choices()
        else:
            found = None
        if found is not None:
            step["detail"] = diagnosis.SHORT[found.kind]
            result.update(kind=found.kind, diagnosis=found.message)
            return _test_store(channel, result, "")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        step["ok"] = True
        step["detail"] = "answered" + (f" (usage: {usage.get('prompt_tokens')} prompt, "
                                       f"{usage.get('completion_tokens')} completion tokens)" if usage else "")
        if models_failure is not None:
            result["notes"].append("This server does not list models at /models, but the chat works.")
        result["ok"] = True
    return _test_store(channel, result, "")


def _test_store(channel, result, credential_problem):
    # Stored upstream words go through the one redaction (a provider may echo the key it refused).
    result["diagnosis"] = diagnosis.redact(result.get("diagnosis") or "")
    for step in result["steps"]:
        step["detail"] = diagnosis.redact(step.get("detail") or "")
    result["latency_ms"] = round(sum(step["latency_ms"] for step in result["steps"]), 1)
    now = timezone.now()
    Channel.objects.filter(pk=channel.pk).update(last_test=result, last_tested_at=now,
                                                 misconfigured=credential_problem)
    channel.last_test, channel.last_tested_at, channel.misconfigured = result, now, credential_problem
    return result
