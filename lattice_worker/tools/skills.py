"""Skills: reusable instruction bundles selected per query.

Make one in code with :func:`skill`, or load one from a directory holding a
``SKILL.md`` with :func:`load_skill`::

    ---
    name: pdf
    description: Read and inspect PDF documents
    ---

    Render pages before claiming layout is correct.

Pass them as ``skills=[...]`` to ``create_agent`` / ``create_bare_agent`` /
``define_agent``. At the start of each query the agent compares the query's
prompt with every skill's name and description (:func:`match_skills`); the
instructions of the skills that match are added to the system prompt of that
query's model requests only: later queries match afresh, and the stored
history never holds them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

SKILL_FILE = "SKILL.md"

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    """a about all an and any are as at be but by can could do does for from get has have how if in into
    is it its just make may me more my need not of on or our please should so some such than that the
    their them then there these this those to too use used uses using very via want was were what when
    where which who why will with would you your""".split()
)


@dataclass(frozen=True)
class SkillDefinition:
    """A skill: ``name`` and ``description`` (what the prompt is compared with),
    ``instructions`` (what a matching query's requests get), and ``path`` (the
    ``SKILL.md`` it was loaded from, or ``None``)."""

    name: str
    description: str
    instructions: str
    path: str | None = None


def _text(where: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'{where}: "{field}" must be a non-empty string, got {value!r}')
    return value.strip()


def skill(*, name: str, description: str, instructions: str) -> SkillDefinition:
    """A skill defined in code. Each argument must be a non-empty string
    (surrounding whitespace is stripped); raises :class:`ConfigError` otherwise."""
    where = f"skill({name!r})" if isinstance(name, str) else "skill"
    return SkillDefinition(
        name=_text(where, "name", name),
        description=_text(where, "description", description),
        instructions=_text(where, "instructions", instructions),
    )


def load_skill(path: str | os.PathLike[str]) -> SkillDefinition:
    """Load the skill of a directory holding ``SKILL.md`` (or of that file itself).

    The file starts with YAML front matter between two ``---`` lines, with
    non-empty string ``name`` and ``description``; the rest of the file is the
    instructions (not empty). Read as UTF-8.

    Raises :class:`ConfigError` naming the file for a missing directory or file,
    an unreadable file, missing front matter, invalid YAML, front matter that is
    not a mapping, a missing or empty ``name`` / ``description``, or empty
    instructions.
    """
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"load_skill: path must be a directory path, got {path!r}")
    given = Path(path).expanduser()
    file = given if given.is_file() else given / SKILL_FILE
    where = f"load_skill({os.fspath(path)!r})"
    if not given.exists():
        raise ConfigError(f"{where}: {given} does not exist")
    if not file.is_file():
        raise ConfigError(f"{where}: no {SKILL_FILE} in {given}")
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read {file}: {exc}") from None
    lines = text.replace("\r\n", "\n").split("\n")  # not splitlines(): a form feed in the body is text
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{where}: {file} does not start with YAML front matter (a '---' line)")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise ConfigError(f"{where}: the front matter of {file} has no closing '---' line")
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML front matter in {file}: {exc}") from None
    if not isinstance(meta, dict):
        raise ConfigError(
            f"{where}: the front matter of {file} must be a mapping with name and description, "
            f"got {type(meta).__name__}"
        )
    where = f"{where} ({file})"
    return SkillDefinition(
        name=_text(where, "name", meta.get("name")),
        description=_text(where, "description", meta.get("description")),
        instructions=_text(
            where, "instructions (the text after the front matter)", "\n".join(lines[end + 1 :])
        ),
        path=str(file),
    )


def _words(text: str) -> list[str]:
    words = []
    for word in _WORD.findall(text.lower()):
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss") and word not in _STOPWORDS:
            word = word[:-1]  # plural -> singular, roughly: "documents" ~ "document"
        words.append(word)
    return words


def _keywords(text: str) -> set[str]:
    return {w for w in _words(text) if len(w) >= 3 and w not in _STOPWORDS}


def _prompt_index(prompt: str) -> tuple[str, set[str]]:
    """The prompt's words once: joined by single spaces (with a space at each end, to
    find a name's words in a row) and as a set (to find description keywords)."""
    words = _words(prompt)
    return f" {' '.join(words)} ", set(words)


def _matches(definition: SkillDefinition, joined: str, present: set[str]) -> bool:
    name = _words(definition.name)
    if name and f" {' '.join(name)} " in joined:
        return True
    keywords = _keywords(definition.description)
    if not keywords:
        return False
    return len(keywords & present) >= min(2, len(keywords))


def skill_matches(definition: SkillDefinition, prompt: str) -> bool:
    """True when ``prompt`` names the skill or speaks of what it describes.

    Words are compared case-insensitively (letters and digits; a plural ``s``
    dropped). A skill matches when the words of its ``name`` appear together in
    the prompt (``code-review`` in "do a code review"), or when at least two of
    its description's keywords appear in it (every keyword, when the description
    has fewer than two); keywords are words of three letters or more that are
    not common English words (``and``, ``the``, ``with`` ...).
    """
    return _matches(definition, *_prompt_index(prompt))


def match_skills(skills: Iterable[SkillDefinition], prompt: str) -> list[SkillDefinition]:
    """The skills of ``skills`` that ``prompt`` matches (:func:`skill_matches`), in
    order; the prompt is split into words once, however many skills there are."""
    if not prompt:
        return []
    index = _prompt_index(prompt)
    return [s for s in skills if _matches(s, *index)]


def skills_prompt_section(skills: Iterable[SkillDefinition]) -> str | None:
    """The system-prompt section for matched skills, or ``None`` when there are none."""
    parts = [f"## Skill: {s.name}\n{s.description}\n\n{s.instructions}" for s in skills]
    if not parts:
        return None
    return "Skills that apply to this request; follow their instructions:\n\n" + "\n\n".join(parts)


def check_skills(value: Any) -> list[SkillDefinition] | None:
    """Validate the ``skills`` option: ``None`` or a list of :class:`SkillDefinition`
    with unique names. Raises ``ValueError`` (the options turn it into a ``ConfigError``)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ValueError("not a list")
    seen: set[str] = set()
    for i, item in enumerate(value):
        if not isinstance(item, SkillDefinition):
            raise ValueError(
                f"item {i} is {type(item).__name__}, not a SkillDefinition (use skill() or load_skill())"
            )
        if item.name in seen:
            raise ValueError(f'two skills are named "{item.name}"')
        seen.add(item.name)
    return list(value)


__all__ = [
    "SKILL_FILE",
    "SkillDefinition",
    "check_skills",
    "load_skill",
    "match_skills",
    "skill",
    "skill_matches",
    "skills_prompt_section",
]
