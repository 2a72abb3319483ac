"""The operations page (``lattice ui``): runs, mailboxes, parked calls and
approvals, workers and queues in the browser, behind credentials.

Server-rendered HTML (Starlette, Jinja2) over the same client the ``lattice``
command uses; install it with ``pip install 'agent-lattice[ui]'``. Modules:

* :mod:`.app` - the Starlette app (:func:`create_app`) and its routes;
* :mod:`.auth` - basic auth and the CSRF check of the forms;
* :mod:`.pages` - the pages (``GET``) and a run's live events;
* :mod:`.actions` - cancel, resolve, approve, deny, drain (``POST``, confirmed first);
* :mod:`.data` - what the pages read; :mod:`.timeline` - a run's timeline from its events;
* :mod:`.drain` - draining a member in the page's process (``--drain TEAM_REF``);
* :mod:`.state` - the shared state, the action log and the renderer.

See docs/operate.md, "The operations page".
"""

from __future__ import annotations

from .app import create_app
from .auth import Auth, parse_basic_auth

__all__ = ["Auth", "create_app", "parse_basic_auth"]
