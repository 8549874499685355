"""Django settings for recoverydash, read from the environment.

Nothing set: an embedded install that needs no servers (SQLite and Celery's filesystem broker,
both under ``var/``). Production sets ``DATABASE_URL``, ``CELERY_BROKER_URL``, ``SECRET_KEY`` and
``ALLOWED_HOSTS``. A value that cannot be understood stops the process at start with a message
naming the variable, rather than running with a guess.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RECOVERYDASH_VAR_DIR", BASE_DIR / "var"))


def envbool(name: str, default: bool) -> bool:
    """Read a boolean: exactly ``true``/``false`` (also 1/0, yes/no); anything else raises."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def envint(name: str, default: int, minimum: int = 0) -> int:
    """Read an integer >= ``minimum``; anything else raises ImproperlyConfigured."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def envfloat(name: str, default: float, minimum: float = 0.0) -> float:
    """Read a number >= ``minimum``; anything else raises ImproperlyConfigured."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if not value >= minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list; blanks are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = envbool("DEBUG", False)
_secret = os.environ.get("SECRET_KEY", "")
if not _secret:
    # Embedded default only: a key private to this install, kept under var/ so sessions survive
    # restarts. Production sets SECRET_KEY.
    _key_file = VAR_DIR / "secret_key"
    try:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        if not _key_file.exists():
            import secrets

            _key_file.write_text(secrets.token_urlsafe(50))
            _key_file.chmod(0o600)
        _secret = _key_file.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"SECRET_KEY is not set and {_key_file} is not writable: {exc}") from exc
# Placeholders of .env.example and the docs: a production process refuses to start with them.
EXAMPLE_PREFIX = "change-me"
if not DEBUG and _secret.lower().startswith(EXAMPLE_PREFIX):
    raise ImproperlyConfigured(
        "SECRET_KEY is the example value of .env.example: set a long random one, e.g. the output "
        "of python -c 'import secrets; print(secrets.token_urlsafe(50))' (DEBUG=true allows it)")
SECRET_KEY = _secret
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (docs/operator-guide.md "Configuration"; .env.example has the production values) ---
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
# Load balancers and compose health checks speak plain HTTP to the process.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)


def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """``X-Forwarded-Proto: https`` (or Django's ``HTTP_X_FORWARDED_PROTO,https``) -> the
    SECURE_PROXY_SSL_HEADER tuple; empty -> None. Set it only behind a proxy that overwrites
    that header: a client could otherwise claim HTTPS."""
    if not raw.strip():
        return None
    name, sep, value = raw.partition(":") if ":" in raw else raw.partition(",")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER must be 'Header-Name: value', e.g. "
                                   f"'X-Forwarded-Proto: https', got {raw!r}")
    if not name.upper().startswith("HTTP_"):
        name = "HTTP_" + name.upper().replace("-", "_")
    return name, value


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))
# The public address of the dashboard, used in alert links.
SITE_URL = os.environ.get("SITE_URL", "http://localhost:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "ninja",
    "recoverydash.runs",
    "recoverydash.ingest",
    "recoverydash.storage",
    "recoverydash.alerts",
    "recoverydash.dashboard",
    "axes",  # login throttle (django-axes)
    "workers",  # creates the Celery app at startup (workers/apps.py); nothing imports workers
]

MIDDLEWARE = [
    # first: counts every answer to POST /api/v1/events, whoever made it (recoverydash.metrics)
    "recoverydash.metrics.counters.IngestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # a URL holding NUL (or a lone surrogate) is a 400 before any lookup (recoverydash.ingest)
    "recoverydash.ingest.middleware.UnstorableTextMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # last: answers a locked-out sign-in (django-axes)
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "recoverydash.urls"
WSGI_APPLICATION = "recoverydash.wsgi.application"

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

import dj_database_url  # noqa: E402

_database_url = os.environ.get("DATABASE_URL", "")
if _database_url:
    try:
        _db = dj_database_url.parse(_database_url, conn_max_age=60, conn_health_checks=True)
    except Exception as exc:  # dj_database_url raises several types for bad URLs
        raise ImproperlyConfigured(f"DATABASE_URL cannot be parsed: {exc}") from None
    if not _db.get("ENGINE"):
        raise ImproperlyConfigured(f"DATABASE_URL has an unknown scheme: {_database_url!r}")
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR_DIR / "recoverydash.sqlite3"),
        # WAL and a busy timeout let web, worker and beat share one file.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
# A locked database answers within this many seconds (503 database_unavailable), not after 30:
# SQLite's busy timeout, PostgreSQL's lock_timeout and connect_timeout.
RECOVERYDASH_DB_LOCK_TIMEOUT_S = envfloat("RECOVERYDASH_DB_LOCK_TIMEOUT_S", 5.0, 0.1)
_options = _db.setdefault("OPTIONS", {})
if "sqlite3" in _db.get("ENGINE", ""):
    _options.setdefault("timeout", RECOVERYDASH_DB_LOCK_TIMEOUT_S)
