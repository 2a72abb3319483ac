"""The built-in Bash tool: real ``bash`` processes in a tmp workspace.

Exit codes, bounded output, a timeout (or an abort) that kills the whole
process group -- a child ignoring SIGTERM and a background ``sleep`` included --
and the shell write bound: redirections, tee, cp/mv/install, rm ... into a
directory outside ``allowed_directories`` are refused before anything runs,
and nothing is written outside."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from lattice_worker import AbortController, create_builtin_tools
from lattice_worker.tools.builtin.shell import OUTPUT_LIMIT_BYTES
from lattice_worker.tools.builtin.shell_policy import split_command
from tests.support.tools import call, snapshot, text

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "seed.txt").write_text("seed\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    root = tmp_path / "outside"
    root.mkdir()
    (root / "keep.txt").write_text("keep\n")
    return root


@pytest.fixture
def tools(ws: Path):
    return create_builtin_tools(cwd=ws, bash_timeout_ms=20_000)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie -- dead, not yet reaped -- counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


async def gone(pids: list[int]) -> bool:
    """True once none of ``pids`` runs. A killed process needs to be scheduled once
    more to exit, so this waits for it (up to 10 s) rather than looking just once."""
    for _ in range(200):
        if not any(alive(pid) for pid in pids):
            return True
        await asyncio.sleep(0.05)
    return False


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def has_content(path: Path) -> bool:
    return path.exists() and bool(path.read_text().strip())


async def wait_for_file(path: Path) -> None:
    for _ in range(400):
        if has_content(path):
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{path} never appeared")


# --------------------------------------------------------------------------- running commands


async def test_output_exit_code_and_cwd(ws: Path, tools) -> None:
    result = await call(tools, "Bash", {"command": "pwd; cat seed.txt; echo oops >&2"})
    assert not result.is_error
    assert text(result) == f"{ws}\nseed\noops\nexit code: 0"
    failed = await call(tools, "Bash", {"command": "echo partial; exit 3"})
    assert failed.is_error and text(failed) == "partial\nexit code: 3"
    quiet = await call(tools, "Bash", {"command": "true"})
    assert text(quiet) == "(no output)\nexit code: 0"


async def test_stdin_is_empty(tools) -> None:
    result = await call(tools, "Bash", {"command": "cat; echo done"})
    assert text(result) == "done\nexit code: 0"


async def test_huge_output_comes_back_cut_with_a_note(tools) -> None:
    command = "echo FIRST; head -c 5000000 /dev/zero | tr '\\0' 'a'; echo; echo LAST"
    result = await call(tools, "Bash", {"command": command})
    out = text(result)
    assert not result.is_error
    assert len(out.encode()) < OUTPUT_LIMIT_BYTES + 200
    assert out.startswith("FIRST\naaa") and out.endswith("aaa\nLAST\nexit code: 0")
    total = len("FIRST\n") + 5_000_000 + len("\nLAST\n")
    assert f"[... output cut: {total - OUTPUT_LIMIT_BYTES} of {total} bytes left out ...]" in out


async def test_timeout_kills_the_whole_process_group(ws: Path, tools) -> None:
    command = (
        "(trap '' TERM; echo $BASHPID >> pids; while true; do sleep 0.05; done) & "
        "sleep 300 & echo $! >> pids; "
        "echo started; wait"
    )
    result = await call(tools, "Bash", {"command": command, "timeout_ms": 3000})
    assert result.is_error
    out = text(result)
    assert out.startswith("started\n")
    assert out.endswith("Timed out after 3000 ms: the command and every process it started were killed.")
    started = pids(ws / "pids")
    assert len(started) == 2
    assert await gone(started), started


async def test_the_per_call_timeout_is_capped_by_bash_timeout_ms(ws: Path) -> None:
    tools = create_builtin_tools(cwd=ws, bash_timeout_ms=300)
    result = await call(tools, "Bash", {"command": "sleep 30", "timeout_ms": 60_000})
    assert result.is_error and "Timed out after 300 ms" in text(result)


async def test_abort_kills_the_process_group(ws: Path, tools) -> None:
    controller = AbortController()
    task = asyncio.ensure_future(
        call(tools, "Bash", {"command": "sleep 300 & echo $! > pid; wait"}, signal=controller.signal)
    )
    await wait_for_file(ws / "pid")
    controller.abort("user stop")
    result = await task
    assert result.is_error and "The query was aborted" in text(result)
    assert await gone(pids(ws / "pid"))


async def test_cancelling_the_call_leaves_nothing_running(ws: Path, tools) -> None:
    task = asyncio.ensure_future(call(tools, "Bash", {"command": "sleep 300 & echo $! > pid; wait"}))
    await wait_for_file(ws / "pid")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(pids(ws / "pid"))


async def test_cancelling_while_the_command_starts_leaves_nothing_running(
    ws: Path, tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command runs before asyncio has connected its pipes; a cancel landing in
    that window (a loaded machine makes it wide) must still stop the whole group."""
    loop = asyncio.get_running_loop()
    connected = asyncio.Event()
    real = loop.subprocess_exec

    async def slow_start(*args, **kwargs):
        started = await real(*args, **kwargs)
        await connected.wait()  # the pipes take their time
        return started

    monkeypatch.setattr(loop, "subprocess_exec", slow_start)
    task = asyncio.ensure_future(call(tools, "Bash", {"command": "sleep 300 & echo $! > pid; wait"}))
    await wait_for_file(ws / "pid")
    task.cancel()
    connected.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = pids(ws / "pid")
    try:
        assert await gone(started)
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_background_jobs_holding_the_output_are_stopped_after_exit(ws: Path, tools) -> None:
    result = await call(tools, "Bash", {"command": "sleep 300 & echo $! > pid; echo quick"})
    assert not result.is_error
    assert text(result).startswith("quick\nBackground processes still writing to the output were stopped")
    assert await gone(pids(ws / "pid"))


