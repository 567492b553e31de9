"""settings.json in, in both shapes people write it in (panel/channels/settings_export.py writes them).

Format A: provider, base_url, api_key_env, default_model, timeout_seconds, max_retries,
retry_backoff, endpoints {local_vllm, cloud_fallback}, routing {strategy, fallback_on_error}. It becomes a local
channel `local_vllm` (no key), a remote channel named after `provider` (its key read from `api_key_env`), both with
the file's timeout and retries and serving `default_model`, and a route for `default_model` with both.

Format B: channels {name: {base_url, api_key, model_id}} and default_channel. `api_key` is
"EMPTY" (no key), "${ENV_NAME}" (read from the environment) or a literal key (stored encrypted, with a warning:
keys do not belong in files). A channel whose key is EMPTY or whose host is loopback is local. The route is named
after the default channel's model_id, with the default channel first (strategy priority).

A format B channel may carry `pool` {scrape_urls, gpu_count, price_per_gpu_hour, batch_slots}: it is then a vLLM
pool (an engine fleet outside Tokenwise, called like a remote channel, its /metrics scraped). The articles' formats
have no place for these; Tokenwise's own export writes them so a pool survives the round trip. A pool's scrape token
is never in the file: it is typed on the channel's page (and one already stored is kept on replace).

Import validates the whole file before touching the database and writes everything in one transaction: any error
and nothing is saved. Every error names its JSON path. `_note` (what the export says about secrets) is accepted."""
import json
import math
import re
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction

from panel.channels import pools
from panel.channels.models import EMPTY_KEY, Channel, ChannelKind, CredentialKind, Route, RouteStrategy
from panel.channels.services import (
    LIMITS,
    NAME_RE,
    api_key_errors,
    base_url_check,
    channel_create,
    channel_update,
    env_name_errors,
    is_loopback,
    model_id_errors,
    name_errors,
    route_save,
)
from panel.core import safejson

MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
MAX_CHANNELS = 50
MAX_DIGITS = 15
KEYS_A = ("provider", "base_url", "api_key_env", "default_model", "timeout_seconds", "max_retries", "retry_backoff",
          "endpoints", "routing", "_note")
KEYS_B = ("channels", "default_channel", "_note")
ENDPOINT_KEYS = ("local_vllm", "cloud_fallback")
ROUTING_KEYS = ("strategy", "fallback_on_error")
CHANNEL_KEYS = ("base_url", "api_key", "model_id", "pool")
POOL_KEYS = pools.POOL_ONLY  # a pool's own fields, named as on the channel
ENV_REF_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]{0,99})\}$")
DEFAULTS = {"timeout_seconds": 120.0, "max_retries": 3, "retry_backoff": 1.5}
LOCAL_NAME_A = "local_vllm"


@dataclass
class ChannelPlan:
    path: str
    name: str
    kind: str
    base_url: str
    model_id: str
    credential_kind: str = CredentialKind.NONE
    credential_env: str = ""
    api_key: str = ""
    timeout_seconds: float = DEFAULTS["timeout_seconds"]
    max_retries: int = DEFAULTS["max_retries"]
    retry_backoff: float = DEFAULTS["retry_backoff"]
    credential_path: str = ""
    pool: dict = field(default_factory=dict)  # a vLLM pool's own fields (POOL_KEYS), {} for another channel


@dataclass
class Plan:
    format: str
    channels: list
    route_model: str
    route_strategy: str
    route_fallback: bool
    warnings: list = field(default_factory=list)


@dataclass
class ImportResult:
    format: str
    channels: list
    route: Route
    warnings: list


class _Refused(ValueError):
    pass


# ------------------------------------------------------------------------------------------------- reading

def _path(base, key):
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", key) and "." not in key:
        return f"{base}.{key}"
    return f"{base}[{_short(key)}]"


def _short(value, limit=60):
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _type_name(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _depth_ok(text):
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif char in "]}":
            depth -= 1
    return True


def _pairs(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"the key {_short(key)} appears twice in one object")
        seen[key] = value
    return seen


def _int(text):
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"the number {text[:20]}… has more than {MAX_DIGITS} digits")
    return int(text)


def _float(text):
    if len(text) > 40:
        raise _Refused(f"the number {text[:20]}… is too long")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:20]} is too large")
    return value


