"""Every ``python`` block of the user guide (``docs/*.md``) and of the README runs as written.

Each block is written to a file and run with the test's Python from the
repository root, in its own process group with a timeout, on its own key
prefix (the :class:`~tests.e2e.conftest.Deployment` environment: the tests'
Redis, ``LATTICE_KEY_PREFIX=test-<uuid>``, a private ``HOME``); it must exit 0.

Markers, on the lines just before a block's opening fence:

* ``<!-- needs: worker ARGS -->`` -- start ``lattice worker ARGS`` (and wait
  until it is ready) before the block runs; repeatable;
* ``<!-- no-run -->`` -- the block is not run here (the text says why).

Any other ``<!-- ... -->`` comment right before a block is refused, so a
misspelt marker cannot silently turn into a block that runs without its worker.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]

DOCS = REPO / "docs"
BLOCK_TIMEOUT_S = 120
"""Seconds a block may run (its workers' start is bounded separately, 45 s each)."""
_FENCE = re.compile(r"^```python\s*$")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    workers: tuple[tuple[str, ...], ...]
    run: bool

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """The ``python`` blocks of one markdown file with their markers.
    Raises ``ValueError`` on an unknown marker or an unclosed block."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if not _FENCE.match(lines[i]):
            i += 1
            continue
        start = i
        workers: list[tuple[str, ...]] = []
        run = True
        j = start - 1
        while j >= 0 and (not lines[j].strip() or _MARKER.match(lines[j].strip())):
            marker = _MARKER.match(lines[j].strip())
            if marker is not None:
                words = marker.group(1).split()
                if words[:2] == ["needs:", "worker"] and len(words) > 2:
                    workers.insert(0, tuple(words[2:]))
                elif words == ["no-run"]:
                    run = False
                else:
                    raise ValueError(f"{path.name}:{j + 1}: unknown marker {lines[j].strip()!r}")
            j -= 1
        end = start + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{start + 1}: python block never closed")
        code = "\n".join(lines[start + 1 : end]) + "\n"
        blocks.append(Block(path, start + 1, code, tuple(workers), run))
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    pages = [*sorted(DOCS.glob("*.md")), REPO / "README.md"]
    return [b for path in pages for b in extract_blocks(path)]


BLOCKS = all_blocks()


def test_the_guide_has_runnable_blocks() -> None:
    """The extraction finds the guide's blocks (an empty list would make every other test vacuous)."""
    runnable = [b for b in BLOCKS if b.run]
    files = {b.path.name for b in runnable}
    assert {"tutorial.md", "testing.md", "operate.md"} <= files, files
    assert any(b.workers for b in runnable), "no block starts a worker"
    assert len(runnable) >= 10, [b.id for b in runnable]
    guide = [b for b in BLOCKS if b.path.parent == DOCS]
    assert sum(not b.run for b in guide) <= 3, "no-run blocks must stay rare in the guide"
    assert any(b.run and b.path.name == "README.md" for b in BLOCKS), (
        "the README's quickstart blocks must run"
    )


def test_markers_are_checked(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- needs: worker pkg.mod:team --member lead -->\n<!-- no-run -->\n```python\nprint(1)\n```\n"
    )
    [block] = extract_blocks(page)
    assert block.workers == (("pkg.mod:team", "--member", "lead"),)
    assert not block.run and block.line == 3
    page.write_text("<!-- needs: wroker pkg.mod:team -->\n```python\nprint(1)\n```\n")
    with pytest.raises(ValueError, match="unknown marker"):
        extract_blocks(page)


def run_block(block: Block, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / f"block_{block.line}.py"
    script.write_text(block.code)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{block.id} did not finish in {BLOCK_TIMEOUT_S} s:\n{out[-4000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything the block left running
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.run], ids=lambda b: b.id)
def test_block_runs_as_written(block: Block, deployment: Deployment, tmp_path: Path) -> None:
    for args in block.workers:
        deployment.worker(*args)
    env = {
        **deployment.env,
        "HOME": os.environ["HOME"],  # the test's private home (tests/conftest.py)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = run_block(block, env, tmp_path)
    worker_logs = "".join(f"\n--- {p.argv[1:3]} ---\n{p.log()[-3000:]}" for p in deployment.procs)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout[-4000:]}{worker_logs}"
