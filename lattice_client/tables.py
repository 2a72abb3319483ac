"""The tables ``lattice status`` and ``lattice inbox`` print, laid out for the console width.

Rich shrinks every wrappable column of a table that does not fit, down to zero
width; in an 80-column terminal (also the width rich assumes when output is not
a terminal) the team, result, from, attempts and content columns vanished.
Here every column is ``no_wrap`` with its natural width as ``min_width``
(ids are never cut), one *flexible* column (a run's result, a message's
content) takes what is left and ends with an ellipsis, and when even that does
not fit, the least useful columns are dropped in a fixed order, with a note
saying which (``--json`` shows everything). Ids longer than the whole width
fold onto several lines rather than being cut.

Widths are in terminal cells; the layout is compact (no vertical borders, two
cells between columns).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

GAP = 2
"""Cells between two columns."""

FLEX_MIN = 10
"""Narrowest width (cells) of the flexible column before other columns are dropped."""

MAILBOX_STATUSES = ("pending", "processing", "done", "failed", "cancelled", "read", "parked")
"""Status columns of the mailbox table, in this order."""

_MAILBOX_DROP_ORDER = ("read", "parked", "cancelled", "failed", "done", "processing", "pending")


@dataclass
class Column:
    """One column: ``header``, its ``cells`` (one per row), layout hints.

    ``drop``: 0 = always shown; otherwise columns are dropped highest first while
    the table does not fit. ``flexible``: takes the leftover width, cut with an
    ellipsis (``FLEX_MIN`` cells or more; only its header's width when nothing
    else can go). ``fold``: an id that may fold onto several lines when the
    columns that cannot go are wider than the console together.
    """

    header: str
    cells: list[str] = field(default_factory=list)
    justify: JustifyMethod = "left"
    drop: int = 0
    flexible: bool = False
    fold: bool = False

    @property
    def natural(self) -> int:
        return max([cell_len(self.header), *(cell_len(c) for c in self.cells)])

    def minimum(self, flex_min: int = FLEX_MIN) -> int:
        """Narrowest width: the natural one, or for the flexible column
        ``flex_min`` cells (never less than its header, never more than natural)."""
        if self.flexible:
            return min(self.natural, max(cell_len(self.header), flex_min))
        return self.natural


def _needed(columns: Sequence[Column], flex_min: int = FLEX_MIN) -> int:
    return sum(c.minimum(flex_min) for c in columns) + GAP * (len(columns) - 1)


def fit_columns(columns: Sequence[Column], width: int) -> tuple[list[Column], list[Column], int]:
    """``(kept, dropped, flex_min)``: drop columns (highest ``drop`` first, never
    ``drop=0``) until the minimum widths fit in ``width`` cells; if they still
    do not, the flexible column may shrink to its header (``flex_min`` 0)."""
    kept = list(columns)
    dropped: list[Column] = []
    while _needed(kept) > width:
        candidates = [c for c in kept if c.drop > 0]
        if not candidates:
            break
        victim = max(candidates, key=lambda c: c.drop)
        kept.remove(victim)
        dropped.append(victim)
    flex_min = FLEX_MIN if _needed(kept) <= width else 0
    return kept, dropped, flex_min


def build_table(title: str, columns: Sequence[Column], width: int) -> RenderableType:
    """A compact table of ``columns`` that fits ``width`` cells (see the module
    docstring), followed by a dim note naming the columns left out, if any."""
    kept, dropped, flex_min = fit_columns(columns, width)
    needed = _needed(kept, flex_min)
    squeezed = needed > width  # even the key columns do not fit: ids fold
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    spare = max(0, width - needed)
    for column in kept:
        if column.flexible:
            table.add_column(
                column.header,
                justify=column.justify,
                no_wrap=True,
                overflow="ellipsis",
                width=min(column.natural, column.minimum(flex_min) + spare),
            )
        elif squeezed and column.fold:
            table.add_column(column.header, justify=column.justify, overflow="fold")
        else:
            table.add_column(
                column.header,
                justify=column.justify,
                no_wrap=True,
                min_width=column.natural,
            )
    rows = len(kept[0].cells) if kept else 0
    for index in range(rows):
        table.add_row(*(Text(column.cells[index]) for column in kept))
    if not dropped:
        return table
    names = ", ".join(c.header for c in dropped)
    note = Text(f"(hidden at this width: {names}; --json shows everything)", style="dim")
    return Group(table, note)


# -- the three tables of the CLI -------------------------------------------------------------------


def short_time(ms: int | None) -> str:
    """``MM-DD HH:MM`` local time of a millisecond timestamp (``-`` when unset)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%m-%d %H:%M")


def preview(text: str | None, width: int = 200) -> str:
    """``text`` on one line (whitespace collapsed), at most ``width`` characters."""
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def mailboxes_table(title: str, mailboxes: dict[str, dict[str, int]], width: int) -> RenderableType:
    """Per-status message counts of each mailbox. A status column that is zero in
    every row may be dropped when the table is too wide (``read`` first, then
    ``parked``, ``cancelled``, ``failed``, ``done``, ``processing``, ``pending``)."""
    ids = list(mailboxes)
    columns = [Column("mailbox", ids, fold=True)]
    for name in MAILBOX_STATUSES:
        counts = [mailboxes[m].get(name, 0) for m in ids]
        drop = 0 if any(counts) else _MAILBOX_DROP_ORDER[::-1].index(name) + 1
        columns.append(Column(name, [str(n) for n in counts], justify="right", drop=drop))
    return build_table(title, columns, width)


