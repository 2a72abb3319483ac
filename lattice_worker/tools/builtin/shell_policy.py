"""Which paths a shell command obviously writes, for ``Bash``'s write bound.

:func:`check_command` splits a command with :mod:`shlex` (quotes, ``;``, ``&&``,
``||``, ``|``, ``&``, parentheses and new lines) and refuses, with
:class:`~.policy.Refusal`, a command that writes outside the workspace's
``allowed_directories`` through:

* a redirection: ``>``, ``>>``, ``>|``, ``&>``, ``&>>``, ``N>``, ``<>``,
  ``>&FILE`` (``/dev/null``, ``/dev/stdout``, ``/dev/stderr``, ``/dev/tty``
  and ``/dev/fd/N`` are always allowed);
* ``tee`` (every file operand); ``cp``, ``mv``, ``install`` and ``ln`` (the
  target: ``-t DIR`` (also in a cluster: ``-rt DIR``) /
  ``--target-directory=DIR`` or the last operand; for
  ``mv`` the sources too, which it removes, and for a hard ``ln`` the sources,
  which become writable through the link); ``rsync`` (the last operand);
  ``install -d``, ``rm``, ``rmdir``, ``unlink``, ``mkdir``, ``touch`` and
  ``truncate`` (every operand); ``chmod``, ``chown`` and ``chgrp`` (the files
  after the mode or owner); ``dd of=FILE``; ``find`` (its starting points for
  ``-delete``, the command of ``-exec`` / ``-execdir`` / ``-ok`` with ``{}``
  standing for each starting point, the file of ``-fprint`` and the like);
* the same inside ``bash -c`` / ``sh -c`` strings (``-lc``, ``-e -c`` ...),
  ``eval`` arguments and ``$(...)`` / backquote substitutions (inside double
  quotes and unquoted here-documents too), after ``sudo``, ``env``, ``command``, ``nohup``, ``time``,
  ``exec``, ``nice``, ``timeout``, ``setsid``, ``stdbuf``, ``ionice``,
  ``xargs`` (the command it runs; not the arguments it reads), leading
  ``VAR=value`` assignments and the reserved words that can start a command
  (``if``, ``then``, ``else``, ``do``, ``{``, ``!`` ...).

Paths are resolved like every write (:meth:`~.policy.Workspace.writable`):
relative to the ``cwd`` (following ``cd DIR`` of the same command line),
``~`` and ``$VAR`` of the process environment expanded, braces and glob
patterns expanded against the file system as it is before the command runs
(``rm -rf */`` names every directory link), links followed (for
``rm``, ``rmdir``, ``unlink``, ``mv`` sources and ``find -delete``, all but the
last component, unless the path ends with ``/``).

This is a guard against mistakes, not a sandbox. It does not see writes made by
programs themselves (``python -c``, ``sed -i``, ``tar -C``, ``sort -o``,
``curl -o``, ``git``, ``make``, a script file), targets built at run time
(variables set in the same command, command substitution, ``xargs``), a link
made by the same command (``ln -s /elsewhere l && echo x > l``), aliases, or
obfuscated commands; a ``#`` comment is not recognised, so a write-looking
comment is refused too. Combine it with a ``permission`` callback and a real
sandbox where that matters.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Iterator

import bracex

from .policy import Refusal, Workspace

_PUNCTUATION = ";&|()<>\n"
_OPERATOR = re.compile(r"&>>|&>|>>|>\||>&|<>|<<<|<<-|<<|<&|>|<|&&|\|\||\|&|;;|[;&|()\n]")
_SAFE_TARGETS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero")
_WRAPPERS = set(
    "sudo env command nohup time exec nice builtin doas timeout setsid stdbuf ionice xargs".split()
)
_WRAPPER_POSITIONALS = {"timeout": 1}  # timeout DURATION COMMAND
_WRAPPER_VALUE_OPTIONS = {
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "stdbuf": {"-i", "-o", "-e", "--input", "--output", "--error"},
    "ionice": {"-c", "-n", "-p", "-P", "-u", "--class", "--classdata", "--pid", "--pgid", "--uid"},
    "xargs": set(
        "-a -d -E -I -L -n -P -s --arg-file --delimiter --max-args --max-lines --max-procs --max-chars"
        " --process-slot-var".split()
    ),
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"},
    "doas": {"-u", "-C"},
    "nice": {"-n", "--adjustment"},
    "env": {"-u", "-C", "--unset", "--chdir"},
    "time": {"-f", "-o", "--format", "--output"},
}
_SHELLS = {"bash", "sh", "zsh", "dash", "ksh"}
_SHELL_VALUE_OPTIONS = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}
_RESERVED = {"if", "then", "elif", "else", "do", "while", "until", "!", "{"}
_EVERY_OPERAND = {"rm", "rmdir", "unlink", "mkdir", "touch", "truncate", "tee"}
_KEEP_LAST_LINK = {"rm", "rmdir", "unlink"}
_COPIERS = {"cp", "mv", "install", "ln", "rsync"}
_MODE_CHANGERS = {"chmod", "chown", "chgrp"}
_MODE_CHANGER_OPTION = re.compile(r"-[RcfvhHLP]+|--.*")  # chmod -w FILE: -w is a mode, not an option
_FIND_WRITES_FILE = {"-fprint", "-fprint0", "-fprintf", "-fls"}
_FIND_RUNS = {"-exec", "-execdir", "-ok", "-okdir"}
_VALUE_OPTIONS = {
    "cp": {"-t", "-S", "--suffix", "--target-directory"},
    "mv": {"-t", "-S", "--suffix", "--target-directory"},
    "ln": {"-t", "-S", "--suffix", "--target-directory"},
    "install": {
        "-t",
        "-S",
        "-m",
        "-o",
        "-g",
        "--mode",
        "--owner",
        "--group",
        "--suffix",
        "--target-directory",
    },
    "rsync": set(
        "-e -f -T -B -M --rsh --filter --exclude --include --exclude-from --include-from --files-from"
        " --temp-dir --backup-dir --partial-dir --compare-dest --copy-dest --link-dest --log-file"
        " --password-file --rsync-path --chmod --suffix --out-format --max-size --min-size --timeout"
        " --bwlimit --port".split()
    ),
    "mkdir": {"-m", "--mode"},
    "touch": {"-r", "-d", "-t", "--reference", "--date"},
    "truncate": {"-s", "-r", "--size", "--reference"},
}
_MAX_DEPTH = 4
_MAX_EXPANSIONS = 1000


_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z0-9_.-]+)\2")


def _heredoc_parts(command: str) -> tuple[str, list[str]]:
    """``command`` with the bodies of its here-documents left out (they are data, not
    commands), and the lines of the bodies of the unquoted ones (``<<EOF``, not
    ``<<'EOF'``), which the shell expands: a ``$(...)`` in them runs."""
    kept: list[str] = []
    expanded: list[str] = []
    pending: list[tuple[bool, str, bool]] = []
    for line in command.split("\n"):
        if pending:
            strip_tabs, delimiter, quoted = pending[0]
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                pending.pop(0)
            elif not quoted:
                expanded.append(line)
            continue
        kept.append(line)
        for match in _HEREDOC.finditer(line):
            if not line[: match.start()].endswith("<"):  # "<<<" is a here-string
                pending.append((match.group(1) == "-", match.group(3), bool(match.group(2))))
    return "\n".join(kept), expanded


def _without_heredoc_bodies(command: str) -> str:
    return _heredoc_parts(command)[0]


def _scan(text: str, i: int = 0, *, closing: bool = False, quoting: bool = True) -> tuple[int, list[str]]:
    """Scan ``text`` from ``i`` as the shell quotes it: the bodies of the ``$(...)``
    and backquote substitutions it runs (outside single quotes; inside double
    quotes too). With ``closing``, ``i`` starts the body of a ``$(`` and the scan
    ends at the ``)`` that closes it: returns its index (else ``len(text)``).
    Without ``quoting`` (a here-document body) quote characters are plain text.
    Nested substitutions are found when a body is checked in its turn."""
    bodies: list[str] = []
    quote = None
    depth = 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "\\":
            i += 1
        elif c == "'" and quote is None and quoting:
            quote = "'"
        elif c == '"' and quoting:
            quote = None if quote == '"' else '"'
        elif c == "`":
            end = text.find("`", i + 1)
            end = len(text) if end == -1 else end
            bodies.append(text[i + 1 : end])
            i = end
        elif text.startswith("$(", i):
            end, _ = _scan(text, i + 2, closing=True)
            bodies.append(text[i + 2 : end])
            i = end
        elif closing and quote is None and c in "()":
            if c == ")" and depth == 0:
                return i, bodies
            depth += 1 if c == "(" else -1
        i += 1
    return len(text), bodies


def _tokens(command: str, *, comments: bool) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = "#" if comments else ""
    return list(lexer)


def split_command(command: str) -> list[str]:
    """The shell words and operators of ``command`` (here-document bodies left out).

    Comments are kept as words (so nothing is hidden behind a ``#``); a command
    that only parses with comments removed (an apostrophe in a comment) is split
    that way. Raises :class:`Refusal` when the quotes do not balance.
    """
    text = _without_heredoc_bodies(command)
    try:
        return _tokens(text, comments=False)
    except ValueError:
        try:
            return _tokens(text, comments=True)
        except ValueError as exc:
            raise Refusal(f"cannot parse the command to check what it writes ({exc})") from None


def _simple_commands(tokens: list[str]) -> Iterator[tuple[list[str], list[tuple[str, str]]]]:
    """``(words, redirections)`` of each simple command; a redirection is ``(operator, target)``."""
    words: list[str] = []
    redirects: list[tuple[str, str]] = []
    pending: str | None = None
    for token in tokens:
        if token and all(c in _PUNCTUATION for c in token):
            for operator in _OPERATOR.findall(token):
                if "<" in operator or ">" in operator:
                    if words and words[-1].isdigit():
                        words.pop()  # "2>": the descriptor number belongs to the operator
                    pending = operator
                    continue
                pending = None  # ">(" is a process substitution, not a file
                yield words, redirects
                words, redirects = [], []
        elif pending is not None:
            redirects.append((pending, token))
            pending = None
        else:
            words.append(token)
    yield words, redirects


def _redirect_target(operator: str, target: str) -> str | None:
    """The file a redirection writes, or ``None`` (input, here-document, descriptor copy)."""
    if ">" not in operator:
        return None  # <, <<, <<<, <&
    if operator.endswith("&") and (target.isdigit() or target == "-"):
        return None  # 2>&1, >&-
    return target


def _short_value(name: str, arg: str) -> tuple[str, str] | None:
    """For a cluster of short options (``-rt``, ``-tDIR``, ``-Dm644``): the first
    letter that takes a value and what follows it in ``arg`` (``""``: the value is
    the next argument); ``None`` when no letter of ``arg`` takes a value."""
    if len(arg) < 2 or arg[0] != "-" or arg[1] == "-":
        return None
    letters = {o[1] for o in _VALUE_OPTIONS.get(name, ()) if len(o) == 2}
    for i, letter in enumerate(arg[1:], start=2):
        if letter in letters:
            return letter, arg[i:]
    return None


def _operands(name: str, args: list[str]) -> list[str]:
    value_options = _VALUE_OPTIONS.get(name, set())
    operands: list[str] = []
    skip = False
    only_operands = False
    for arg in args:
        if skip:
            skip = False
            continue
        if only_operands:
            operands.append(arg)
        elif arg == "--":
            only_operands = True
        elif arg.startswith("--"):
            skip = arg in value_options
        elif arg.startswith("-") and arg != "-":
            value = _short_value(name, arg)
            skip = value is not None and not value[1]
        else:
            operands.append(arg)
    return operands


def _target_directory(name: str, args: list[str]) -> str | None:
    """The ``-t DIR`` / ``-rtDIR`` / ``--target-directory[=]DIR`` of cp, mv, install, ln."""
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else None
        if arg == "--":
            return None
        if arg == "--target-directory":
            return following
        if arg.startswith("--target-directory="):
            return arg.split("=", 1)[1]
        value = _short_value(name, arg)
        if value is not None and value[0] == "t":
            return value[1] or following
    return None


def _symbolic(args: list[str]) -> bool:
    """True when ``ln`` makes symbolic links (``-s``, ``-sf``, ``--symbolic``), not hard ones."""
    return any(a == "--symbolic" or re.fullmatch(r"-[A-Za-z]*s[A-Za-z]*", a) for a in args)


def _shell_script(args: list[str]) -> str | None:
    """The command string of ``bash -c STRING`` (also ``-lc``, ``-e -c``, ``-o pipefail -c``,
    ``-c -- STRING``), or ``None`` when the shell runs no ``-c`` string."""
    command = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--", "-"):
            i += 1
            break
        if arg in _SHELL_VALUE_OPTIONS:
            i += 2
        elif arg.startswith("--"):
            i += 1
        elif len(arg) > 1 and arg[0] in "-+":
            command = command or (arg[0] == "-" and "c" in arg[1:])
            i += 1
        else:
            break
    return args[i] if command and i < len(args) else None


def _strip_wrappers(words: list[str]) -> list[str]:
    i = 0
    while i < len(words):
        word = words[i]
        if word in _RESERVED or (
            "=" in word and not word.startswith("=") and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)
        ):
            i += 1
        elif os.path.basename(word) in _WRAPPERS:
            takes_value = _WRAPPER_VALUE_OPTIONS.get(os.path.basename(word), set())
            positionals = _WRAPPER_POSITIONALS.get(os.path.basename(word), 0)
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in takes_value else 1  # sudo -u USER, nice -n 5 ...
            i += positionals
        else:
            break
    return words[i:]


class _Checker:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def check(self, command: str, cwd: str, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise Refusal("the command nests shells too deeply to check what it writes")
        text, heredocs = _heredoc_parts(command)
        for body in _scan(text)[1] + _scan("\n".join(heredocs), quoting=False)[1]:
            self.check(body, cwd, depth + 1)
        for words, redirects in _simple_commands(split_command(command)):
            for operator, target in redirects:
                path = _redirect_target(operator, target)
                if path is not None:
                    self.allow(path, cwd, f'the "{operator}" redirection')
            cwd = self.check_words(_strip_wrappers(words), cwd, depth)

    def check_words(self, words: list[str], cwd: str, depth: int) -> str:
        if not words:
            return cwd
        name, args = os.path.basename(words[0]), words[1:]
        if name in ("cd", "pushd"):
            operands = [a for a in args if not a.startswith("-")]
            target = operands[0] if operands else os.path.expanduser("~")
            return os.path.join(cwd, _expand(target))
        if name in _SHELLS:
            script = _shell_script(args)
            if script is not None:
                self.check(script, cwd, depth + 1)
            return cwd
        if name == "eval":
            self.check(" ".join(args), cwd, depth + 1)
            return cwd
        if name == "dd":
            for arg in args:
                if arg.startswith("of="):
                    self.allow(arg[3:], cwd, "dd of=")
            return cwd
        if name == "find":
            self.check_find(args, cwd, depth)
            return cwd
        if name in _MODE_CHANGERS:
            operands = [a for a in args if not _MODE_CHANGER_OPTION.fullmatch(a)]
            reference = any(a.startswith("--reference") for a in args)
            for operand in operands if reference else operands[1:]:  # the first names the mode or owner
                self.allow(operand, cwd, name)
            return cwd
        operands = _operands(name, args)
        if name in _EVERY_OPERAND or (name == "install" and ("-d" in args or "--directory" in args)):
            for operand in operands:
                self.allow(operand, cwd, name, keep_last_link=name in _KEEP_LAST_LINK)
        elif name in _COPIERS:
            directory = None if name == "rsync" else _target_directory(name, args)
            if directory is not None:
                self.allow(directory, cwd, f"the {name} target directory")
                sources = operands
            elif operands:
                self.allow(operands[-1], cwd, f"the {name} target")
                sources = operands[:-1]
            else:
                sources = []
            if name == "mv":
                for source in sources:
                    self.allow(source, cwd, "mv (it removes its sources)", keep_last_link=True)
            if name == "ln" and not _symbolic(args):
                for source in sources:
                    self.allow(source, cwd, "ln (a hard link makes its source writable through it)")
        return cwd

    def check_find(self, args: list[str], cwd: str, depth: int) -> None:
        """``find``: its starting points for ``-delete``; the command of ``-exec`` and
        the like with ``{}`` standing for each starting point; ``-fprint FILE``."""
        i = 0
        follow = False
        while i < len(args) and (args[i] in ("-H", "-L", "-P", "-D") or args[i].startswith("-O")):
            follow = follow or args[i] == "-L"
            i += 2 if args[i] == "-D" else 1
        starts = []
        while i < len(args) and not args[i].startswith("-") and args[i] not in ("!", ","):
            starts.append(args[i])
            i += 1
        starts = starts or ["."]
        expression = args[i:]
        if "-delete" in expression:
            for start in starts:
                self.allow(start, cwd, "find -delete", keep_last_link=not follow)
        for j, word in enumerate(expression):
            if word in _FIND_WRITES_FILE and j + 1 < len(expression):
                self.allow(expression[j + 1], cwd, f"find {word}")
            if word in _FIND_RUNS:
                end = next((k for k in range(j + 1, len(expression)) if expression[k] in (";", "+")), None)
                command = expression[j + 1 : end]
                for start in starts:
                    self.check_words(_strip_wrappers([w.replace("{}", start) for w in command]), cwd, depth)

    def allow(self, target: str, cwd: str, what: str, *, keep_last_link: bool = False) -> None:
        if not target:
            return
        for expanded in _words_of(_expand(target), cwd):
            if expanded in _SAFE_TARGETS or re.fullmatch(r"/dev/fd/[0-9]+", expanded):
                continue
            absolute = expanded if os.path.isabs(expanded) else os.path.join(cwd, expanded)
            self.ws.writable(absolute, what=what, keep_last_link=keep_last_link)


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def _words_of(word: str, cwd: str) -> list[str]:
    """What the shell makes of ``word``: braces expanded (``{a,b}``), then each
    pattern (``*``, ``?``, ``[...]``) matched against the file system now, as the
    shell will (``*/`` names ``link/``); a pattern that matches nothing stays as written."""
    try:
        alternatives = bracex.expand(word, limit=_MAX_EXPANSIONS)
    except bracex.ExpansionLimitException:
        raise Refusal(f"{word} expands to more than {_MAX_EXPANSIONS} words to check") from None
    words: list[str] = []
    for alternative in alternatives:
        if re.search(r"[*?[]", alternative):
            pattern = alternative if os.path.isabs(alternative) else os.path.join(cwd, alternative)
            words.extend(sorted(glob.glob(pattern)) or [alternative])
        else:
            words.append(alternative)
    return words


def check_command(ws: Workspace, command: str) -> None:
    """Raise :class:`~.policy.Refusal` when ``command`` obviously writes outside
    ``ws.allowed_directories`` (see the module doc for what is recognised)."""
    _Checker(ws).check(command, ws.cwd)


__all__ = ["check_command", "split_command"]
