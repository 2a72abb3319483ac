"""The Redis keys the worker side owns (besides the run store's and the mailbox's).

``P`` = the key prefix; run keys share the run store's hash tag ``{run:<run_id>}``:

==================================  ======  =====================================
key                                 type    content
==================================  ======  =====================================
``P:run:{run:<id>}:history``        list    the lead's conversation (one JSON message per element)
``P:run:{run:<id>}:usage``          hash    token usage summed over the run's lead segments
``P:workitem:<work_item_id>``       string  JSON ``{"run_id", "team"}``: the run waiting for the item
``P:workitem:<id>:early``           string  an item's outcome, when it finished before its run registered it
``P:session:<mailbox_id>``          list    a session member's conversation
``P:session-fence:{<session key>}`` string  ``<lease_until ms>|<claim token>``: the claim that writes it
``P:child:<child run id>:claim``    string  the claim token of the message a child run serves
==================================  ======  =====================================

The reaper's own markers (``P:reaper:*``) are named in :mod:`lattice_worker.runtime.reaper.sweep`.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_KEY_TTL_SECONDS = 7 * 24 * 3600
"""How long (seconds) a run's history, usage and work-item links are kept after their last write."""


@dataclass(frozen=True)
class WorkerKeys:
    """The names of the worker-owned keys under ``prefix`` (see the module doc)."""

    prefix: str

    def history(self, run_id: str) -> str:
        """The Redis list holding run ``run_id``'s lead conversation."""
        return f"{self.prefix}:run:{{run:{run_id}}}:history"

    def usage(self, run_id: str) -> str:
        """The Redis hash summing run ``run_id``'s token usage."""
        return f"{self.prefix}:run:{{run:{run_id}}}:usage"

    def work_item(self, work_item_id: str) -> str:
        """The Redis string linking a work item to its run."""
        return f"{self.prefix}:workitem:{work_item_id}"

    def early_outcome(self, work_item_id: str) -> str:
        """Where a member leaves the outcome of an item finished before its run registered it."""
        return f"{self.prefix}:workitem:{work_item_id}:early"

    def session(self, mailbox_id: str) -> str:
        """The Redis list holding a session member's conversation."""
        return f"{self.prefix}:session:{mailbox_id}"

    def session_fence(self, mailbox_id: str) -> str:
        """The Redis string naming the claim that may write :meth:`session`'s
        list, in that list's cluster slot (its hash tag is the list's key, or
        the list key's own tag when it has one)."""
        session = self.session(mailbox_id)
        if "{" in session:
            return f"{session}:fence"
        return f"{self.prefix}:session-fence:{{{session}}}"

    def child_claim(self, child_run_id: str) -> str:
        """The Redis string holding the current claim token of the message a child
        run serves (it changes when the message is re-claimed after a crash)."""
        return f"{self.prefix}:child:{child_run_id}:claim"


__all__ = ["RUN_KEY_TTL_SECONDS", "WorkerKeys"]
