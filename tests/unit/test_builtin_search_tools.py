"""The built-in search tools Glob and Grep on a real directory tree."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from lattice_worker import AbortController, create_builtin_tools
from lattice_worker.tools.builtin import search
from lattice_worker.tools.builtin.policy import MAX_OUTPUT_CHARS
from lattice_worker.tools.builtin.search import GLOB_MAX_RESULTS, GREP_MAX_LINE_CHARS, GREP_MAX_LINES
from tests.support.tools import call, text


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.py").write_text("import os\nimport sys\nprint('hi')\n")
    (root / "src" / "pkg" / "b.py").write_text("x = 1  # important\n")
    (root / "notes.md").write_text("Import the data.\n\nThen import more.\n")
    (root / "blob.bin").write_bytes(b"\0import\0")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("import\n")
    (root / ".env").write_text("import\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "far.py").write_text("import far\n")
    os.symlink(tmp_path / "elsewhere", root / "linked")  # a link to a directory: not followed
    return root


@pytest.fixture
def tools(tree: Path):
    return create_builtin_tools(cwd=tree)


async def test_glob_finds_files_sorted_relative_to_cwd(tools) -> None:
    out = text(await call(tools, "Glob", {"pattern": "**/*.py"}))
    assert out.splitlines() == ["src/a.py", "src/pkg/b.py"]
    braces = text(await call(tools, "Glob", {"pattern": "**/*.{md,bin}"}))
    assert braces.splitlines() == ["blob.bin", "notes.md"]
    hidden = text(await call(tools, "Glob", {"pattern": ".*"}))
    assert hidden.splitlines() == [".env"]  # named explicitly: matched; directories never listed


async def test_glob_from_another_path_gives_absolute_paths(tree: Path, tools) -> None:
    elsewhere = tree.parent / "elsewhere"
    out = text(await call(tools, "Glob", {"pattern": "*.py", "path": str(elsewhere)}))
    assert out == str(elsewhere / "far.py")
    sub = text(await call(tools, "Glob", {"pattern": "*.py", "path": "src"}))
    assert sub == "src/a.py"


async def test_glob_no_match_and_bad_path(tools) -> None:
    none = await call(tools, "Glob", {"pattern": "*.rs"})
    assert not none.is_error and text(none).startswith("No files match '*.rs'")
    bad = await call(tools, "Glob", {"pattern": "*", "path": "nope"})
    assert bad.is_error and "nope is not a directory" in text(bad)


async def test_glob_bounds_the_listing(tmp_path: Path) -> None:
    for i in range(GLOB_MAX_RESULTS + 7):
        (tmp_path / f"f{i:05d}.txt").write_text("")
    out = text(await call(create_builtin_tools(cwd=tmp_path), "Glob", {"pattern": "*.txt"}))
    lines = out.splitlines()
    assert len(lines) == GLOB_MAX_RESULTS + 1 and lines[0] == "f00000.txt"
    assert lines[-1].startswith("[... 7 more matching files not shown")


async def test_grep_lines_sorted_and_counted(tools) -> None:
    out = text(await call(tools, "Grep", {"pattern": r"(?i)\bimport\b"}))
    assert out.splitlines() == [
        "notes.md:1:Import the data.",
        "notes.md:3:Then import more.",
        "src/a.py:1:import os",
        "src/a.py:2:import sys",
        "4 matching lines in 2 files (3 files searched; 1 binary files skipped)",
    ]


async def test_grep_with_a_glob_and_a_file(tools, tree: Path) -> None:
    only_py = text(await call(tools, "Grep", {"pattern": "import|important", "glob": "*.py"}))
    assert only_py.splitlines()[:3] == [
        "src/a.py:1:import os",
        "src/a.py:2:import sys",
        "src/pkg/b.py:1:x = 1  # important",
    ]
    nested = text(await call(tools, "Grep", {"pattern": "x", "path": "src", "glob": "pkg/*.py"}))
    assert nested.splitlines()[0] == "src/pkg/b.py:1:x = 1  # important"
    one_file = text(await call(tools, "Grep", {"pattern": "print", "path": "src/a.py"}))
    assert one_file.splitlines() == [
        "src/a.py:3:print('hi')",
        "1 matching lines in 1 files (1 files searched)",
    ]
    outside = text(await call(tools, "Grep", {"pattern": "far", "path": str(tree.parent / "elsewhere")}))
    assert outside.splitlines()[0] == f"{tree.parent / 'elsewhere' / 'far.py'}:1:import far"


async def test_grep_no_match_is_not_an_error(tools) -> None:
    result = await call(tools, "Grep", {"pattern": "nothing-like-this"})
    assert not result.is_error
    assert text(result).startswith("No matches for 'nothing-like-this' under ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"pattern": "(unclosed"}, "invalid regular expression '(unclosed'"),
        ({"pattern": "x", "path": "missing"}, "missing does not exist"),
        ({"pattern": "x", "path": "blob.bin"}, "blob.bin is a binary file"),
    ],
)
async def test_grep_refusals(tools, args: dict, message: str) -> None:
    result = await call(tools, "Grep", args)
    assert result.is_error and text(result).startswith("Grep: ") and message in text(result)


async def test_grep_bounds_its_output(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("hit\n" * (GREP_MAX_LINES + 20))
    (tmp_path / "wide.txt").write_text(("hit " + "z" * (GREP_MAX_LINE_CHARS + 50) + "\n") * 300)
    tools = create_builtin_tools(cwd=tmp_path)
    lines = text(await call(tools, "Grep", {"pattern": "hit", "path": "many.txt"})).splitlines()
    assert len(lines) == GREP_MAX_LINES + 2 and lines[0] == "many.txt:1:hit"
    assert lines[-2] == "[... 20 more matching lines not shown; narrow the search]"
    assert lines[-1] == f"{GREP_MAX_LINES + 20} matching lines in 1 files (1 files searched)"
    out = text(await call(tools, "Grep", {"pattern": "hit", "path": "wide.txt"}))
    lines = out.splitlines()
    assert lines[0] == "wide.txt:1:hit " + "z" * (GREP_MAX_LINE_CHARS - 4) + "…"  # each line cut
    shown = len(lines) - 2
    assert len(out) < MAX_OUTPUT_CHARS + 500 and shown < 300  # bounded in characters, on line boundaries
    assert lines[-2] == f"[... {300 - shown} more matching lines not shown; narrow the search]"


async def test_grep_searches_a_huge_line_in_bounded_pieces(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_bytes(b"x" * 20_000_000 + b"NEEDLE\nNEEDLE again\n")
    tools = create_builtin_tools(cwd=tmp_path)
    tracemalloc.start()
    try:
        out = text(await call(tools, "Grep", {"pattern": "NEEDLE", "path": "one.txt"}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    lines = out.splitlines()
    assert lines[:2] == ["one.txt:1:NEEDLE", "one.txt:2:NEEDLE again"]  # the matching piece is shown
    assert lines[-1] == "2 matching lines in 1 files (1 files searched)"  # line 1 counted once
    assert peak < 10_000_000, peak  # pieces of GREP_SCAN_CHARS, not the 20 MB line


async def test_grep_stops_at_its_time_limit(tools, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "GREP_TIME_LIMIT_SECONDS", 0)  # Grep over "/" would take minutes
    result = await call(tools, "Grep", {"pattern": "import"})
    assert not result.is_error
    assert text(result).endswith(
        "0 matching lines in 0 files (0 files searched; 1 binary files skipped) "
        "[stopped after the time limit of 0 s; "
        "narrow the path or the glob]"
    )


async def test_grep_stops_when_the_query_is_aborted(tools) -> None:
    controller = AbortController()
    controller.abort("stop")
    out = text(await call(tools, "Grep", {"pattern": "import"}, signal=controller.signal))
    assert "stopped early: the query was aborted" in out
