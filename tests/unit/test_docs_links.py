"""The guide stands on its own: every relative link of ``docs/*.md`` and the
README points at a file of the repository (and, with ``#anchor``, at one of
its headings), and nothing the repository ships cites files outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```", re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _CODE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_slug_matches_github() -> None:
    assert (
        slug("3. What a member receives, and what it must do")
        == "3-what-a-member-receives-and-what-it-must-do"
    )
    assert slug("The `lattice` command's options") == "the-lattice-commands-options"
    assert slug("Crash: leases and fencing") == "crash-leases-and-fencing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_CODE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: {broken}"


def test_nothing_cites_files_outside_the_repository() -> None:
    design = "DESIGN" + r"(\.md| §)"
    # citations of the outside specification by its section names, in each form they took
    spec = "|".join(
        ["[Ss]" + r'pec[: ]+(AgentLattice|"|``)', r"(\(|-- )[Ss]" + "pec *$", "[Ss]pec" + " sections"]
    )
    outside = "|".join(["AgentLattice" + ' "', "the " + r"spec\b", spec])
    pattern = "|".join([design, r"\.\./shared", "seeds" + "/", outside])
    found = subprocess.run(
        ["git", "grep", "-nE", pattern, "--", "lattice_*", "README.md", "docs", "tests", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1, f"citations of files outside the repository:\n{found.stdout}"


_PATH = re.compile(r"`((?:lattice_\w+|tests|bench|compose|docs|scripts)/[\w./-]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_repository_paths_named_in_the_text_exist(page: Path) -> None:
    """A path written as code (`` `lattice_worker/runtime/run/keys.py` ``) names a file or directory that exists."""
    missing = sorted({p for p in _PATH.findall(page.read_text()) if not (REPO / p.rstrip(".")).exists()})
    assert not missing, f"{page.name} names paths the repository does not have: {missing}"
