"""Settings of the distributed runtime, read from ``LATTICE_*`` environment variables.

Documented in docs/configure.md ("Configuration comes from flags and environment
variables through pydantic-settings"). Every field can be given as a keyword
argument, through its environment variable (``LATTICE_<FIELD NAME>``, case
insensitive) or through a ``.env``-free process environment; keyword arguments
win over the environment.

Example::

    from lattice_client.settings import get_settings

    settings = get_settings(key_prefix="staging")   # the rest from LATTICE_* or defaults
    settings.broker_url                             # 'redis://127.0.0.1:6379/0'
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from lattice_mailbox.urls import mask_url

from .model_limits import ModelLimit, check_limits

ENV_PREFIX = "LATTICE_"
"""Prefix of every environment variable of agent-lattice."""

DEFAULT_REDIS_PORT = 6379
"""Port of the default broker URL when ``LATTICE_REDIS_PORT`` is not set."""

DEFAULT_BROKER_URL = f"redis://127.0.0.1:{DEFAULT_REDIS_PORT}/0"
"""Where the broker lives when neither ``LATTICE_BROKER_URL`` nor ``LATTICE_REDIS_PORT`` is set."""

OTHER_VARIABLES: dict[str, str] = {
    "LATTICE_DEBUG": "1: the lattice command prints the traceback of an error (as --debug does)",
    "LATTICE_MODEL": "the model the example team uses with an API key",
    "LATTICE_REAPER": "0: a worker runs without its reaper thread",
    "LATTICE_WORKER_TEAMS": "set by lattice worker: the team references its pool processes load",
    "LATTICE_UI_BASIC_AUTH": "lattice ui: USER:PASSWORD[,USER2:PASSWORD2] of the operations page (as --basic-auth)",
    "LATTICE_FLOWER_PORT": "compose: the host port Flower is published on (default 5555)",
    "LATTICE_TEST_REDIS_URL": "the tests' Redis (default redis://127.0.0.1:6379/0)",
    "LATTICE_TEST_SCREENSHOTS": "the browser tests: where they save the operations page's screenshots",
    "LATTICE_TEST_PG_URL": "the tests' PostgreSQL (default postgresql://postgres@127.0.0.1:5432/test)",
}
"""``LATTICE_*`` variables that are not settings fields, with what they do."""

_URL_FIELDS = ("broker_url", "mailbox_url")

KEY_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
"""Characters allowed in a key prefix (it becomes part of Redis keys and queue names)."""

_REDIS_BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
_AMQP_BROKER_SCHEMES = ("amqp", "amqps", "pyamqp")
_BROKER_SCHEMES = _REDIS_BROKER_SCHEMES + _AMQP_BROKER_SCHEMES
_CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_STATE_SCHEMES = ("redis", "rediss", "unix", *_CLUSTER_SCHEMES)


class LatticeSettings(BaseSettings):
    """Configuration shared by the client, the CLI and the workers.

    Raises ``pydantic.ValidationError`` (a ``ValueError``) naming the field on
    bad input, e.g. an empty key prefix or a non-positive lease. Unknown keyword
    arguments are refused.
    """

    model_config = SettingsConfigDict(
        env_prefix="LATTICE_",
        case_sensitive=False,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
        hide_input_in_errors=True,  # a URL's password must not show in a ValidationError
    )

    broker_url: str = DEFAULT_BROKER_URL
    """Celery broker URL: Redis (``redis://``, ``rediss://``, ``redis+socket://``)
    or RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``; quorum queues). With a
    Redis broker, run records, run event streams and the live worker registry
    live there too; with RabbitMQ they live on ``mailbox_url`` (see
    :attr:`state_url`), which must then be a Redis URL.
    Default ``redis://127.0.0.1:<redis_port>/0``. Env: ``LATTICE_BROKER_URL``."""

    redis_port: int = Field(default=DEFAULT_REDIS_PORT, ge=1, le=65535)
    """Port of the default broker URL (``redis://127.0.0.1:<port>/0``) when no
    broker URL is given; the compose file publishes its Redis on this host port.
    Env: ``LATTICE_REDIS_PORT``."""

    mailbox_url: str = ""
    """Where the team mailboxes live: ``redis://…``, a Redis Cluster
    ``redis+cluster://host:port[,host:port...]`` (run records, event streams and
    the worker registry then live on the cluster too, see :attr:`state_url`),
    ``sqlite:///…``, ``postgresql://…`` or ``memory://``. Default: the broker URL
    when it is Redis; required (a Redis URL) with an ``amqp://`` broker.
    Env: ``LATTICE_MAILBOX_URL``."""

    key_prefix: str = "lattice"
    """Prefix of every Redis key and Celery queue name (``[A-Za-z0-9_.-]+``), so
    two deployments sharing one Redis never meet. SQL mailboxes
    (``sqlite:///``, ``postgresql://``) name their tables from it
    (:func:`lattice_mailbox.sql_table_prefix`: ``lattice`` -> ``lattice_messages``;
    other characters than ``[a-z0-9_]`` become ``_`` plus a short hash), so two
    deployments sharing one database never meet either.
    Env: ``LATTICE_KEY_PREFIX``."""

    lease_seconds: float = Field(default=30.0, gt=0)
    """Claim lease in **seconds** (float, > 0): how long a member may hold a
    message without renewing before the reaper requeues it.
    Env: ``LATTICE_LEASE_SECONDS``."""

    max_attempts: int = Field(default=3, ge=1)
    """Claims of one message (>= 1) before it fails with a diagnostic upstream.
    Env: ``LATTICE_MAX_ATTEMPTS``."""

    reaper_interval_seconds: float = Field(default=5.0, gt=0)
    """Seconds (float, > 0) between two reaper sweeps in a worker.
    Env: ``LATTICE_REAPER_INTERVAL_SECONDS``."""

    reaper_scan_pause_seconds: float = Field(default=0.0, ge=0)
    """Pause in **seconds** (float, >= 0) of a reaper sweep after each member
    mailbox its lost-doorbell scan reads, to spread a big deployment's sweep
    (its Redis reads) over time; the sweep's lock is renewed meanwhile.
    Default 0: no pause. Env: ``LATTICE_REAPER_SCAN_PAUSE_SECONDS``."""

    registry_heartbeat_seconds: float = Field(default=5.0, gt=0)
    """Seconds (float, > 0) between two heartbeats of a worker's entry in the
    live registry (``<prefix>:worker:<node>``, see :mod:`lattice_client.registry`);
    the entry expires three heartbeats after the last one.
    Env: ``LATTICE_REGISTRY_HEARTBEAT_SECONDS``."""

    max_message_bytes: int = Field(default=1024 * 1024, ge=1)
    """Upper bound in **bytes** of one mailbox message body (content + metadata
    JSON, on every mailbox store) and of a submitted prompt (default 1 MiB).
    Env: ``LATTICE_MAX_MESSAGE_BYTES``."""

    max_run_events: int = Field(default=10_000, ge=10)
    """Approximate length bound (entries) of each run's event stream (Redis
    ``XADD MAXLEN ~``). Env: ``LATTICE_MAX_RUN_EVENTS``."""

    tool_journal: bool = True
    """Journal the tool calls of members per work item (and persist a template
    member's history per work item; a session member's is its conversation),
    so a re-claimed member resumes from its last recorded turn and
    recovers interrupted calls by their effect (``docs/tool-effects.md``).
    ``False`` turns that off (a re-claimed member starts over; meant for
    measuring the journal's cost). The lead's own tools are always journaled.
    Env: ``LATTICE_TOOL_JOURNAL``."""

    model_limits: Annotated[dict[str, ModelLimit], NoDecode] = Field(default_factory=dict)
    """Provider rate limits per model and API key, enforced by token buckets in
    Redis that every worker shares (docs/configure.md, "Model rate limits").
    JSON: ``{"<model or *>": {"requests_per_minute": N, "input_tokens_per_minute": N,
    "output_tokens_per_minute": N}}`` (each optional, positive). Default: none.
    Env: ``LATTICE_MODEL_LIMITS``."""

    @field_validator("model_limits", mode="before")
    @classmethod
    def _check_model_limits(cls, value: Any) -> Any:
        return check_limits(value)

    @model_validator(mode="before")
    @classmethod
    def _mailbox_defaults_to_broker(cls, data: Any) -> Any:
        if isinstance(data, dict) and (not data.get("broker_url") or not data.get("mailbox_url")):
            data = dict(data)
            if not data.get("broker_url"):
                data["broker_url"] = default_broker_url(data.get("redis_port"))
            if not data.get("mailbox_url") and not is_amqp_url(str(data["broker_url"])):
                data["mailbox_url"] = data["broker_url"]
        return data

    @property
    def state_url(self) -> str:
        """The Redis URL (str) of run records, run event streams and the live
        worker registry: ``mailbox_url`` when the broker is RabbitMQ (checked to
        be a Redis URL at validation) or when the mailboxes are on a Redis Cluster
        (``redis+cluster://``), else ``broker_url``."""
        if is_amqp_url(self.broker_url) or is_cluster_url(self.mailbox_url):
            return self.mailbox_url
        return self.broker_url

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # repr() and str() show URLs without their password
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name in _URL_FIELDS else value

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str) -> str:
        if is_cluster_url(value):
            raise ValueError(
                f"broker_url {mask_url(value)!r} names a Redis Cluster, which Celery's Redis transport "
                "cannot use: give the broker one Redis (redis://) or RabbitMQ (amqp://), and put the "
                "cluster in mailbox_url (LATTICE_MAILBOX_URL) for the mailboxes, runs and worker registry"
            )
        scheme = urlsplit(value).scheme
        if scheme not in _BROKER_SCHEMES:
            raise ValueError(
                f"broker_url must be a Redis or RabbitMQ URL ({', '.join(s + '://' for s in _BROKER_SCHEMES)}), "
                f"got {mask_url(value)!r}"
            )
        return value

    @field_validator("mailbox_url")
    @classmethod
    def _check_state_on_redis(cls, value: str, info: ValidationInfo) -> str:
        broker = info.data.get("broker_url")
        if broker is None or not is_amqp_url(broker):
            return value
        if not value:
            raise ValueError(
                f"the broker {mask_url(broker)!r} is RabbitMQ: mailbox_url must name the Redis of the "
                "mailboxes, runs and worker registry (e.g. redis://127.0.0.1:6379/0), it has no default then"
            )
        if urlsplit(value).scheme not in _STATE_SCHEMES:
            raise ValueError(
                "with a RabbitMQ broker runs and the worker registry live on mailbox_url, which must then be "
                f"a Redis URL ({', '.join(s + '://' for s in _STATE_SCHEMES)}), got {mask_url(value)!r}"
            )
        return value

    @field_validator("key_prefix")
    @classmethod
    def _check_key_prefix(cls, value: str) -> str:
        if not KEY_PREFIX_PATTERN.fullmatch(value):
            raise ValueError(f"key_prefix must be non-empty and match [A-Za-z0-9_.-]+, got {value!r}")
        return value

    def with_overrides(self, **overrides: Any) -> LatticeSettings:
        """A copy with the given fields replaced (``None`` values are ignored).

        When ``broker_url`` changes and ``mailbox_url`` is not given and was
        following the broker, the mailbox URL follows the new broker URL.
        Raises ``pydantic.ValidationError`` on bad values or unknown fields.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        data = self.model_dump()
        if "broker_url" in given and "mailbox_url" not in given and self.mailbox_url == self.broker_url:
            data["mailbox_url"] = ""
        data.update(given)
        return LatticeSettings(**data)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in _CLUSTER_SCHEMES


def is_amqp_url(url: str) -> bool:
    """Whether ``url`` names a RabbitMQ broker (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return urlsplit(url).scheme.lower() in _AMQP_BROKER_SCHEMES


def default_broker_url(port: Any = None) -> str:
    """``redis://127.0.0.1:<port>/0`` (port: ``LATTICE_REDIS_PORT``'s value, default 6379).
    A port that is not an integer is left for the field's validation to refuse."""
    try:
        number = int(port) if port not in (None, "") else DEFAULT_REDIS_PORT
    except (TypeError, ValueError):
        return DEFAULT_BROKER_URL
    return f"redis://127.0.0.1:{number}/0"


def setting_variables() -> frozenset[str]:
    """Every ``LATTICE_*`` variable agent-lattice knows: the settings fields
    (``LATTICE_<FIELD NAME>``) and :data:`OTHER_VARIABLES`."""
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in LatticeSettings.model_fields}
    return frozenset(fields | set(OTHER_VARIABLES))


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for every ``LATTICE_*`` variable in
    ``environ`` (default ``os.environ``) that agent-lattice does not know --
    usually a misspelling, which would otherwise be ignored silently."""
    environ = os.environ if environ is None else environ
    known = setting_variables()
    unknown = []
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in known:
            close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
            unknown.append((name, close[0] if close else None))
    return unknown


def get_settings(**overrides: Any) -> LatticeSettings:
    """Settings from ``LATTICE_*`` environment variables, with keyword overrides.

    ``None`` overrides are ignored (so CLI options that were not given fall back
    to the environment). Raises ``pydantic.ValidationError`` (a ``ValueError``)
    on bad values or unknown field names.
    """
    return LatticeSettings(**{k: v for k, v in overrides.items() if v is not None})


__all__ = [
    "DEFAULT_BROKER_URL",
    "DEFAULT_REDIS_PORT",
    "ENV_PREFIX",
    "KEY_PREFIX_PATTERN",
    "OTHER_VARIABLES",
    "LatticeSettings",
    "default_broker_url",
    "get_settings",
    "is_amqp_url",
    "is_cluster_url",
    "setting_variables",
    "unknown_variables",
]