elif "postgresql" in _db.get("ENGINE", ""):
    _options.setdefault("connect_timeout", max(1, round(RECOVERYDASH_DB_LOCK_TIMEOUT_S)))
    _options["options"] = (_options.get("options", "") + " -c lock_timeout="
                           f"{int(RECOVERYDASH_DB_LOCK_TIMEOUT_S * 1000)}").strip()
    if not DEBUG:
        _host = (_db.get("HOST") or "").strip("[]")
        _local = not _host or _host.startswith("/") or _host in ("localhost", "127.0.0.1", "::1")
        _password = _db.get("PASSWORD") or ""
        if _password.lower().startswith(EXAMPLE_PREFIX):
            raise ImproperlyConfigured(
                "DATABASE_URL carries the example password of .env.example (POSTGRES_PASSWORD): "
                "set a real one (DEBUG=true allows it)")
        if not _password and not _local:
            raise ImproperlyConfigured(
                f"DATABASE_URL has no password for the database server {_host!r}: set one "
                "(POSTGRES_PASSWORD in .env for docker compose); only a server on this machine "
                "(localhost or a Unix socket, trust or peer authentication) may go without "
                "(DEBUG=true allows it)")
if "postgresql" in _db.get("ENGINE", ""):
    # Each test process gets its own test database, so two test runs on one machine (a
    # developer's and CI's, or parallel sessions) never drop each other's database.
    _db.setdefault("TEST", {})["NAME"] = os.environ.get(
        "RECOVERYDASH_TEST_DB_NAME", f"test_{_db.get('NAME') or 'recoverydash'}_{os.getpid()}")
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Sign-in throttle (django-axes): after RECOVERYDASH_LOGIN_FAILURE_LIMIT wrong passwords for one
# username from one address, that pair is locked out for RECOVERYDASH_LOGIN_LOCKOUT_S seconds
# (429, dashboard and admin alike); a success resets the count. Unlock early with
# `manage.py axes_reset_username USERNAME`.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("RECOVERYDASH_LOGIN_FAILURE_LIMIT", 5, 1)
AXES_COOLOFF_TIME = timedelta(seconds=envint("RECOVERYDASH_LOGIN_LOCKOUT_S", 900, 1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked.html"
AXES_HTTP_RESPONSE_CODE = 429
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
try:  # WhiteNoise expects the folder; `collectstatic` fills it for production
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    pass
STATICFILES_DIRS = [BASE_DIR / "static"]
# plotly.js is served from the installed plotly package (static/vendor/plotly/plotly.min.js): the
# dashboard never loads anything from a CDN.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "recoverydash.dashboard.staticfiles.PlotlyFinder",
]
# Collected files carry a hash of their content in their name and a gzip (and, with the brotli
# package, a brotli) copy; WhiteNoise serves those names cached for ever (recoverydash.dashboard.
# staticfiles: `make serve` and the demo collect when the sources changed).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "recoverydash.dashboard.staticfiles.StaticStorage"},
}
# Serve from the finders too, so a server works before anything was collected (uncompressed).
WHITENOISE_USE_FINDERS = True
# only the hashed names are kept in STATIC_ROOT (the finders serve the plain ones): each file is
# compressed once
WHITENOISE_KEEP_ONLY_HASHED_FILES = True

# --- Celery -------------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.split("://", 1)[0] not in ("filesystem", "redis", "rediss", "amqp", "memory"):
    raise ImproperlyConfigured(
        f"CELERY_BROKER_URL must be redis://, amqp:// or filesystem://, got {CELERY_BROKER_URL!r}"
    )
CELERY_BROKER_DIR = Path(os.environ.get("CELERY_BROKER_DIR", VAR_DIR / "broker"))
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
# A task a dead worker held is handed to another after this many seconds (Redis broker); longer
# than the longest verification or analysis.
RECOVERYDASH_BROKER_VISIBILITY_TIMEOUT_S = envint("RECOVERYDASH_BROKER_VISIBILITY_TIMEOUT_S",
                                                  3600, 1)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
# Every task: SoftTimeLimitExceeded is raised inside it after the soft limit, the pool process is
# killed after the hard one (a read blocked in the kernel). Verification keeps within 80 % of
# the soft limit by itself and continues in a new task.
RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S = envint("RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S", 300, 1)
RECOVERYDASH_TASK_TIME_LIMIT_S = envint("RECOVERYDASH_TASK_TIME_LIMIT_S", 360, 2)
if RECOVERYDASH_TASK_TIME_LIMIT_S <= RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S:
    raise ImproperlyConfigured("RECOVERYDASH_TASK_TIME_LIMIT_S must be above "
                               "RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S")

