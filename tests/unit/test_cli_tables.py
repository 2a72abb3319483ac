"""The status and inbox tables at 80 columns (rich's default when output is not a terminal).

Rich used to shrink the team, result, from, attempts and content columns to
zero width there. These render the tables on ``Console(width=80)`` and check
that every shown column's header, every id and every key value appear whole,
that no line is wider than the console, and that dropped columns are named.
"""

from __future__ import annotations

import re
import time

import pytest
from rich.console import Console

from lattice_client.models import RunRecord, RunResult
from lattice_client.tables import MAILBOX_STATUSES, inbox_table, mailboxes_table, runs_table
from lattice_mailbox import TeamMessage
from lattice_mailbox.validation import new_message_id

NOW = int(time.time() * 1000)
RESULT = "The word claim occurs 42 times in 7 of 12 files; 1234 lines in 12 text files."
CONTENT = "Search the directory ./lattice_mailbox for the word claim and report matches per file"


def render(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def header_line(lines: list[str]) -> str:
    """The line above the rule under the headers."""
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return lines[rule - 1]


def cells(line: str) -> list[str]:
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


def run(run_id: str, status: str = "queued", result: str | None = None) -> RunRecord:
    final = RunResult(run_id=run_id, status=status, result=result) if result else None
    return RunRecord(
        run_id=run_id,
        team="demo",
        prompt="p",
        status=status,
        created_at=NOW,
        updated_at=NOW,
        result=final,
    )


def message(status: str = "pending", attempts: int = 0) -> TeamMessage:
    return TeamMessage(
        id=new_message_id("demo::searcher"),
        from_="demo::lead",
        to="demo::searcher",
        content=CONTENT,
        status=status,
        created_at=NOW,
        attempts=attempts,
    )


def test_runs_table_at_80_columns_shows_every_column_and_whole_ids():
    runs = [run("run_" + "a" * 32), run("run_" + "b" * 32, "completed", RESULT)]
    lines = render(runs_table("recent runs", runs, 80), 80)
    assert max(len(line) for line in lines) <= 80
    assert cells(header_line(lines)) == ["run id", "team", "status", "created", "result"]
    rows = {cells(line)[0]: cells(line) for line in lines if line.startswith("run_")}
    assert set(rows) == {r.run_id for r in runs}
    assert rows[runs[0].run_id][1:3] == ["demo", "queued"]
    completed = rows[runs[1].run_id]
    assert completed[1:3] == ["demo", "completed"]
    assert completed[-1].endswith("…") and RESULT.startswith(completed[-1][:-1])  # cut, not gone
    assert len(completed[-1]) >= 10
    assert not any("hidden" in line for line in lines)


def test_mailbox_table_at_80_columns_shows_every_status_and_mailbox():
    boxes = {"demo::searcher": {"pending": 1, "processing": 2}, "demo::counter": {"done": 3}}
    lines = render(mailboxes_table("mailboxes of demo", boxes, 80), 80)
    assert max(len(line) for line in lines) <= 80
    assert cells(header_line(lines)) == ["mailbox", *MAILBOX_STATUSES]
    rows = {cells(line)[0]: cells(line)[1:] for line in lines if line.startswith("demo::")}
    assert rows == {
        "demo::searcher": ["1", "2", "0", "0", "0", "0", "0"],
        "demo::counter": ["0", "0", "3", "0", "0", "0", "0"],
    }


@pytest.mark.parametrize(
    "statuses, status_in_title",
    [
        (["pending", "pending"], True),  # --status pending: the title names it, the column may go
        (["pending", "pending"], False),  # --status all, every message pending: the column stays
        (["processing", "done"], False),
    ],
)
def test_inbox_table_at_80_columns_keeps_ids_attempts_and_content(statuses, status_in_title):
    messages = [message(s, attempts=n + 1) for n, s in enumerate(statuses)]
    lines = render(inbox_table("demo::searcher", messages, 80, status_in_title=status_in_title), 80)
    assert max(len(line) for line in lines) <= 80
    headers = cells(header_line(lines))
    mixed = not status_in_title  # the status column is shown
    assert headers == ["id", *(["status"] if mixed else []), "attempts", "content"]
    rows = [
        cells(line) for line in lines if line[:1].isalnum() and cells(line)[0] in {m.id for m in messages}
    ]
    assert [r[0] for r in rows] == [m.id for m in messages]  # whole ids, in order
    for row, m in zip(rows, messages, strict=True):
        values = row[1:]
        if mixed:
            assert values.pop(0) == m.status.value
        assert values[0] == str(m.attempts)
        assert values[1].endswith("…") and CONTENT.startswith(values[1][:-1])  # cut, not gone
        assert len(values[1]) >= (len("content") if mixed else 10)
    hidden = ["from", "created"] if mixed else ["status", "from", "created"]
    [note] = [line for line in lines if line.startswith("(hidden")]
    assert sorted(re.search(r"width: (.*);", note).group(1).split(", ")) == sorted(hidden)


def test_a_wide_console_shows_every_column_and_the_whole_content():
    messages = [message("pending"), message("processing", attempts=2)]
    lines = render(inbox_table("demo::searcher", messages, 200), 200)
    assert cells(header_line(lines)) == ["id", "from", "status", "attempts", "created", "content"]
    assert sum(CONTENT in line for line in lines) == 2
    assert not any("hidden" in line for line in lines)


def test_ids_wider_than_the_console_fold_instead_of_vanishing():
    long_id = "r" * 100
    lines = render(runs_table("recent runs", [run(long_id, "completed", RESULT)], 80), 80)
    assert max(len(line) for line in lines) <= 80
    body = lines[lines.index(header_line(lines)) + 2 :]
    assert "".join(line.split()[0] for line in body if line.startswith("r")) == long_id
    assert cells(header_line(lines))[:3] == ["run id", "team", "status"]
    assert any("demo" in line and "completed" in line for line in lines)


def test_empty_tables_still_show_their_headers():
    assert cells(header_line(render(inbox_table("x", [], 80), 80)))[0] == "id"
    assert cells(header_line(render(runs_table("x", [], 80), 80)))[0] == "run id"
