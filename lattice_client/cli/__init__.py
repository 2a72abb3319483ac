"""The ``lattice`` command: submit and follow runs, inspect mailboxes, start workers and Flower.

One module per role:

* :mod:`.app` - the Typer app and the global options (``--broker-url``,
  ``--mailbox-url``, ``--key-prefix``, given before the command);
* :mod:`.runs` - ``submit``, ``wait``, ``events``, ``cancel``, ``budget``;
* :mod:`.mailboxes` - ``status``, ``inbox``;
* :mod:`.workers` - ``worker``, ``drain``, ``demo`` (they import
  ``lattice_worker`` lazily, when they run; without the ``worker`` extra they
  say which extra to install);
* :mod:`.decisions` - ``parked``, ``resolve``, ``approvals``, ``approve``, ``deny``
  (tool calls that wait for a person);
* :mod:`.flower` - ``flower``, behind credentials;
* :mod:`.ui` - ``ui``, the operations page (:mod:`lattice_client.ui`), behind credentials;
* :mod:`.help` - help texts that show options and arguments as typed;
* :mod:`.output` - consoles, the one-line ``error:`` exit, result printing.

Client commands use :class:`~lattice_client.client.LatticeClient` only.
Bad input or an unreachable Redis prints one ``error: ...`` line on stderr and
exits with a non-zero code (1 = error, 3 = timeout); never a traceback.
"""

from __future__ import annotations

from . import decisions, flower, mailboxes, runs, ui, workers  # noqa: F401  (they register their commands on app)
from .app import app
from .flower import FLOWER_APP, flower_argv
from .output import EXIT_ERROR, EXIT_TIMEOUT


def main() -> None:  # pragma: no cover - console entry point alternative
    app()


__all__ = ["EXIT_ERROR", "EXIT_TIMEOUT", "FLOWER_APP", "app", "flower_argv", "main"]
