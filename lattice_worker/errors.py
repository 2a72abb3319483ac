"""Errors raised by the agent loop, tools and team runtime.

Every error subclasses :class:`LatticeError`, so a host can catch the whole
family with one ``except``. ``ModelTimeoutError`` (a model request past ``request_timeout_ms``) is
also a Python :class:`TimeoutError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class LatticeError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(LatticeError, ValueError):
    """Invalid assembly-time configuration: an unknown option key, an option of the
    wrong type, a reserved tool name, a schema mismatch. Raised by factories such
    as ``create_agent``, ``tool``, ``agent_tool`` and ``create_team``."""


class MissingExtraError(ConfigError, ImportError):
    """An optional integration was asked for and its package is not installed.

    ``extra`` names the ``agent-lattice`` extra that installs it (``langsmith``,
    ``langfuse``, ``otel``...); the message says ``pip install "agent-lattice[<extra>]"``.
    Also an :class:`ImportError`, so ``except ImportError`` catches it too.
    """

    def __init__(self, feature: str, package: str, extra: str, reason: str | None = None) -> None:
        super().__init__(
            f"{feature} needs the {package!r} package, which is not installed"
            + (f" ({reason})" if reason else "")
            + f': pip install "agent-lattice[{extra}]"'
        )
        self.feature = feature
        self.package = package
        self.extra = extra


class APIError(LatticeError):
    """A provider request or response failed (HTTP error, malformed reply).

    ``status_code`` is the HTTP status when there was one; ``body`` the decoded
    error payload when the provider sent one.
    """

    def __init__(self, message: str, *, status_code: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ToolExecutionError(LatticeError):
    """A tool handler raised. The loop turns it into an error ``tool_result``."""


class MaxTurnsError(LatticeError):
    """The agent loop reached ``max_turns`` model requests (subtype ``error_max_turns``)."""


class AbortError(LatticeError):
    """The query's ``signal`` was aborted (subtype ``error_abort``)."""


class ModelTimeoutError(LatticeError, TimeoutError):
    """One model request exceeded ``request_timeout_ms`` (subtype ``error_timeout``)."""


class ToolBatchRejectedError(LatticeError):
    """A ``tool_batch_policy`` rejected a batch before any handler ran."""

    def __init__(self, message: str, *, code: str = "invalid_tool_batch") -> None:
        super().__init__(message)
        self.code = code


class ConcurrentQueryError(LatticeError):
    """A second query started while the Agent was running one; one Agent holds one conversation."""


class MissingOutputError(LatticeError):
    """A run with ``output_schema`` ended without calling ``submit_output`` (subtype ``error_missing_output``)."""


class TeamNotServedError(ConfigError):
    """A run (or step) names a team this worker was not started with.

    ``team``: the team named; ``worker``: this worker's id; ``served``: the
    names of the teams it serves."""

    def __init__(self, team: str, worker: str, served: Iterable[str]) -> None:
        self.team, self.worker, self.served = team, worker, sorted(served)
        super().__init__(
            f"team {team!r} is not served by worker {worker} (it serves: {', '.join(self.served) or 'none'}); "
            "a worker runs only the teams it was started with (and their nested teams), and nothing a run "
            "names is imported"
        )


__all__ = [
    "LatticeError",
    "ConfigError",
    "MissingExtraError",
    "APIError",
    "ToolExecutionError",
    "MaxTurnsError",
    "AbortError",
    "ModelTimeoutError",
    "ToolBatchRejectedError",
    "ConcurrentQueryError",
    "MissingOutputError",
    "TeamNotServedError",
]