def runs_table(title: str, runs: Sequence[Any], width: int) -> RenderableType:
    """Recent runs (:class:`~lattice_client.models.RunRecord`): run id, team,
    status, created (``MM-DD HH:MM``), tokens (``spent/budget`` of a run with a
    token budget, shown only when one has), result (or error) preview. Too
    narrow: ``created`` goes first, then ``result``, then ``tokens``."""
    results = []
    for record in runs:
        summary = ""
        if record.result is not None:
            summary = preview(record.result.result or record.result.error)
        results.append(summary)
    columns = [
        Column("run id", [r.run_id for r in runs], fold=True),
        Column("team", [r.team for r in runs], fold=True),
        Column("status", [r.status.value for r in runs]),
        Column("created", [short_time(r.created_at) for r in runs], drop=3),
        Column("result", results, flexible=True, drop=2),
    ]
    if any(getattr(r, "budget_tokens", None) is not None for r in runs):
        spends = [budget_text(r) for r in runs]
        columns.insert(4, Column("tokens", spends, justify="right", drop=1))
    return build_table(title, columns, width)


def budget_text(record: Any) -> str:
    """``"<spent>/<budget>"`` tokens of a run with a budget, ``""`` without."""
    if getattr(record, "budget_tokens", None) is None:
        return ""
    return f"{record.spent_tokens or 0}/{record.budget_tokens}"


def inbox_table(
    title: str, messages: Sequence[Any], width: int, *, status_in_title: bool = False
) -> RenderableType:
    """Messages (:class:`~lattice_mailbox.TeamMessage`): id, from, status,
    attempts, created, content preview. Too narrow: ``created`` goes first,
    then ``from``; the id, status, attempts and content stay. Only when
    ``status_in_title`` (the title names the one status listed, e.g.
    ``--status pending``) may ``status`` go, and then first."""
    statuses = [m.status.value for m in messages]
    columns = [
        Column("id", [m.id for m in messages], fold=True),
        Column("from", [m.from_ for m in messages], drop=1),
        Column("status", statuses, drop=3 if status_in_title else 0),
        Column("attempts", [str(m.attempts) for m in messages], justify="right"),
        Column("created", [short_time(m.created_at) for m in messages], drop=2),
        Column("content", [preview(m.content) for m in messages], flexible=True),
    ]
    return build_table(title, columns, width)


__all__ = [
    "FLEX_MIN",
    "GAP",
    "MAILBOX_STATUSES",
    "Column",
    "build_table",
    "fit_columns",
    "inbox_table",
    "mailboxes_table",
    "preview",
    "runs_table",
    "short_time",
]


def waits_table(title: str, rows: Sequence[Any], width: int, *, id_field: str) -> RenderableType:
    """Parked calls or pending approvals: id, team, member, tool, effect, since, input, reason."""
    columns = [
        Column("id", [str(getattr(r, id_field)) for r in rows], fold=True),
        Column("team", [r.team for r in rows], fold=True),
        Column("member", [r.member for r in rows], fold=True),
        Column("tool", [r.tool_name for r in rows], fold=True),
        Column("effect", [r.effect for r in rows], drop=3),
        Column("since", [short_time(r.created_at) for r in rows], drop=2),
        Column("input", [preview(json.dumps(r.input, default=str), 80) for r in rows], flexible=True, drop=1),
        Column("reason", [preview(r.reason) for r in rows], flexible=True),
    ]
    return build_table(title, columns, width)


def rate_limited_table(title: str, rows: Sequence[Any], width: int) -> RenderableType:
    """Model calls waiting for their turn: model, API key id, waiting, longest wait (s), limit."""
    columns = [
        Column("model", [r.model for r in rows], fold=True),
        Column("key", [r.key_id for r in rows], drop=1),
        Column("waiting", [str(r.waiting) for r in rows]),
        Column("longest wait", [f"{r.longest_seconds:.1f} s" for r in rows]),
        Column("limit", [r.limit or "-" for r in rows], fold=True),
    ]
    return build_table(title, columns, width)


def budget_waits_table(title: str, rows: Sequence[Any], width: int) -> RenderableType:
    """Work parked at its run's budget: run id, team, member, message id, tokens (spent/budget), since."""
    columns = [
        Column("run id", [r.run_id for r in rows], fold=True),
        Column("team", [r.team for r in rows], fold=True),
        Column("member", [r.member for r in rows], fold=True),
        Column("message", [r.message_id or "-" for r in rows], fold=True, drop=2),
        Column("tokens", [f"{r.spent_tokens}/{r.budget_tokens}" for r in rows], justify="right"),
        Column("since", [short_time(r.created_at) for r in rows], drop=1),
    ]
    return build_table(title, columns, width)
