"""Settings come from the environment; every default is the product's own.

With nothing set, the console runs on embedded parts: a SQLite file and a
filesystem Celery broker under ``var/``. ``DATABASE_URL`` and ``REDIS_URL``
move it onto PostgreSQL and Redis without a code change.
"""

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from tuneplane.client_address import parse_trusted_proxies

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TUNEPLANE_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {raw!r}")


def env_seconds(name: str, default: int, minimum: int = 1) -> int:
    """A duration setting: whole seconds, e.g. ``TUNEPLANE_QUIET_SERVE=45``; at least
    ``minimum`` (0 where none at all means something: preempt without a minimum runtime)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be whole seconds, not {raw!r}") from None
    if value < minimum:
        at_least = "a positive number of" if minimum == 1 else f"at least {minimum}"
        raise ImproperlyConfigured(f"{name} must be {at_least} seconds, not {value}")
    return value


def _secret_key() -> str:
    key = os.environ.get("TUNEPLANE_SECRET_KEY")
    if key:
        return key
    # Embedded default: one random key per checkout, kept beside the SQLite file.
    # The web, the gateway, the worker and beat start at once: the key is written whole to a
    # file of the writer's own, then linked into place; a second writer's link fails and it
    # reads the first's.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)  # the console's own (R23)
        mine = VAR_DIR / f".secret_key.{os.getpid()}"
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(mine, path)
        except FileExistsError:
            pass
        finally:
            mine.unlink()
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("TUNEPLANE_DEBUG", False)
ALLOWED_HOSTS = os.environ.get("TUNEPLANE_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "tuneplane",
    "audit",
    "fleets",
    "nodes",
    "placement",
]

MIDDLEWARE = [
    "tuneplane.middleware.CorrelationIdMiddleware",
    "tuneplane.middleware.ApiRequestMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it answers a locked-out login.
    "axes.middleware.AxesMiddleware",
]

# Logins (the admin's, the browsable API's) are counted by django-axes: after
# TUNEPLANE_LOGIN_FAILURE_LIMIT failures a username, and separately a client address, is
# locked out for TUNEPLANE_LOGIN_COOLOFF seconds (429), audited as login.locked_out.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# Behind TLS (TUNEPLANE_HTTPS=1): cookies only over HTTPS, HSTS, plain HTTP redirected, and
# the terminating proxy's X-Forwarded-Proto believed. `manage.py check --deploy` is clean.
TUNEPLANE_HTTPS = env_bool("TUNEPLANE_HTTPS", False)
if TUNEPLANE_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # a load balancer's probe may speak plain HTTP
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_seconds("TUNEPLANE_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

ROOT_URLCONF = "tuneplane.urls"
# Paths never need a trailing slash, and a POST is never redirected to one.
APPEND_SLASH = False

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
            ],
        },
    },
]

WSGI_APPLICATION = "tuneplane.wsgi.application"

DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{VAR_DIR / 'tuneplane.sqlite3'}",
        conn_max_age=int(os.environ.get("TUNEPLANE_DB_CONN_MAX_AGE", "0")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web, worker and beat share one file: wait for the lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # Take the write lock at BEGIN: a transaction that reads then writes (a sweep's guarded
    # SELECT then UPDATE) never interleaves with another, and never fails to upgrade its lock.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # Readers never block the writer (and the other way round): the web, the gateway, the
    # worker and beat read while one of them writes.
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL;"
    # A file, not memory, so a test can hand the database to a subprocess.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# Bodies over 1 MiB are refused before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Bearer first: its challenge makes an anonymous request a 401, not a 403.
        "tuneplane.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["tuneplane.api.parsers.DepthLimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "tuneplane.api.pagination.Pagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "tuneplane.api.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# django-grpc-framework: the composition root that adds every servicer to the server.
GRPC_FRAMEWORK = {"ROOT_HANDLERS_HOOK": "tuneplane.grpc_handlers.grpc_handlers"}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tuneplane console API",
    "DESCRIPTION": "Fleets of GPU machines, join tokens, nodes and admission.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Each choice set named for what it is, never by a hash (Kind480Enum): the names a
    # generated client's types take.
    "ENUM_NAME_OVERRIDES": {
        "FleetKindEnum": "fleets.choices.FleetKind",
        "FleetDeliveryEnum": "fleets.choices.FleetDelivery",
        "FleetCapabilityEnum": "fleets.choices.FleetCapability",
        "FleetVisibilityEnum": "fleets.choices.FleetVisibility",
        "FleetStateEnum": "fleets.choices.FleetState",
        "LifecycleKindEnum": "placement.choices.LifecycleKind",
        "DeploymentStateEnum": "placement.choices.DeploymentState",
        "DeploymentStatusEnum": "placement.choices.DeploymentStatus",
        "RefusalReasonEnum": "placement.choices.Refusal",
        "CommandKindEnum": "nodes.choices.CommandKind",
        "CommandStateEnum": "nodes.choices.CommandState",
        "JobStateEnum": "placement.choices.JobState",
        "RunStateEnum": "placement.choices.RunState",
        "CleanupEnum": "placement.choices.Cleanup",
        "WaitReasonEnum": "placement.waits.REASONS",
        "PlacementRefusedCodeEnum": ["placement_refused"],
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "tuneplane.api.schema.document_request_refusals",
    ],
}

# Celery: Redis when REDIS_URL is set, otherwise a broker that needs no server.
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
else:
    from tuneplane import broker  # its transport's alias, registered with kombu

    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_URL = f"{broker.ALIAS}://"
    # Broadcasts to the workers' remote control are the busiest writers of a folder broker,
    # and nothing of the console uses them (issue 49).
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    # Tasks' arguments are the console's own (R23): made 0700.
    for _folder in (VAR_DIR, _broker_dir, _broker_dir / "queue", _broker_dir / "control"):
        _folder.mkdir(mode=0o700, parents=True, exist_ok=True)
CELERY_TASK_IGNORE_RESULT = True

# Throttles (the join endpoint's) count in a cache every replica shares.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE

# The product's numbers. Durations are whole seconds; tests shorten them.
TUNEPLANE_PUBLIC_URL = os.environ.get("TUNEPLANE_PUBLIC_URL", "http://127.0.0.1:8000")
TUNEPLANE_GATEWAY_TARGET = os.environ.get("TUNEPLANE_GATEWAY_TARGET", "127.0.0.1:8443")
TUNEPLANE_PKI_DIR = Path(os.environ.get("TUNEPLANE_PKI_DIR", VAR_DIR / "pki"))
# The only files a cluster Fleet's *_token_file may name (nodes/backends/credentials.py).
TUNEPLANE_SECRETS_DIR = Path(os.environ.get("TUNEPLANE_SECRETS_DIR", VAR_DIR / "secrets"))
TUNEPLANE_DOWNLOADS_DIR = Path(os.environ.get("TUNEPLANE_DOWNLOADS_DIR", VAR_DIR / "downloads"))
TUNEPLANE_JOIN_TOKEN_TTL = env_seconds("TUNEPLANE_JOIN_TOKEN_TTL", 24 * 3600)
TUNEPLANE_NODE_CREDENTIAL_TTL = env_seconds("TUNEPLANE_NODE_CREDENTIAL_TTL", 24 * 3600)
TUNEPLANE_PLACEMENT_FRESHNESS = env_seconds("TUNEPLANE_PLACEMENT_FRESHNESS", 45)
TUNEPLANE_QUIET_TRAIN = env_seconds("TUNEPLANE_QUIET_TRAIN", 300)
TUNEPLANE_QUIET_SERVE = env_seconds("TUNEPLANE_QUIET_SERVE", 45)
TUNEPLANE_QUIET_ENV = env_seconds("TUNEPLANE_QUIET_ENV", 45)
TUNEPLANE_SWEEP_INTERVAL = env_seconds("TUNEPLANE_SWEEP_INTERVAL", 5)
# How often cluster Fleets (slurm, kubernetes) are read from their managers, and their
# submitted jobs' states read back. Keep it well inside TUNEPLANE_PLACEMENT_FRESHNESS.
TUNEPLANE_CLUSTER_REFRESH_INTERVAL = env_seconds("TUNEPLANE_CLUSTER_REFRESH_INTERVAL", 15)
# Running work on node Fleets (DESIGN §7). The allocator runs when something changes and on
# this interval as a safety net; a job waiting longer than RESERVE_AFTER reserves its nodes
# (R2). A stop is SIGTERM, then SIGKILL after the grace (R10).
TUNEPLANE_ALLOCATION_INTERVAL = env_seconds("TUNEPLANE_ALLOCATION_INTERVAL", 5)
TUNEPLANE_ALLOCATION_RESERVE_AFTER = env_seconds("TUNEPLANE_ALLOCATION_RESERVE_AFTER", 300)
# Q3: a project's use of a shared Fleet, in card-seconds, halves every this long.
TUNEPLANE_FAIR_SHARE_HALF_LIFE = env_seconds("TUNEPLANE_FAIR_SHARE_HALF_LIFE", 7 * 86400)
TUNEPLANE_STOP_GRACE = env_seconds("TUNEPLANE_STOP_GRACE", 30)
# Q5, Q6: a job is preempted only once it has run this long in its attempt, and its members
# get this long (or the less the job asks for) between SIGTERM and SIGKILL.
TUNEPLANE_PREEMPT_MIN_RUNTIME = env_seconds("TUNEPLANE_PREEMPT_MIN_RUNTIME", 600, minimum=0)
TUNEPLANE_PREEMPT_GRACE = env_seconds("TUNEPLANE_PREEMPT_GRACE", 120)
# A gang's members must all run within this of allocation (R3; torchrun's rendezvous join
# timeout is the same). A gone node's members are given up this long after gone (R8).
TUNEPLANE_GANG_DEADLINE = env_seconds("TUNEPLANE_GANG_DEADLINE", 600)
TUNEPLANE_RECONCILE_DEADLINE = env_seconds("TUNEPLANE_RECONCILE_DEADLINE", 600)
# H2: an attempt ended by the machine (infrastructure) never spends the job's max_attempts;
# it retries on a budget of its own (a node Fleet's config infra_retries, else this), after a
# backoff from FIRST doubling to MAX, away from the node or cards that failed it.
TUNEPLANE_INFRA_RETRIES = int(os.environ.get("TUNEPLANE_INFRA_RETRIES", "10"))
TUNEPLANE_INFRA_BACKOFF_FIRST = env_seconds("TUNEPLANE_INFRA_BACKOFF_FIRST", 30, minimum=0)
TUNEPLANE_INFRA_BACKOFF_MAX = env_seconds("TUNEPLANE_INFRA_BACKOFF_MAX", 1800, minimum=0)
# A new revision not wholly Ready within this is rolled back (S2).
TUNEPLANE_ROLLOUT_DEADLINE = env_seconds("TUNEPLANE_ROLLOUT_DEADLINE", 600)
# A playground session's lifetime is at most this (S4); an episode's timeout at most this (S5).
TUNEPLANE_PLAYGROUND_MAX_TTL = env_seconds("TUNEPLANE_PLAYGROUND_MAX_TTL", 86_400)
TUNEPLANE_EPISODE_MAX_TIMEOUT = env_seconds("TUNEPLANE_EPISODE_MAX_TIMEOUT", 86_400)
# The control stream: how often a node heartbeats, and how long a lease outlives silence.
TUNEPLANE_HEARTBEAT_INTERVAL = env_seconds("TUNEPLANE_HEARTBEAT_INTERVAL", 10)
TUNEPLANE_LEASE_TTL = env_seconds("TUNEPLANE_LEASE_TTL", 30)
# How long a new stream may take to send its Hello. In a storm of reconnects the gateway's loop
# reads Hellos late; a refused open costs the node another handshake at both ends.
TUNEPLANE_HELLO_TIMEOUT = env_seconds("TUNEPLANE_HELLO_TIMEOUT", 30)
# Heartbeats are written in one batch per replica per flush interval, never one per message.
TUNEPLANE_HEARTBEAT_FLUSH_INTERVAL = env_seconds("TUNEPLANE_HEARTBEAT_FLUSH_INTERVAL", 1)
# Database threads of one gateway replica (opening sessions, inventory, commands); heartbeats
# do not need them: they are written in one batch a second.
TUNEPLANE_GATEWAY_DB_THREADS = int(os.environ.get("TUNEPLANE_GATEWAY_DB_THREADS", "4"))
# glibc malloc arenas a gateway may use; 0 leaves glibc's own limit (eight a core). Two narrow
# the band its RSS settles in under 10,000 streams (README, "A gateway at fleet scale").
TUNEPLANE_GATEWAY_MALLOC_ARENAS = int(os.environ.get("TUNEPLANE_GATEWAY_MALLOC_ARENAS", "0"))
# How often a gateway replica looks for pending commands of its nodes. With Redis a command
# is delivered at once; this is what delivers it when an event was missed, or without Redis.
TUNEPLANE_COMMAND_POLL_INTERVAL = env_seconds("TUNEPLANE_COMMAND_POLL_INTERVAL", 2)
# Commands a node reports that the console never gave it, kept per node (the most recently
# reported); older ones are dropped and counted on the node (issue 17, item 11).
TUNEPLANE_STRAY_COMMANDS_KEPT = int(os.environ.get("TUNEPLANE_STRAY_COMMANDS_KEPT", "100"))
TUNEPLANE_GATEWAY_BIND = os.environ.get("TUNEPLANE_GATEWAY_BIND", "127.0.0.1:8443")
# Telemetry (cards and host) from each node, on a loop of its own; a gateway keeps each
# node's latest sample and writes them in one batch per flush interval. A card judged
# unhealthy is healthy again after this long with no fault.
TUNEPLANE_TELEMETRY_INTERVAL = env_seconds("TUNEPLANE_TELEMETRY_INTERVAL", 15)
TUNEPLANE_TELEMETRY_FLUSH_INTERVAL = env_seconds("TUNEPLANE_TELEMETRY_FLUSH_INTERVAL", 2)
TUNEPLANE_GPU_HEALTH_QUIET = env_seconds("TUNEPLANE_GPU_HEALTH_QUIET", 300)
# H7: a Fleet's automatic quarantine of failed cards stops (its health breaker trips, until an
# operator resets it) once one more would pass this share of its cards quarantined within the
# window; at least one card may always be.
TUNEPLANE_HEALTH_BREAKER_SHARE = float(os.environ.get("TUNEPLANE_HEALTH_BREAKER_SHARE", "0.2"))
if not 0 <= TUNEPLANE_HEALTH_BREAKER_SHARE <= 1:
    raise ImproperlyConfigured("TUNEPLANE_HEALTH_BREAKER_SHARE must be a number from 0 to 1")
TUNEPLANE_HEALTH_BREAKER_WINDOW = env_seconds("TUNEPLANE_HEALTH_BREAKER_WINDOW", 600)
# Prometheus (R23: configured scrapers only). The web's /metrics, a gateway's (on
# TUNEPLANE_GATEWAY_METRICS_BIND, grpcserve --metrics-bind) and a worker's (on
# TUNEPLANE_WORKER_METRICS_BIND; empty: none) answer a request bearing this token
# (`Authorization: Bearer <token>`), or one from an address in TUNEPLANE_METRICS_ALLOW (the
# web's as TUNEPLANE_TRUSTED_PROXIES tells it); with neither set, nobody: being on the
# console's machine, or on its loopback, is no credential. `make run` makes a token of its own
# in `$TUNEPLANE_VAR_DIR/metrics-token` when none is set.
TUNEPLANE_METRICS_TOKEN = os.environ.get("TUNEPLANE_METRICS_TOKEN", "")
TUNEPLANE_METRICS_ALLOW = parse_trusted_proxies(os.environ.get("TUNEPLANE_METRICS_ALLOW", ""))
TUNEPLANE_GATEWAY_METRICS_BIND = os.environ.get("TUNEPLANE_GATEWAY_METRICS_BIND", "")
TUNEPLANE_WORKER_METRICS_BIND = os.environ.get("TUNEPLANE_WORKER_METRICS_BIND", "")
# Joins per client address, in DRF's rate syntax.
TUNEPLANE_JOIN_RATE = os.environ.get("TUNEPLANE_JOIN_RATE", "30/minute")
# The most processes a member may have at once on its node (R12: a fork bomb stops there).
TUNEPLANE_MEMBER_PIDS = int(os.environ.get("TUNEPLANE_MEMBER_PIDS", "4096"))
# A member's log on its node is cut to its newest half past this many bytes (R16: 64 MiB).
TUNEPLANE_MEMBER_LOG_BYTES = int(os.environ.get("TUNEPLANE_MEMBER_LOG_BYTES", str(64 << 20)))
# A member whose scratch dir on its node grows past this is stopped, `scratch_full` (R16).
TUNEPLANE_MEMBER_SCRATCH_BYTES = int(
    os.environ.get("TUNEPLANE_MEMBER_SCRATCH_BYTES", str(100 << 30))
)
# Log tails each user may read a minute: each is fetched from a node over its stream (R15).
TUNEPLANE_LOGS_RATE = os.environ.get("TUNEPLANE_LOGS_RATE", "120/minute")
# The proxies whose X-Forwarded-For hop is believed (addresses or CIDRs, comma-separated);
# none by default: a client is its peer address, whatever headers it sends.
TUNEPLANE_TRUSTED_PROXIES = parse_trusted_proxies(os.environ.get("TUNEPLANE_TRUSTED_PROXIES", ""))
AXES_FAILURE_LIMIT = int(os.environ.get("TUNEPLANE_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(seconds=env_seconds("TUNEPLANE_LOGIN_COOLOFF", 900))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one locks
AXES_CLIENT_IP_CALLABLE = "tuneplane.client_address.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # no banner: a process's first line of output stays its own

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "tuneplane.logs.OneLineFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "tuneplane": {"level": os.environ.get("TUNEPLANE_LOG_LEVEL", "INFO")},
        # A line per request to a cluster manager, every refresh: failures are logged by
        # tuneplane.clusters instead.
        "httpx": {"level": "WARNING"},
    },
}