def _constant(name):
    raise _Refused(f"{name} is not a number JSON allows")


def load(text):
    """The parsed document, or ValidationError with one clear reason (size, nesting, syntax, numbers)."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_BYTES:
            raise ValidationError(f"settings.json is larger than {MAX_BYTES // 1024} KB: that is not a settings file.")
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError("settings.json is not UTF-8 text.") from None
    if not isinstance(text, str):
        raise ValidationError("settings.json must be text.")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ValidationError(f"settings.json is larger than {MAX_BYTES // 1024} KB: that is not a settings file.")
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise ValidationError("settings.json is empty: paste the file or upload it.")
    if not _depth_ok(text):
        raise ValidationError(f"settings.json is nested more than {MAX_DEPTH} levels deep: that is not a settings "
                              "file.")
    try:
        return safejson.loads(text, object_pairs_hook=_pairs, parse_int=_int, parse_float=_float,
                          parse_constant=_constant)
    except _Refused as error:
        raise ValidationError(f"settings.json is refused: {error}.") from None
    except json.JSONDecodeError as error:
        raise ValidationError(f"settings.json is not valid JSON: {error.msg} at line {error.lineno}, column "
                              f"{error.colno}.") from None
    except ValueError as error:  # NestedTooDeep included
        raise ValidationError(f"settings.json is not valid JSON: {str(error)[:200]}.") from None


class _Checker:
    def __init__(self):
        self.errors, self.warnings = [], []

    def error(self, path, message):
        self.errors.append(f"{path}: {message}")

    def unknown_keys(self, path, data, known, what):
        for key in data:
            if key not in known:
                self.error(_path(path, key), f"unknown key (not a field of {what}; it knows "
                                             f"{', '.join(k for k in known if not k.startswith('_'))})")

    def string(self, path, value, *, required=True):
        if value is None and not required:
            return None
        if not isinstance(value, str):
            self.error(path, f"must be a string, not {_type_name(value)}" if value is not None else "is missing")
            return None
        return value

    def number(self, path, value, name, *, whole=False):
        minimum, maximum, unit = LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(path, f"must be a number, not {_type_name(value)}")
            return None
        if whole and isinstance(value, float):
            if not value.is_integer():
                self.error(path, "must be a whole number")
                return None
            value = int(value)
        if not minimum <= value <= maximum:
            self.error(path, f"must be from {minimum:g} to {maximum:g}{' ' + unit if unit else ''} (got {value:g})")
            return None
        return value

    def url(self, path, value, *, warn=True):
        value = self.string(path, value)
        if value is None:
            return None
        cleaned, errors, warnings = base_url_check(value)
        for message in errors:
            self.error(path, message)
        if warn:
            self.warnings += [f"{path}: {message}" for message in warnings]
        return None if errors else cleaned

    def model(self, path, value):
        value = self.string(path, value)
        if value is None:
            return None
        for message in model_id_errors(value):
            self.error(path, message)
        return value


def parse(text):
    """Read and validate a settings.json of either format without touching the database: a Plan, or
    ValidationError listing every problem with its JSON path."""
    data = load(text)
    if not isinstance(data, dict):
        raise ValidationError(f"$: settings.json must be a JSON object, not {_type_name(data)}.")
    if "channels" in data:
        plan, checker = _parse_b(data)
    elif any(key in data for key in ("endpoints", "default_model", "provider", "api_key_env")):
        plan, checker = _parse_a(data)
    else:
        raise ValidationError("$: not a settings.json: expected \"endpoints\" and \"default_model\" (format A) or "
                              "\"channels\" and \"default_channel\" (format B).")
    if "_note" in data and not isinstance(data["_note"], str):
        checker.error("$._note", "must be a string")
    if checker.errors:
        raise ValidationError(checker.errors)
    plan.warnings = checker.warnings
    return plan


def _parse_a(data):
    c = _Checker()
    c.unknown_keys("$", data, KEYS_A, "format A")
    provider = c.string("$.provider", data.get("provider"), required=False)
    if provider is not None:
        for message in name_errors(provider):
            c.error("$.provider", message + " (it names the cloud channel)")
        if provider == LOCAL_NAME_A:
            c.error("$.provider", f"{LOCAL_NAME_A!r} names the local channel already")
    if "base_url" in data:
        cleaned = c.string("$.base_url", data["base_url"])
        if cleaned is not None:
            _, errors, _ = base_url_check(cleaned)
            for message in errors:
                c.error("$.base_url", message)
    env_name = c.string("$.api_key_env", data.get("api_key_env"), required=False)
    if env_name:
        if ENV_REF_RE.match(env_name):
            c.error("$.api_key_env", f"write the variable's name without ${{}}: {ENV_REF_RE.match(env_name).group(1)}")
        else:
            for message in env_name_errors(env_name):
                c.error("$.api_key_env", message)
    model = c.model("$.default_model", data.get("default_model")) if "default_model" in data else None
    if "default_model" not in data:
        c.error("$.default_model", "is missing: the model name clients send, for example qwen2.5-14b-instruct")
    numbers = {}
    for name in DEFAULTS:
        numbers[name] = (c.number(f"$.{name}", data[name], name, whole=name == "max_retries") if name in data
                         else DEFAULTS[name])
    endpoints = data.get("endpoints")
    urls = {}
    if endpoints is None:
        c.error("$.endpoints", "is missing: {\"local_vllm\": \"http://127.0.0.1:8000/v1\", \"cloud_fallback\": "
                               "\"https://taotoken.net/api/v1\"}")
    elif not isinstance(endpoints, dict):
        c.error("$.endpoints", f"must be an object, not {_type_name(endpoints)}")
    else:
        c.unknown_keys("$.endpoints", endpoints, ENDPOINT_KEYS, "endpoints")
        if not any(key in endpoints for key in ENDPOINT_KEYS):
            c.error("$.endpoints", "names no endpoint: give local_vllm, cloud_fallback or both")
        for key in ENDPOINT_KEYS:
            if key in endpoints:
                urls[key] = c.url(f"$.endpoints.{key}", endpoints[key])
    strategy, fallback = RouteStrategy.LOCAL_FIRST, True
    routing = data.get("routing")
    if routing is not None:
        if not isinstance(routing, dict):
            c.error("$.routing", f"must be an object, not {_type_name(routing)}")
        else:
            c.unknown_keys("$.routing", routing, ROUTING_KEYS, "routing")
            if "strategy" in routing:
                strategy = routing["strategy"]
                if strategy not in RouteStrategy.values:
                    c.error("$.routing.strategy", f"must be one of {', '.join(RouteStrategy.values)}")
            if "fallback_on_error" in routing:
                fallback = routing["fallback_on_error"]
                if not isinstance(fallback, bool):
                    c.error("$.routing.fallback_on_error", f"must be true or false, not {_type_name(fallback)}")
    if "cloud_fallback" in urls and not env_name:
        c.warnings.append("$.api_key_env: missing or empty, so the cloud channel sends no key: a provider answers 401 "
                          "without one.")
    if c.errors:
        return None, c
    common = dict(model_id=model, **numbers)
    channels = []
    if "local_vllm" in urls:
        channels.append(ChannelPlan(path="$.endpoints.local_vllm", name=LOCAL_NAME_A, kind=ChannelKind.LOCAL,
                                    base_url=urls["local_vllm"], credential_path="$.endpoints.local_vllm",
                                    **common))
    if "cloud_fallback" in urls:
        channels.append(ChannelPlan(path="$.endpoints.cloud_fallback", name=provider or "cloud",
                                    kind=ChannelKind.REMOTE, base_url=urls["cloud_fallback"],
                                    credential_kind=CredentialKind.ENV if env_name else CredentialKind.NONE,
                                    credential_env=env_name or "", credential_path="$.api_key_env", **common))
    return Plan("A", channels, model, strategy, fallback), c


def _parse_b(data):
    c = _Checker()
    c.unknown_keys("$", data, KEYS_B, "format B")
    channels_data = data["channels"]
    plans = []
    if not isinstance(channels_data, dict):
        c.error("$.channels", f"must be an object of name: {{base_url, api_key, model_id}}, not "
                              f"{_type_name(channels_data)}")
        channels_data = {}
    elif not channels_data:
        c.error("$.channels", "is empty: add at least one channel")
    elif len(channels_data) > MAX_CHANNELS:
        c.error("$.channels", f"holds {len(channels_data)} channels; {MAX_CHANNELS} at most")
        channels_data = {}
    for name, spec in channels_data.items():
        path = _path("$.channels", name)
        if not NAME_RE.match(name):
            c.error(path, name_errors(name)[0])
            continue
        if not isinstance(spec, dict):
            c.error(path, f"must be an object {{base_url, api_key, model_id}}, not {_type_name(spec)}")
            continue
        c.unknown_keys(path, spec, CHANNEL_KEYS, "a channel")
        if "base_url" not in spec:
            c.error(f"{path}.base_url", "is missing")
        if "model_id" not in spec:
            c.error(f"{path}.model_id", "is missing")
        url = c.url(f"{path}.base_url", spec["base_url"]) if "base_url" in spec else None
        model = c.model(f"{path}.model_id", spec["model_id"]) if "model_id" in spec else None
        key = c.string(f"{path}.api_key", spec.get("api_key", EMPTY_KEY))
        credential = _credential(c, f"{path}.api_key", key)
        pool = _pool(c, f"{path}.pool", spec["pool"]) if "pool" in spec else {}
        if url is None or model is None or credential is None or pool is None:
            continue
        kind = ChannelKind.POOL if pool else ChannelKind.LOCAL if (
            credential[0] == CredentialKind.NONE or is_loopback(url)) else ChannelKind.REMOTE
        plans.append(ChannelPlan(path=path, name=name, kind=kind, base_url=url, model_id=model,
                                 credential_kind=credential[0], credential_env=credential[1],
                                 api_key=credential[2], credential_path=f"{path}.api_key", pool=pool))
    default = data.get("default_channel")
    if "default_channel" not in data:
        c.error("$.default_channel", "is missing: the name of the channel tried first")
    elif not isinstance(default, str):
        c.error("$.default_channel", f"must be a string, not {_type_name(default)}")
    elif isinstance(channels_data, dict) and channels_data and default not in channels_data:
        c.error("$.default_channel", f"{_short(default)} is not one of the channels "
                                     f"({', '.join(_short(name) for name in list(channels_data)[:10])})")
    if c.errors:
        return None, c
    plans.sort(key=lambda plan: plan.name != default)  # stable: the default first, then file order
    return Plan("B", plans, plans[0].model_id, RouteStrategy.PRIORITY, True), c


def _pool(c, path, data):
    """A format B channel's `pool` as channel fields, or None after recording the errors. The values' ranges and the
    URLs are checked where every channel is saved (channels/pools.py), and their errors name these paths."""
    if not isinstance(data, dict):
        c.error(path, f"must be an object {{scrape_urls, gpu_count, price_per_gpu_hour, batch_slots}}, not "
                      f"{_type_name(data)}")
        return None
    errors = len(c.errors)
    c.unknown_keys(path, data, POOL_KEYS, "a pool")
    urls = data.get("scrape_urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(url, str) for url in urls):
        c.error(f"{path}.scrape_urls", "must be a list of the /metrics URLs of the pool's engines, for example "
                                       '["http://10.0.0.5:8000/metrics"]')
    gpus = data.get("gpu_count", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        c.error(f"{path}.gpu_count", f"must be a whole number, not {_type_name(gpus)}")
    price = data.get("price_per_gpu_hour")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))):
        c.error(f"{path}.price_per_gpu_hour", f"must be a number or null, not {_type_name(price)}")
    slots = data.get("batch_slots")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)):
        c.error(f"{path}.batch_slots", f"must be a whole number or null, not {_type_name(slots)}")
    if len(c.errors) > errors:
        return None
    return {"scrape_urls": "\n".join(urls), "gpu_count": gpus,
            "price_per_gpu_hour": None if price is None else str(price), "batch_slots": slots}


def _credential(c, path, key):
    """(credential_kind, env name, literal key) for a format B api_key, or None after recording the error."""
    if key is None:
        return None
    if key == EMPTY_KEY:
        return CredentialKind.NONE, "", ""
    match = ENV_REF_RE.match(key)
    if match:
        return CredentialKind.ENV, match.group(1), ""
    if key.startswith("$"):
        c.error(path, "an environment variable is written ${NAME}, for example ${TAOTOKEN_API_KEY}")
        return None
    if not key:
        c.error(path, "is empty: write \"EMPTY\" for no key, or ${ENV_NAME}")
        return None
    errors = api_key_errors(key)
    if errors:
        c.error(path, errors[0])
        return None
    c.warnings.append(f"{path}: a literal key. It is stored encrypted, but keys do not belong in files: remove it "
                      "from settings.json and write ${ENV_NAME} instead.")
    return CredentialKind.STORED, "", key.strip()


# ------------------------------------------------------------------------------------------------- import

FIELD_TO_JSON = {"base_url": "base_url", "model_id": "model_id", "name": None, "timeout_seconds": "timeout_seconds",
                 "max_retries": "max_retries", "retry_backoff": "retry_backoff"}


def settings_import(*, team, user=None, text, replace=False):
    """Create the channels and route a settings.json describes. With `replace`, channels and a route of the same
    names are overwritten; without it they are an error. All or nothing: ValidationError lists every problem."""
    plan = parse(text)
    errors = []
    try:
        with transaction.atomic():
            channels = []
            for spec in plan.channels:
                channel = _import_channel(team, user, spec, replace, errors)
                if channel is not None:
                    channels.append(channel)
            existing = Route.objects.filter(team=team, model_name=plan.route_model).first()
            if existing is not None and not replace:
                errors.append(f"{'$.default_model' if plan.format == 'A' else '$.default_channel'}: this team "
                              f"already has a route for {plan.route_model!r} (tick \"replace\" to overwrite it)")
            if errors:
                raise ValidationError(errors)
            route = route_save(team=team, user=user, route=existing, model_name=plan.route_model,
                               strategy=plan.route_strategy, fallback_on_error=plan.route_fallback,
                               entries=[(channel, position, 1) for position, channel in enumerate(channels)])
    except ValidationError as error:
        raise ValidationError(errors or error.messages) from None
    return ImportResult(plan.format, channels, route, _warnings(plan, channels))


def _warnings(plan, channels):
    """The file's own warnings, then what the channel form would have said of each channel saved (an environment
    variable not set where the panel runs, a remote channel without a key...), each once, with its JSON path."""
    warnings = list(plan.warnings)
    for spec, channel in zip(plan.channels, channels):
        for message in channel.warnings:
            if not any(warning.endswith(message) for warning in warnings):
                warnings.append(f"{spec.path}: {message}")
    return warnings


# The file has one `timeout_seconds`; the gateway has four budgets per attempt. The file's value becomes the total
# of one attempt, and the others keep their defaults (connect 5 s, first byte 10 s, idle 15 s), cut to the total
# when it is shorter, so that a hanging channel falls back within seconds whatever the file says.
BUDGET_DEFAULTS = {"connect_timeout_seconds": 5.0, "first_byte_timeout_seconds": 10.0, "idle_timeout_seconds": 15.0}


def time_budgets(timeout_seconds):
    """The channel's four time budgets for a settings file's `timeout_seconds`."""
    return {"timeout_seconds": timeout_seconds,
            **{name: min(value, timeout_seconds) for name, value in BUDGET_DEFAULTS.items()}}


def _import_channel(team, user, spec, replace, errors):
    fields = {"kind": spec.kind, "base_url": spec.base_url, "model_id": spec.model_id,
              "credential_kind": spec.credential_kind, "credential_env": spec.credential_env,
              **time_budgets(spec.timeout_seconds), "max_retries": spec.max_retries,
              "retry_backoff": spec.retry_backoff, "enabled": True, **spec.pool}
    existing = Channel.objects.filter(team=team, name=spec.name).first()
    if existing is not None and not replace:
        errors.append(f"{spec.path}: this team already has a channel named {spec.name!r} (tick \"replace\" to "
                      "overwrite it)")
        return None
    try:
        if existing is not None:
            return channel_update(channel=existing, api_key=spec.api_key, deployment=None, **fields)
        return channel_create(team=team, user=user, name=spec.name, api_key=spec.api_key, **fields)
    except ValidationError as error:
        for name, messages in error.message_dict.items():
            where = spec.credential_path if name in ("api_key", "credential_env", "credential_kind") else (
                f"{spec.path}.pool.{name}" if name in POOL_KEYS or name == "scrape_token" else
                f"{spec.path}.{name}" if spec.path.startswith("$.channels") else spec.path)
            errors += [f"{where}: {message}" for message in messages]
        return None
