"""The process helper (mtgpu/proc.py): one error for a command that cannot start,
times out or fails, and no command left running after its caller gave up on it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mtgpu.errors import CommandError
from mtgpu.proc import arun, call, run, spawn


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"sleep" not in f.read()  # the PID reused by another program
    except FileNotFoundError:
        return True


def test_a_missing_program_is_one_error_naming_it() -> None:
    for started in (
        lambda: run(["mtgpu-no-such-program"]),
        lambda: asyncio.run(arun(["mtgpu-no-such-program"])),
    ):
        with pytest.raises(CommandError) as exc:
            started()
        assert exc.value.returncode is None
        assert "mtgpu-no-such-program: not found" in str(exc.value)


def test_a_failing_command_carries_its_status_and_error_output() -> None:
    with pytest.raises(CommandError) as exc:
        run(["sh", "-c", "echo why >&2; exit 3"])
    assert (exc.value.returncode, exc.value.stderr) == (3, "why\n")
    with pytest.raises(CommandError) as aexc:
        asyncio.run(arun(["sh", "-c", "echo why >&2; exit 3"]))
    assert (aexc.value.returncode, aexc.value.stderr) == (3, "why\n")
    done = asyncio.run(arun(["sh", "-c", "echo out; echo why >&2; exit 3"], check=False, stderr=False))
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"")


def test_input_and_a_file_as_standard_input(tmp_path: Path) -> None:
    assert run(["cat"], input="given").stdout == "given"
    assert asyncio.run(arun(["cat"], input=b"given")).stdout == b"given"
    f = tmp_path / "in"
    f.write_text("from a file")
    with open(f, "rb") as fh:
        assert run(["cat"], stdin=fh).stdout == "from a file"


def test_a_command_past_its_timeout_is_killed_not_left_behind(tmp_path: Path) -> None:
    """A reader of a file that never ends (a FIFO a tenant planted) must not outlive
    the daemon's wait for it: arun kills it at the timeout."""
    pidfile = tmp_path / "pid"
    with pytest.raises(CommandError, match="timed out after 0.5s"):
        asyncio.run(arun(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=0.5))
    assert _gone(int(pidfile.read_text()))


def test_a_cancelled_wait_kills_the_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    async def main() -> None:
        task = asyncio.create_task(arun(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=None))
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _gone(int(pidfile.read_text()))


def test_run_as_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to change user")
    nobody = 65534
    assert run(["id", "-u"], user=nobody, group=nobody, extra_groups=[]).stdout.strip() == str(nobody)
    done = asyncio.run(arun(["id", "-u"], user=nobody, group=nobody, extra_groups=[]))
    assert done.stdout.strip() == str(nobody).encode()


def test_call_and_spawn_return_what_the_standard_library_does() -> None:
    assert call(["sh", "-c", "exit 4"]) == 4
    p = spawn(["sh", "-c", "exit 5"])
    assert p.wait() == 5
    with pytest.raises(FileNotFoundError):
        spawn(["mtgpu-no-such-program"])
