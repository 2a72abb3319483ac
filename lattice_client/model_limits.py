"""The shape of ``LATTICE_MODEL_LIMITS``: a provider's rate limits per model (and per API key).

Documented in docs/configure.md ("Model rate limits"). The value is JSON, a
mapping from a model name (or ``"*"``, any model not named) to its limits::

    LATTICE_MODEL_LIMITS='{"claude-sonnet-4-6": {"requests_per_minute": 300,
                                                 "input_tokens_per_minute": 60000,
                                                 "output_tokens_per_minute": 16000}}'

Every API key gets its own buckets with these limits (a provider's limits
hold per key); an entry may name per-key limits under ``"api_keys"``, keyed by
:func:`api_key_id` (``sha256:<first 16 hex digits>``), so no key is ever
written in clear. The workers enforce them (``lattice_worker.runtime.limits``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

ANY_MODEL = "*"
"""The entry that applies to every model without an entry of its own."""

DIMENSIONS = ("requests", "input_tokens", "output_tokens")
"""What a limit counts, in the order the bucket scripts take them."""


class ModelLimit(BaseModel):
    """One model's limits (per API key). Each field is a positive int or absent
    (absent: not limited). Raises ``pydantic.ValidationError`` naming the field
    on a bad value, an unknown field, or an entry that limits nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1)
    """Requests per minute (per period) per API key."""

    input_tokens_per_minute: int | None = Field(default=None, ge=1)
    """Input tokens per minute (per period) per API key; estimated before a call
    (characters / 4), corrected with the response's ``usage``."""

    output_tokens_per_minute: int | None = Field(default=None, ge=1)
    """Output tokens per minute (per period) per API key, counted from ``usage``
    after each call (a call waits while the bucket is in debt)."""

    period_seconds: float = Field(default=60.0, gt=0, le=86_400)
    """The length of a "minute" in seconds (default 60). Only tests and benches
    shorten it, to run a provider's per-minute pattern faster."""

    api_keys: dict[str, ModelLimit] = Field(default_factory=dict)
    """Limits of particular API keys, keyed by :func:`api_key_id`; they replace
    this entry's for that key."""

    @model_validator(mode="after")
    def _limits_something(self) -> ModelLimit:
        if self.capacities() == (0, 0, 0):
            raise ValueError(
                "a model limit needs at least one of requests_per_minute, input_tokens_per_minute, "
                "output_tokens_per_minute"
            )
        for name in self.api_keys:
            if not name.startswith("sha256:") or len(name) < 15:
                # the name is not echoed: it may be a key written in clear by mistake
                raise ValueError(
                    "api_keys: an entry is not named by a key id; name it sha256:<hex digits> "
                    "(lattice_client.model_limits.api_key_id(key)), never by the key itself"
                )
        return self

    def capacities(self) -> tuple[int, int, int]:
        """``(requests, input tokens, output tokens)`` per period; 0 where not limited."""
        return (
            self.requests_per_minute or 0,
            self.input_tokens_per_minute or 0,
            self.output_tokens_per_minute or 0,
        )

    def for_key(self, key_id: str) -> ModelLimit:
        """The limit of API key ``key_id`` (its own entry, else this one)."""
        return self.api_keys.get(key_id, self)


def api_key_id(api_key: str | None) -> str:
    """``sha256:<16 hex digits>`` of ``api_key`` (``"sha256:none"`` without one): how
    limits, Redis keys and ``lattice status`` name a key, never in clear."""
    if not api_key:
        return "sha256:none"
    return "sha256:" + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


def limit_for(limits: dict[str, ModelLimit], model: str) -> ModelLimit | None:
    """The entry of ``model`` in ``limits``, else the ``"*"`` entry, else ``None``."""
    return limits.get(model) or limits.get(ANY_MODEL)


def check_limits(value: Any) -> Any:
    """``value`` as given, or parsed when it is the variable's JSON text (``""``: no
    limits). Raises ``ValueError`` for text that is not JSON, JSON that is not an
    object, or an empty model name (pydantic checks the rest)."""
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"LATTICE_MODEL_LIMITS is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                'expected e.g. {"claude-sonnet-4-6": {"requests_per_minute": 300}}'
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"LATTICE_MODEL_LIMITS must be a JSON object of model name -> limits, got {type(value).__name__}"
            )
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"model_limits: a model name must be a non-empty string, got {name!r}")
    return value


__all__ = ["ANY_MODEL", "DIMENSIONS", "ModelLimit", "api_key_id", "check_limits", "limit_for"]