# --- Ingest limits (docs/ingest-v1.md#limits) ---------------------------------------------------
RECOVERYDASH_MAX_EVENTS_PER_REQUEST = envint("RECOVERYDASH_MAX_EVENTS_PER_REQUEST", 10_000, 1)
RECOVERYDASH_MAX_BODY_BYTES = envint("RECOVERYDASH_MAX_BODY_BYTES", 8 * 1024 * 1024, 1024)
# Positions in one range of one ledger report (one rank's share of one update): 2**30 by default,
# the recovery core's own bound (recoverydash.recovery.positions).
RECOVERYDASH_MAX_RANGE_POSITIONS = envint("RECOVERYDASH_MAX_RANGE_POSITIONS", 2**30, 1)
# Token bucket per token: sustained requests per second and burst size. 0 disables the limit.
RECOVERYDASH_RATE_LIMIT_PER_SECOND = envfloat("RECOVERYDASH_RATE_LIMIT_PER_SECOND", 50.0)
RECOVERYDASH_RATE_LIMIT_BURST = envint("RECOVERYDASH_RATE_LIMIT_BURST", 200, 1)
# Seconds a web process reuses a live token it looked up (recoverydash.ingest.auth): a revoked
# token is refused by every process within this long (at once by the process that revoked it).
RECOVERYDASH_TOKEN_CACHE_S = envfloat("RECOVERYDASH_TOKEN_CACHE_S", 5.0)
# Redis for the rate limiter; defaults to the broker when that is Redis, so every web worker
# shares one bucket per token (without Redis the bucket is per process).
RECOVERYDASH_REDIS_URL = os.environ.get(
    "RECOVERYDASH_REDIS_URL", CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else "")

# --- Analysis, storage, alerts -------------------------------------------------------------------
RECOVERYDASH_ANALYSIS_DEBOUNCE_S = envfloat("RECOVERYDASH_ANALYSIS_DEBOUNCE_S", 1.0)
# An update some rank's part of which never arrived counts (and decides a restart whose first
# update it is) once its first report is this old
# (docs/definitions.md#updates-counted-once-complete)
RECOVERYDASH_SETTLE_S = envfloat("RECOVERYDASH_SETTLE_S", 300.0)
# Every object's sha256 is read in full, whatever its size (a full-object checksum S3 stores
# with it decides without reading). An object whose digest needs more than this many bytes read
# is hashed in a Celery task of its own (one per object, spread over the workers), with a soft
# time limit of RECOVERYDASH_VERIFY_BASE_S + size / RECOVERYDASH_VERIFY_MIN_BYTES_PER_S seconds
# (the slowest read rate expected of storage); smaller ones in the generation's task.
RECOVERYDASH_VERIFY_INLINE_MAX_BYTES = envint("RECOVERYDASH_VERIFY_INLINE_MAX_BYTES",
                                              64 * 1024 * 1024, 0)
RECOVERYDASH_VERIFY_BASE_S = envfloat("RECOVERYDASH_VERIFY_BASE_S", 60.0, 1.0)
RECOVERYDASH_VERIFY_MIN_BYTES_PER_S = envfloat("RECOVERYDASH_VERIFY_MIN_BYTES_PER_S", 20e6, 1.0)
# A committed generation with objects unchecked and no check started for this long is verified
# again (a worker killed mid-verification, a task the broker lost).
RECOVERYDASH_VERIFY_STALE_S = envfloat("RECOVERYDASH_VERIFY_STALE_S", 600.0)
# Alert rules wait for a generation committed but not decided yet (docs/definitions.md#settled-
# evidence) at most this long after its commit, then read it as not restorable and say so
# (default: the verification deadline above, after which a verification is started again).
RECOVERYDASH_UNDECIDED_BOUND_S = envfloat("RECOVERYDASH_UNDECIDED_BOUND_S",
                                          RECOVERYDASH_VERIFY_STALE_S, 0.0)
