"""The daemon's log: syslog priorities under journald, a rotated file without systemd."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu import logsetup

# A program that logs as the daemon does: its logging set up by logsetup.setup().
PROGRAM = """
import logging, sys
from mtgpu import logsetup
logsetup.setup("DEBUG", log_file=sys.argv[1] or None, max_size=int(sys.argv[2]), keep=int(sys.argv[3]))
log = logging.getLogger("mtgpu.test")
for i in range(int(sys.argv[4])):
    log.info("line %05d %s", i, "x" * 40)
log.debug("a debug line")
log.warning("a warning")
log.error("an error")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("a failure")
print("printed to stderr", file=sys.stderr, flush=True)
"""


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, stderr: Path) -> None:
    with open(stderr, "wb") as err:
        subprocess.run(
            [sys.executable, "-c", PROGRAM, *args],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            check=True,
            timeout=60,
            cwd=tmp_path,
        )


def test_under_journald_lines_carry_priorities_and_no_time(tmp_path: Path) -> None:
    stream = tmp_path / "journal"
    stream.touch()
    st = stream.stat()
    _run(tmp_path, "", "0", "0", "1", env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stderr=stream)
    lines = stream.read_text().splitlines()
    assert lines[0].startswith("<6>mtgpu.test: line 00000 ")
    assert "<7>mtgpu.test: a debug line" in lines
    assert "<4>mtgpu.test: a warning" in lines
    assert "<3>mtgpu.test: an error" in lines
    # A traceback's every line keeps the error's priority (journald reads lines).
    tb = lines[lines.index("<3>mtgpu.test: a failure") + 1 :]
    assert tb[0] == "<3>Traceback (most recent call last):"
    assert any(line.startswith("<3>ZeroDivisionError") for line in tb)
    # journald stamps the time; the line has none of its own.
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line) for line in lines)


def test_a_journal_stream_that_is_not_stderr_keeps_plain_lines(tmp_path: Path) -> None:
    """JOURNAL_STREAM inherited by a daemon whose stderr was sent elsewhere (a file):
    the file gets times and levels, not priority prefixes."""
    other = tmp_path / "other"
    other.touch()
    st = other.stat()
    out = tmp_path / "plain.log"
    _run(tmp_path, "", "0", "0", "1", env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stderr=out)
    lines = out.read_text().splitlines()
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO mtgpu.test: line 00000 ", lines[0])
    assert not any(line.startswith("<") for line in lines)


def test_the_log_file_rotates_at_its_size_and_keeps_its_count(tmp_path: Path) -> None:
    log = tmp_path / "mtgpu.log"
    stderr = tmp_path / "stderr"
    _run(tmp_path, str(log), "4096", "2", "1000", stderr=stderr)
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mtgpu.log"))
    assert files == ["mtgpu.log", "mtgpu.log.1", "mtgpu.log.2"]
    for name in files:
        path = tmp_path / name
        assert 0 < path.stat().st_size <= 4096
        assert path.stat().st_mode & 0o777 == 0o600
    # The newest lines are in the current file, the ones before in .1, and the
    # daemon's own prints (a crash) land in the current file too.
    current = log.read_text()
    assert "an error" in current and "ZeroDivisionError" in current
    assert "printed to stderr" in current
    assert stderr.read_text() == ""
    last_before = (tmp_path / "mtgpu.log.1").read_text().splitlines()[-1]
    first_now = current.splitlines()[0]
    n_before = int(re.search(r"line (\d{5})", last_before).group(1))  # type: ignore[union-attr]
    n_now = int(re.search(r"line (\d{5})", first_now).group(1))  # type: ignore[union-attr]
    assert n_now == n_before + 1


def test_a_link_at_the_log_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / "mtgpu.log").symlink_to(target)
    with pytest.raises(OSError):
        logsetup.RotatingLog(str(tmp_path / "mtgpu.log"), 4096, 2)
    assert target.read_text() == "keep\n"


def test_a_reload_changes_size_and_count(tmp_path: Path) -> None:
    import logging

    handler = logsetup.RotatingLog(str(tmp_path / "d.log"), 1 << 20, 5)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        logsetup.resize(2048, 1)
        assert (handler.max_size, handler.keep) == (2048, 1)
    finally:
        root.removeHandler(handler)
        handler.close()


def test_a_tenants_newline_cannot_forge_a_journal_priority() -> None:
    """A job name, user name or command a tenant chose may hold newlines: under journald
    each line is an entry, so a line ``<0>...`` would be read as an emergency. Every
    line of a record carries the record's own priority first, so journald takes that
    one and the forged prefix is only text."""
    import logging

    hostile = "train\n<0>mtgpu.server: root password changed\n<3>"
    rec = logging.LogRecord("mtgpu.api", logging.INFO, "", 0, "job %s submitted", (hostile,), None)
    lines = logsetup.JournalFormatter().format(rec).split("\n")
    assert lines == [
        "<6>mtgpu.api: job train",
        "<6><0>mtgpu.server: root password changed",
        "<6><3> submitted",
    ]
