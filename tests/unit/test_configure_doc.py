"""docs/configure.md names every setting and every known ``LATTICE_*`` variable,
so the configuration page cannot drift from ``lattice_client.settings``."""

from __future__ import annotations

import re
from pathlib import Path

from lattice_client.settings import ENV_PREFIX, OTHER_VARIABLES, LatticeSettings, setting_variables

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configure.md"


def documented_names() -> set[str]:
    """The ``LATTICE_*`` names written as code (`` `NAME` ``) on the page."""
    return set(re.findall(r"`(LATTICE_[A-Z0-9_]+)`", PAGE.read_text()))


def test_every_setting_field_and_its_variable_is_documented() -> None:
    text = PAGE.read_text()
    names = documented_names()
    for field in LatticeSettings.model_fields:
        assert f"`{field}`" in text, f"docs/configure.md does not name the setting {field}"
        assert f"{ENV_PREFIX}{field.upper()}" in names, f"docs/configure.md lacks {ENV_PREFIX}{field.upper()}"


def test_every_known_variable_is_documented_and_nothing_else() -> None:
    names = documented_names()
    assert set(OTHER_VARIABLES) <= names, sorted(set(OTHER_VARIABLES) - names)
    # a name in the page's tables that the settings do not know is a typo or a removed
    # variable (the prose may show a misspelling on purpose)
    tables = "\n".join(line for line in PAGE.read_text().splitlines() if line.startswith("|"))
    in_tables = set(re.findall(r"`(LATTICE_[A-Z0-9_]+)`", tables))
    assert in_tables <= setting_variables(), sorted(in_tables - setting_variables())
