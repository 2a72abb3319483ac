"""The client's warnings on the ``lattice`` command's stderr, one ``warning: ...`` line each.

The client logs what a caller should know but that is not an error (e.g. a run
queued for a team no live worker serves, ``--allow-unregistered``) on the
logger ``lattice_client``; a service routes it with its own logging set-up,
and :func:`show_client_warnings` does it for the CLI.
"""

from __future__ import annotations

import logging
from typing import Any


class _ConsoleHandler(logging.Handler):
    def __init__(self, console: Any) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(f"warning: {' '.join(record.getMessage().split())}", markup=False)
        except Exception:  # a broken stderr must not fail the command
            self.handleError(record)


def show_client_warnings(console: Any) -> None:
    """Print the ``lattice_client`` logger's warnings on ``console`` (a rich
    ``Console``, usually stderr). Idempotent."""
    logger = logging.getLogger("lattice_client")
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        logger.addHandler(_ConsoleHandler(console))
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)


__all__ = ["show_client_warnings"]
