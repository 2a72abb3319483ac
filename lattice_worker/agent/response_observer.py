"""Who hears what the provider answered: the HTTP status and headers of each model response.

:class:`~lattice_worker.agent.anthropic_client.AnthropicModelClient` reports
every response it receives (a reply or an error status) to the
:data:`current_observer` of the running context, read through the SDK's public
API (``with_raw_response``, ``APIStatusError.response``). The distributed
runtime's rate limiter (``lattice_worker.runtime.limits``) sets one around a
call to feed the shared buckets (``anthropic-ratelimit-*``, ``retry-after``).
Nothing is reported when no observer is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class ResponseObserver:
    """Collects the responses of one model call.

    ``own_retries``: the observer retries rate-limited calls itself, so the
    client makes this call without its SDK's retries (``max_retries=0``).
    ``responses``: ``(status, headers)`` per HTTP response, oldest first
    (headers lower-case)."""

    own_retries: bool = False
    responses: list[tuple[int, dict[str, str]]] = field(default_factory=list)

    def heard(self, status: int, headers: Mapping[str, str]) -> None:
        """Record one response (``status``: the HTTP status)."""
        self.responses.append((int(status), {str(k).lower(): str(v) for k, v in headers.items()}))

    @property
    def last(self) -> tuple[int, dict[str, str]] | None:
        """The last response heard, or ``None``."""
        return self.responses[-1] if self.responses else None


current_observer: ContextVar[ResponseObserver | None] = ContextVar("lattice_response_observer", default=None)
"""The observer of the model call running in this context (``None``: nobody listens)."""


__all__ = ["ResponseObserver", "current_observer"]
