"""The daemon's configuration: one pydantic-settings class, validated once at start."""

from __future__ import annotations

from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api_sender import UsageRetry
from api_sender.options import MAX_START_AFTER_SECONDS
from api_sender.schema import check_schema_name

from .db.urls import check_database_url

Role = Literal["api", "worker", "all"]

# Ranges: every value must be one the code and the database can carry (issue 10, B12).
HOUR = 3600.0
DAY = 86_400.0
#: Sleeps below this are a busy loop, not a setting.
MIN_INTERVAL_SECONDS = 0.01
#: Retention windows are subtracted from now(): a century keeps them far inside timestamptz.
MAX_RETENTION_DAYS = 36_500
#: A hub request must end well inside the usage job's 900 s lease (QueueOptions.expire_seconds),
#: or the job is rescued and posted twice while the first post still runs.
MAX_HUB_TIMEOUT_SECONDS = 300.0
#: Retries double from the first delay (the exponent stops at 24, queue/sql.py FAIL): a day
#: times 2**24 is still inside timestamptz; both are int4 columns of the queue.
MAX_USAGE_RETRY_DELAY_SECONDS = 86_400
MAX_USAGE_RETRY_LIMIT = 1000


class ConfigError(Exception):
    """Invalid configuration; the message names the variable and what is wrong (exit 2)."""


def cron_fields(expression: str) -> int:
    """Validate a 5-field (minute first) or 6-field (seconds first) cron; return its field count."""
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"cron {expression!r} must have 5 fields, or 6 with seconds first")
    if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6):
        raise ValueError(f"cron {expression!r} is not a valid cron expression")
    return len(fields)


