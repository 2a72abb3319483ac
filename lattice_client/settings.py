"""Settings of the distributed runtime, read from ``LATTICE_*`` environment variables.

Design: DESIGN.md section 7 ("Configuration comes from flags and environment
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

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
"""Where the broker lives when ``LATTICE_BROKER_URL`` is not set."""

KEY_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
"""Characters allowed in a key prefix (it becomes part of Redis keys and queue names)."""

_BROKER_SCHEMES = ("redis", "rediss", "redis+socket")


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
    )

    broker_url: str = DEFAULT_BROKER_URL
    """Celery broker URL (Redis: ``redis://``, ``rediss://`` or ``redis+socket://``).
    Run records, run event streams and the team registry live here too.
    Env: ``LATTICE_BROKER_URL``."""

    mailbox_url: str = ""
    """Where the team mailboxes live: ``redis://…``, ``sqlite:///…``,
    ``postgresql://…`` or ``memory://``. Default: the broker URL.
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
    """Journal the tool calls of template members (and persist their history per
    work item), so a re-claimed member resumes from its last recorded turn and
    recovers interrupted calls by their effect (``docs/tool-effects.md``).
    ``False`` turns that off (a re-claimed member starts over; meant for
    measuring the journal's cost). The lead's own tools are always journaled.
    Env: ``LATTICE_TOOL_JOURNAL``."""

    @model_validator(mode="before")
    @classmethod
    def _mailbox_defaults_to_broker(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("mailbox_url"):
            data = dict(data)
            data["mailbox_url"] = data.get("broker_url") or DEFAULT_BROKER_URL
        return data

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in _BROKER_SCHEMES:
            raise ValueError(
                f"broker_url must be a Redis URL ({', '.join(s + '://' for s in _BROKER_SCHEMES)}), got {value!r}"
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


def get_settings(**overrides: Any) -> LatticeSettings:
    """Settings from ``LATTICE_*`` environment variables, with keyword overrides.

    ``None`` overrides are ignored (so CLI options that were not given fall back
    to the environment). Raises ``pydantic.ValidationError`` (a ``ValueError``)
    on bad values or unknown field names.
    """
    return LatticeSettings(**{k: v for k, v in overrides.items() if v is not None})


__all__ = ["DEFAULT_BROKER_URL", "KEY_PREFIX_PATTERN", "LatticeSettings", "get_settings"]
