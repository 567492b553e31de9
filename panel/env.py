"""Read settings from the environment; a bad value stops start-up with one clear line naming the variable."""
import os
import re
from typing import NamedTuple
from urllib.parse import unquote, urlparse, urlsplit


class EnvError(Exception):
    """A variable is missing or malformed. The message names the variable and what was expected."""


TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}

# Every variable the panel's settings read through these helpers (and the secrets read elsewhere): the panel's own
# configuration, which a channel may never send upstream as its key (panel/channels/credential_env.py).
PANEL_SECRETS = {"SECRET_KEY", "TOKENWISE_ENCRYPTION_KEYS", "DATABASE_URL", "REDIS_URL", "TOKENWISE_ADMIN_PASSWORD",
                 "TOKENWISE_METRICS_TOKEN"}
_names_read = set(PANEL_SECRETS)


def names_read():
    """The environment variables the panel reads for its own configuration."""
    return frozenset(_names_read)


def _read(name):
    _names_read.add(name)
    return os.environ.get(name)


def envstr(name, default=None):
    value = _read(name)
    if value is None:
        if default is None:
            raise EnvError(f"{name} is not set")
        return default
    return value


def envbool(name, default):
    value = _read(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def envint(name, default, *, minimum=None, maximum=None):
    value = _read(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a whole number") from None
    if minimum is not None and number < minimum or maximum is not None and number > maximum:
        raise EnvError(f"{name}={number} is out of range ({minimum} to {maximum})")
    return number


def envlist(name, default):
    value = _read(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def envpairs(name):
    """`name1=value1,name2=value2` (OpenTelemetry's OTEL_EXPORTER_OTLP_HEADERS form, values URL-encoded) as a dict;
    unset or empty: {}."""
    value = _read(name)
    pairs = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        key, equals, text = item.partition("=")
        if not equals or not key.strip():
            raise EnvError(f"{name}: {item.strip()!r} is not name=value (write name1=value1,name2=value2)")
        pairs[key.strip()] = unquote(text.strip())
    return pairs


class CredentialBinding(NamedTuple):
    """Where the operator lets a channel send one environment variable's key: origins written
    "scheme://host:port" (the port always there), and the slugs of the teams that may use it (empty: every team)."""

    origins: frozenset
    teams: frozenset


VARIABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
TEAM_SLUG_RE = re.compile(r"^[-A-Za-z0-9_]{1,100}$")
DEFAULT_PORTS = {"http": 80, "https": 443}


def url_origin(url):
    """"scheme://host:port" of a plain http(s) URL, the port always written; None for anything else: another
    scheme, no host, a bad port, a user or password, a backslash, spaces or control characters (a URL two parsers
    might read as two different hosts)."""
    if not isinstance(url, str) or re.search(r"[\\\s\x00-\x1f\x7f]", url):
        return None
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not host or "@" in parts.netloc or port == 0:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def envbindings(name, default):
    """Environment variables bound to the origins they may be sent to, and optionally to teams:
    `VARIABLE=ORIGIN[,ORIGIN...][@TEAM|TEAM...]` entries separated by ";", an origin being scheme://host[:port]
    and a team its slug. Returns {VARIABLE: CredentialBinding}."""
    value = _read(name)
    bindings = {}
    for entry in (default if value is None else value).split(";"):
        entry = entry.strip()
        if not entry:
            continue
        variable, equals, rest = (part.strip() for part in entry.partition("="))
        if not equals or not VARIABLE_RE.match(variable) or not rest:
            raise EnvError(f"{name}: {entry!r} is not VARIABLE=https://host[:port][@team|team] (entries are "
                           "separated by ';')")
        if variable in bindings:
            raise EnvError(f"{name}: {variable} is bound twice: give all its origins in one entry, separated by ','")
        if variable.startswith(("DJANGO_", "CELERY_")):  # settings.py checks the names it reads, once all are read
            raise EnvError(f"{name}: {variable} is part of the panel's own configuration and is never sent upstream")
        origins_text, at, teams_text = rest.partition("@")
        origins = set()
        for item in origins_text.split(","):
            item = item.strip()
            origin = url_origin(item)
            if origin is None or urlsplit(item).path not in ("", "/") or urlsplit(item).query or "#" in item:
                raise EnvError(f"{name}: {variable}'s {item!r} is not an origin (scheme://host[:port], without a "
                               "path, for example https://api.openai.com)")
            origins.add(origin)
        teams = {team.strip() for team in teams_text.split("|")} if at else set()
        for team in teams:
            if not TEAM_SLUG_RE.match(team):
                raise EnvError(f"{name}: {variable}'s team {team!r} is not a team's slug (letters, digits, '-', '_'; "
                               "teams are separated by '|')")
        bindings[variable] = CredentialBinding(origins=frozenset(origins), teams=frozenset(teams))
    return bindings


POSTGRES_LOCK_TIMEOUT_MS = 20_000  # as long as SQLite's busy timeout (sqlite_database)
POSTGRES_IDLE_IN_TRANSACTION_MS = 600_000


def database_from_url(name, url, *, data_dir):
    """Turn DATABASE_URL into a Django DATABASES entry: sqlite:///path or postgres://user:pass@host:port/db."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
        if url.startswith("sqlite:////"):
            path = "/" + path.lstrip("/")
        elif path.startswith("/"):
            path = path[1:]
        if not path:
            raise EnvError(f"{name}={url!r} names no file (use sqlite:///relative.db or sqlite:////abs/path.db)")
        if not os.path.isabs(path):
            path = os.path.join(data_dir, path)
        return sqlite_database(path)
    if parsed.scheme in ("postgres", "postgresql"):
        database = parsed.path.lstrip("/")
        if not database:
            raise EnvError(f"{name}={redact_url(url)!r} names no database")
        try:
            port = parsed.port
        except ValueError:
            raise EnvError(f"{name}={redact_url(url)!r} has a bad port") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(database),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # Every wait has a deadline, as SQLite's busy timeout gives it: reaching the server, a row or table
            # lock another transaction holds (lock_timeout: the waiter fails, the holder goes on), and a
            # transaction its process left open (it would hold its locks for ever).
            "OPTIONS": {"connect_timeout": 10,
                        "options": f"-c lock_timeout={POSTGRES_LOCK_TIMEOUT_MS} "
                                   f"-c idle_in_transaction_session_timeout={POSTGRES_IDLE_IN_TRANSACTION_MS}"},
        }
    raise EnvError(f"{name}={redact_url(url)!r}: unsupported scheme (use sqlite:/// or postgres://)")


def sqlite_database(path):
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        # WAL lets the web server and the workers read while one of them writes; IMMEDIATE takes the write
        # lock at BEGIN so concurrent writers wait (busy timeout) instead of failing with "database is locked".
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        "TEST": {"NAME": path + ".test"},
    }


def redact_url(url):
    """The URL without its password, for messages."""
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