class Settings(BaseSettings):
    """Every environment variable the daemon reads (a ``.env`` file is read too)."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False
    )

    database_url: SecretStr | None = Field(
        None, description="PostgreSQL URL; unset starts the embedded server under ./.data/postgres"
    )
    service_role: Role = Field("all", description="api, worker or all")
    http_host: str = Field("127.0.0.1", description="HTTP listen address")
    http_port: int = Field(8080, ge=0, le=65535, description="HTTP listen port (0 picks one)")
    ingest_token: SecretStr | None = Field(None, description="bearer token for /v1/*")
    jobs_schema: str = Field("jobs", description="schema holding the queue tables")
    audit_retention_days: int = Field(
        0, ge=0, le=MAX_RETENTION_DAYS, description="0 keeps audit rows forever"
    )
    orphan_user_retention_hours: int = Field(
        0, ge=0, le=MAX_RETENTION_DAYS * 24, description="0 disables the orphan purge"
    )
    superadmin_emails: str = Field("", description="comma-separated emails never orphan-purged")
    purge_cron: str = Field("0 3 * * *", description="when the nightly purges fire")
    cron_tz: str = Field("UTC", description="time zone of every cron")
    usage_downstream: Literal["noop", "log", "http"] = Field("log", description="usage sink")
    hub_url: str | None = Field(None, description="billing hub URL (USAGE_DOWNSTREAM=http)")
    hub_client_id: str | None = Field(None, description="hub Basic-auth user")
    hub_client_secret: SecretStr | None = Field(None, description="hub Basic-auth secret")
    hub_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=MAX_HUB_TIMEOUT_SECONDS,
        allow_inf_nan=False,
        description="timeout of one hub request",
    )
    usage_batch_size: int = Field(50, ge=1, le=1000, description="events per downstream batch")
    usage_retry_limit: int = Field(
        10, ge=0, le=MAX_USAGE_RETRY_LIMIT, description="retries before a batch is held"
    )
    usage_retry_delay_seconds: int = Field(
        30, ge=0, le=MAX_USAGE_RETRY_DELAY_SECONDS, description="first retry delay (doubles)"
    )
    usage_held_delay_seconds: int = Field(
        3600, ge=0, le=MAX_START_AFTER_SECONDS, description="wait before a held re-drive"
    )
    tool_jobs: str = Field("", description="comma-separated module:attribute declaration lists")
    poll_interval_seconds: float = Field(
        2.0,
        ge=MIN_INTERVAL_SECONDS,
        le=HOUR,
        allow_inf_nan=False,
        description="fallback poll interval",
    )
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, le=HOUR, allow_inf_nan=False, description="drain time on SIGTERM"
    )
    admin_token: SecretStr | None = Field(
        None, description="bearer token (API) or Basic password (console) to read and act"
    )
    console_view_token: SecretStr | None = Field(
        None, description="read-only token for /v1/admin and /console (GET only)"
    )
    admin_show_data: bool = Field(
        False, description="show job data on the admin surfaces (else redacted to its size)"
    )
    console_origins: str = Field(
        "", description="comma-separated extra origins a console POST may come from (TLS proxy)"
    )
    listen_mode: Literal["notify", "poll"] = Field(
        "notify",
        description="notify: LISTEN wakes pollers at once; poll: no LISTEN (transaction pooler)",
    )
    database_direct_url: SecretStr | None = Field(
        None,
        description="the server itself, for what needs a session (install lock, LISTEN); "
        "defaults to DATABASE_URL",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info")
    log_format: Literal["json", "console"] | None = Field(
        None, description="json when stdout is not a TTY, else console"
    )
    # Beyond the contract: tuning an operator may need.
    database_pool_size: int = Field(10, ge=2, le=200, description="connections in the pool")
    database_statement_cache_size: int = Field(
        100, ge=0, le=10_000, description="asyncpg prepared-statement cache; 0 behind PgBouncer"
    )
    heartbeat_seconds: float = Field(
        5.0,
        ge=MIN_INTERVAL_SECONDS,
        le=HOUR,
        allow_inf_nan=False,
        description="worker beat while holding jobs",
    )
    worker_stale_seconds: float = Field(
        30.0,
        gt=0,
        le=DAY,
        allow_inf_nan=False,
        description="a worker silent this long is dead; its jobs are rescued",
    )
    maintenance_interval_seconds: float = Field(
        30.0,
        ge=MIN_INTERVAL_SECONDS,
        le=HOUR,
        allow_inf_nan=False,
        description="how often retention pruning may run",
    )
    install_lock_timeout_seconds: float = Field(
        300.0,
        gt=0,
        le=DAY,
        allow_inf_nan=False,
        description="how long an install waits for another replica's install",
    )
    embedded_data_dir: str = Field("./.data/postgres", description="embedded PostgreSQL data")
    http_header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=HOUR,
        allow_inf_nan=False,
        description="time a client has to send request line and headers; then 408",
    )
    http_body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=HOUR,
        allow_inf_nan=False,
        description="time a client has to send a whole /v1 request body; then 408",
    )

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_database_url(value.get_secret_value())
        return value

    @field_validator("jobs_schema")
    @classmethod
    def _schema_name(cls, value: str) -> str:
        return check_schema_name(value)

    @field_validator(
        "service_role", "usage_downstream", "log_level", "log_format", "listen_mode", mode="before"
    )
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("purge_cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        cron_fields(value)
        return value.strip()

    @field_validator("cron_tz")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value

    @field_validator("tool_jobs")
    @classmethod
    def _tool_paths(cls, value: str) -> str:
        for path in _split(value):
            module, _, attribute = path.partition(":")
            if not module or not attribute:
                raise ValueError(f"{path!r} is not of the form module:attribute")
        return value

    @model_validator(mode="after")
    def _hub_when_http(self) -> Settings:
        if self.usage_downstream == "http":
            for name in ("hub_url", "hub_client_id", "hub_client_secret"):
                if not getattr(self, name):
                    raise ValueError(f"{name.upper()} is required when USAGE_DOWNSTREAM=http")
            assert self.hub_url is not None
            if not self.hub_url.startswith(("http://", "https://")):
                raise ValueError("HUB_URL must be an http:// or https:// URL")
        if self.worker_stale_seconds <= self.heartbeat_seconds:
            raise ValueError("WORKER_STALE_SECONDS must exceed HEARTBEAT_SECONDS")
        if self.database_direct_url is not None and self.database_url is None:
            raise ValueError(
                "DATABASE_DIRECT_URL needs DATABASE_URL (the embedded server is reached directly)"
            )
        return self

    @property
    def polls(self) -> bool:
        """Whether new work and cancels are found by polling alone (``LISTEN_MODE=poll``)."""
        return self.listen_mode == "poll"

    def check_session_url(self, *, installs: bool) -> None:
        """Raise :class:`ConfigError` when a process that installs (``worker``, ``all``,
        ``migrate``) runs with ``LISTEN_MODE=poll`` and no ``DATABASE_DIRECT_URL``: poll mode
        means a transaction pooler, and the install's session lock needs the server itself
        (contract section 12)."""
        if installs and self.polls and self.database_direct_url is None:
            raise ConfigError(
                "invalid configuration: DATABASE_DIRECT_URL: is required with LISTEN_MODE=poll "
                "for the worker and all roles and migrate (the install's session lock needs the "
                "server itself, not a transaction pooler); set it to DATABASE_URL when there is "
                "no pooler"
            )

    @property
    def is_worker(self) -> bool:
        """Whether this role installs and runs pollers."""
        return self.service_role in ("worker", "all")

    @property
    def serves_ingest(self) -> bool:
        """Whether this role answers /v1/*."""
        return self.service_role in ("api", "all")

    @property
    def tool_job_paths(self) -> list[str]:
        """The ``TOOL_JOBS`` entries in order."""
        return _split(self.tool_jobs)

    @property
    def console_origin_list(self) -> frozenset[str]:
        """``CONSOLE_ORIGINS`` as origins (scheme://host[:port], no trailing slash)."""
        return frozenset(o.rstrip("/").lower() for o in _split(self.console_origins))

    @property
    def superadmins(self) -> frozenset[str]:
        """``SUPERADMIN_EMAILS`` trimmed and lower-cased."""
        return frozenset(e.lower() for e in _split(self.superadmin_emails))

    @property
    def usage_retry(self) -> UsageRetry:
        """The usage queue's retry budget and hold."""
        return UsageRetry(
            limit=self.usage_retry_limit,
            delay_seconds=self.usage_retry_delay_seconds,
            held_delay_seconds=self.usage_held_delay_seconds,
        )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raise :class:`ConfigError` with a one-line message."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line naming the first invalid variable and what is wrong with it."""
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error["loc"]).upper()
    message = str(error["msg"]).removeprefix("Value error, ")
    if location:
        shown = error.get("input")
        got = f" (got {shown!r})" if isinstance(shown, str | int | float) and location != "" else ""
        secret = ("SECRET", "TOKEN", "DATABASE_URL", "DATABASE_DIRECT_URL")
        if any(marker in location for marker in secret):
            got = ""
        return f"invalid configuration: {location}: {message}{got}"
    return f"invalid configuration: {message}"