@pytest.mark.parametrize(
    ("command", "ending"),
    [
        ("setsid sleep 300 & echo $! > pid; wait", "Timed out after 1000 ms"),  # timeout
        ("setsid sleep 300 & echo $! > pid", "Background processes still writing to the output were stopped"),
    ],
)
async def test_a_process_that_left_the_group_but_holds_the_output_is_stopped(
    ws: Path, tools, command: str, ending: str
) -> None:
    """setsid puts a child in a session (and group) of its own: killing the group
    misses it, yet it still holds the output open."""
    result = await call(tools, "Bash", {"command": command, "timeout_ms": 1000})
    pid = pids(ws / "pid")[0]
    try:
        assert ending in text(result), text(result)
        assert await gone([pid])
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_a_detached_background_job_keeps_running(ws: Path, tools) -> None:
    result = await call(tools, "Bash", {"command": "sleep 300 > /dev/null 2>&1 & echo $! > pid"})
    pid = pids(ws / "pid")[0]
    try:
        assert text(result) == "(no output)\nexit code: 0"
        assert alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- the write bound


ESCAPES = [
    "echo x > {out}/a",
    "echo x >> {out}/a",
    "echo x 2> {out}/a",
    "echo x &> {out}/a",
    "echo x >| {out}/a",
    "echo x>{out}/a",
    "echo x | tee {out}/a",
    "echo x | tee -a seed.txt {out}/a",
    "cp seed.txt {out}/a",
    "cp seed.txt {out}",
    "cp -t {out} seed.txt",
    "cp --target-directory={out} seed.txt",
    "mv seed.txt {out}/a",
    "mv {out}/keep.txt here.txt",
    "install seed.txt {out}/a",
    "install -d {out}/dir",
    "ln -s seed.txt {out}/a",
    "ln {out}/keep.txt hard && echo x >> hard",  # a hard link makes the outside file writable from here
    "rm {out}/keep.txt",
    "rm -rf {out}",
    "rm -rf link/",  # the trailing slash makes rm follow the link: it empties the outside directory
    "rm -rf */",  # ... and so does a pattern the shell expands to link/
    "rm -rf ./l*/",
    "cp seed.txt */",
    "rm -rf {{nothing,link}}/",
    "mkdir {out}/dir",
    "touch {out}/a",
    "dd if=seed.txt of={out}/a",
    "cd {out} && echo x > a",
    "cd .. && cp ws/seed.txt outside/a",
    "echo x > ../outside/a",
    "echo x > link/a",
    "cp seed.txt link/",
    "true; echo x > {out}/a",
    "echo ok\necho x > {out}/a",
    "bash -c 'echo x > {out}/a'",
    "sudo cp seed.txt {out}/a",
    "sudo -u root cp seed.txt {out}/a",
    "nice -n 5 env -u HOME cp seed.txt {out}/a",
    "X=1 cp seed.txt {out}/a",
    "eval 'echo x > {out}/a'",
    "echo x > $OUTSIDE_DIR/a",
    "echo x > {out}/a # a comment",
    "cat > {out}/a <<'EOF'\nit's a here-document\nEOF",
    # short option clusters that end in -t DIR
    "cp -rt {out} seed.txt",
    "cp -rvt{out} seed.txt",
    "mv -ft {out} seed.txt",
    "install -Dt {out} seed.txt",
    "ln -st {out} seed.txt",
    # the -c of a shell among its other options
    "bash -lc 'touch {out}/a'",
    "sh -ec 'touch {out}/a'",
    "bash -o pipefail -xc 'touch {out}/a'",
    "bash -c -- 'touch {out}/a'",
    # reserved words and groups before a command
    "{{ touch {out}/a; }}",
    "! touch {out}/a",
    "if true; then touch {out}/a; fi",
    "if false; then :; else rm {out}/keep.txt; fi",
    "while true; do touch {out}/a; break; done",
    "until false; do touch {out}/a; break; done",
    "clean() {{ rm {out}/keep.txt; }}; clean",
    # /dev/fd/N is safe, /dev/fd/.. is not
    "echo x > /dev/fd/../../..{out}/a",
    # command substitution inside double quotes runs too
    'echo "$(touch {out}/a)"',
    'x="`rm {out}/keep.txt`"',
    'echo "nested $(echo "$(touch {out}/a)")"',
    "cat <<EOF > inside.txt\nit's $(rm {out}/keep.txt)\nEOF",  # an unquoted here-document is expanded
    "cat <<-EOF > inside.txt\n\t`touch {out}/a`\n\tEOF",
    # wrappers that run the command after their own arguments
    "timeout 5 touch {out}/a",
    "timeout -s KILL -k 1 5 rm {out}/keep.txt",
    "setsid touch {out}/a",
    "stdbuf -o0 cp seed.txt {out}/a",
    "xargs -a /dev/null -n 1 touch {out}/a",
    # more commands that write their operands
    "rsync seed.txt {out}/a",
    "rsync -a --exclude x seed.txt {out}/",
    "chmod 000 {out}/keep.txt",
    "chmod -w {out}/keep.txt",
    "chown -R root {out}",
    "find {out} -delete",
    "find -L {out} -name keep.txt -delete",
    "find link/ -delete",
    "find -L link -delete",
    "find {out} -name keep.txt -exec rm {{}} \\;",
    "find . {out} -name '*.txt' -exec rm -f {{}} +",
    "find . -name seed.txt -exec mv {{}} {out}/ ';'",
    "find . -fprint {out}/list",
]