# An alert subject that clears within this many seconds of joining, on a fact that was already
# there when it joined, is a flap (docs/definitions.md#flaps; recoverydash_alert_flaps_total).
RECOVERYDASH_FLAP_WINDOW_S = envfloat("RECOVERYDASH_FLAP_WINDOW_S", 900.0, 0.0)
# Grouping of an alert's notifications (docs/definitions.md#group-wait): its first flip goes at
# once; flips that follow a notification of it within this many seconds are held and go together
# once the wait has passed, as one notification of the alert as it is then.
RECOVERYDASH_ALERT_GROUP_WAIT_S = envfloat("RECOVERYDASH_ALERT_GROUP_WAIT_S", 5.0, 0.0)
# Checks of one object that start and never finish (worker killed, time limit) before it is
# stored as storage_unverified and not tried again.
RECOVERYDASH_VERIFY_MAX_ATTEMPTS = envint("RECOVERYDASH_VERIFY_MAX_ATTEMPTS", 3, 1)
# The last restorable generation of each run is verified again this often (ended runs too,
# less often): retention or a person may have deleted or truncated it.
RECOVERYDASH_RECHECK_S = envfloat("RECOVERYDASH_RECHECK_S", 600.0, 1.0)
RECOVERYDASH_RECHECK_ENDED_S = envfloat("RECOVERYDASH_RECHECK_ENDED_S", 3600.0, 1.0)
# Seconds the restore plan (and the run page) may spend re-checking sizes in storage of the
# generation it is about to name; what is not reached in time is said in the answer.
RECOVERYDASH_RESTORE_RECHECK_S = envfloat("RECOVERYDASH_RESTORE_RECHECK_S", 2.0)
# The run page re-checks its restorable generation when it was last verified longer ago.
RECOVERYDASH_PAGE_RECHECK_S = envfloat("RECOVERYDASH_PAGE_RECHECK_S", 60.0)
# Raw update_committed and heartbeat rows (events, ledger rows, heartbeats) absorbed into a run's
# stored analysis state are deleted once older than this many days (docs/retention.md);
# RECOVERYDASH_COMPACTION=false keeps them all.
RECOVERYDASH_RAW_RETENTION_DAYS = envfloat("RECOVERYDASH_RAW_RETENTION_DAYS", 7.0)
RECOVERYDASH_COMPACTION = envbool("RECOVERYDASH_COMPACTION", True)
RECOVERYDASH_RUN_SILENT_S = envfloat("RECOVERYDASH_RUN_SILENT_S", 900.0, 1.0)
# Floor of rank_silent (docs/definitions.md#silence): one rank silent this long at least.
RECOVERYDASH_RANK_SILENT_FLOOR_S = envfloat("RECOVERYDASH_RANK_SILENT_FLOOR_S", 120.0, 1.0)
# The periodic alert evaluation (alerts.evaluation.refresh_stale) also requests a new analysis
# of at most this many runs per cycle whose stored analysis is older than this many seconds,
# oldest first, run by the workers (each a full analysis: the budget bounds that work).
RECOVERYDASH_BEAT_REFRESH_BUDGET = envint("RECOVERYDASH_BEAT_REFRESH_BUDGET", 100)
RECOVERYDASH_BEAT_REFRESH_AFTER_S = envfloat("RECOVERYDASH_BEAT_REFRESH_AFTER_S", 60.0, 0.0)
RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = envbool("RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE", False)
# Total seconds one webhook delivery may take (resolving, connecting, TLS, sending, reading),
# and the most of a receiver's answer that is read (the rest is never downloaded).
RECOVERYDASH_WEBHOOK_TIMEOUT_S = envfloat("RECOVERYDASH_WEBHOOK_TIMEOUT_S", 10.0, 0.1)
RECOVERYDASH_WEBHOOK_MAX_RESPONSE_BYTES = envint("RECOVERYDASH_WEBHOOK_MAX_RESPONSE_BYTES",
                                                 64 * 1024, 1)

# --- Prometheus /metrics (recoverydash.metrics) ---------------------------------------------------
# Per-run series for at most this many runs (most recently heard from first), among runs not
# ended, or ended with their last event received within the window (seconds).
RECOVERYDASH_METRICS_MAX_RUNS = envint("RECOVERYDASH_METRICS_MAX_RUNS", 500, 0)
RECOVERYDASH_METRICS_ENDED_WINDOW_S = envfloat("RECOVERYDASH_METRICS_ENDED_WINDOW_S", 86400.0)
# The operator's basic-auth credentials for /metrics (every project); both or neither.
RECOVERYDASH_METRICS_USERNAME = os.environ.get("RECOVERYDASH_METRICS_USERNAME", "")
RECOVERYDASH_METRICS_PASSWORD = os.environ.get("RECOVERYDASH_METRICS_PASSWORD", "")
if bool(RECOVERYDASH_METRICS_USERNAME) != bool(RECOVERYDASH_METRICS_PASSWORD):
    raise ImproperlyConfigured("RECOVERYDASH_METRICS_USERNAME and RECOVERYDASH_METRICS_PASSWORD "
                               "must be set together (or neither)")
if RECOVERYDASH_METRICS_PASSWORD and len(RECOVERYDASH_METRICS_PASSWORD) < 16:
    raise ImproperlyConfigured("RECOVERYDASH_METRICS_PASSWORD must be at least 16 characters")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"},
                # its start-up banner; lockouts are logged as warnings
                "axes.apps": {"level": "WARNING"}},
}