@pytest.mark.parametrize("template", ESCAPES)
async def test_shell_writes_outside_are_refused_and_nothing_runs(
    ws: Path, outside: Path, tools, template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTSIDE_DIR", str(outside))
    os.symlink(outside, ws / "link")
    command = template.format(out=outside)
    before_out, before_ws = snapshot(outside), snapshot(ws)
    result = await call(tools, "Bash", {"command": command})
    assert result.is_error, command
    message = text(result)
    assert message.startswith("Bash: ") and "outside the allowed directories" in message, message
    assert f"({ws})" in message and "is refused" in message
    assert snapshot(outside) == before_out  # nothing written, moved or removed outside
    assert snapshot(ws) == before_ws  # the command did not run at all


@pytest.mark.parametrize("command", ["echo x >> hard", "cp seed.txt hard", "echo x | tee -a hard"])
async def test_writes_through_a_hard_link_to_an_outside_file_are_refused(
    ws: Path, outside: Path, tools, command: str
) -> None:
    os.link(outside / "keep.txt", ws / "hard")
    result = await call(tools, "Bash", {"command": command})
    assert result.is_error and f"{ws / 'hard'} has 2 hard links" in text(result), text(result)
    assert snapshot(outside) == {"keep.txt": b"keep\n"}
    assert not (await call(tools, "Bash", {"command": "rm hard && ln -s seed.txt soft"})).is_error


@pytest.mark.parametrize(
    "command",
    [
        "echo x > inside.txt && cat inside.txt",
        "echo x > /dev/null; echo y 2>/dev/null",
        "ls missing 2>&1; true",
        "cp seed.txt copy.txt && mv copy.txt moved.txt && rm moved.txt",
        "mkdir -p a/b && touch a/b/c && echo x | tee a/log",
        "cat < seed.txt",
        "cat {out}/keep.txt",
        "grep -c seed seed.txt {out}/keep.txt; true",
        "cp {out}/keep.txt copied.txt",
        "rm link",
        "echo 'x > {out}/a'",
        "cat <<'EOF' > inside.txt\nwrite > {out}/a stays text\nEOF",
        "cp -rt . {out}/keep.txt",
        "bash -ec 'echo ok > inside.txt'",
        "if true; then echo ok > inside.txt; fi",
        'echo "$(cat {out}/keep.txt)" > inside.txt',
        "echo '$(touch {out}/a)' \"`echo it is inside`\" > inside.txt",
        "echo x > /dev/fd/2",
        "rm -f *.txt && mkdir -p d1 d2 && rm -rf d*/ {{d1,d2}}",
        "cat <<'EOF' > inside.txt\n$(rm {out}/keep.txt) stays text\nEOF",
        'cat <<"EOF" > inside.txt\n`touch {out}/a` stays text\nEOF',
        "timeout 5 cat {out}/keep.txt",
        "rsync -a {out}/ copy/",
        "chmod +x seed.txt && chmod -R u+w .",
        "find . -name '*.tmp' -delete",
        "find link -delete",  # removes the link only
        "find {out} -name '*.txt' -exec cat {{}} + -exec cp {{}} . \\;",
    ],
)
async def test_writes_inside_and_reads_outside_are_allowed(
    ws: Path, outside: Path, tools, command: str
) -> None:
    os.symlink(outside, ws / "link")
    result = await call(tools, "Bash", {"command": command.format(out=outside)})
    assert not result.is_error, text(result)
    assert snapshot(outside) == {"keep.txt": b"keep\n"}


async def test_an_unparsable_command_is_refused(tools) -> None:
    result = await call(tools, "Bash", {"command": "echo 'unbalanced"})
    assert result.is_error and "cannot parse the command" in text(result)


async def test_a_comment_with_an_apostrophe_still_parses(tools) -> None:
    result = await call(tools, "Bash", {"command": "echo hi # don't worry"})
    assert not result.is_error and text(result) == "hi\nexit code: 0"


def test_split_command_keeps_operators_and_drops_heredoc_bodies() -> None:
    assert split_command("a 2>&1 | b >> 'c d';e") == ["a", "2", ">&", "1", "|", "b", ">>", "c d", ";", "e"]
    assert split_command("cat <<EOF > f\nbody ' line\nEOF\nnext") == [
        "cat",
        "<<",
        "EOF",
        ">",
        "f",
        "\n",
        "next",
    ]
