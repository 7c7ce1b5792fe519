"""The daemon's side of terminals: socket directories made through descriptors, and
which terminals' connections still answer (the ``terminal.*`` API operations)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat

import pytest

from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.api.terminals import register
from mtgpu.text import one_line
from mtgpu.tmux.runtime import MAX_TTYS, LiveTerminals, ensure_socket_dir, session_env


def _mode(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


@pytest.fixture
def run(tmp_path):
    """A root-owned RUN_DIR stand-in."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory away")
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    return d


@pytest.mark.root
def test_socket_directories_are_root_made_and_the_tenants(run) -> None:
    root = ensure_socket_dir(str(run), 4242, 4242)
    assert root == str(run / "tmux")
    assert _mode(root) == (0, 0o711)
    assert _mode(f"{root}/tmux-4242") == (4242, 0o700)
    # A directory left with a wrong owner or mode (an older daemon, an admin) is fixed.
    os.chown(f"{root}/tmux-4242", 0, 0)
    os.chmod(f"{root}/tmux-4242", 0o777)
    ensure_socket_dir(str(run), 4242, 4242)
    assert _mode(f"{root}/tmux-4242") == (4242, 0o700)
    assert session_env(str(run), 4242, 4242) == {"MTGPU_TMUX_DIR": root, "TMUX_TMPDIR": root}


@pytest.mark.root
def test_a_link_in_place_of_a_directory_is_never_followed(run, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    os.symlink(victim, run / "tmux")
    with pytest.raises(OSError):
        ensure_socket_dir(str(run), 4242, 4242)
    assert session_env(str(run), 4242, 4242) == {}  # tmux's own place, and a warning
    assert _mode(str(victim)) == (0, 0o755) and not (victim / "tmux-4242").exists()
    os.unlink(run / "tmux")
    os.mkdir(run / "tmux", 0o711)
    os.symlink(victim, run / "tmux" / "tmux-4242")
    with pytest.raises(OSError):
        ensure_socket_dir(str(run), 4242, 4242)
    assert _mode(str(victim)) == (0, 0o755)


def _probe(answer: bool | None):
    async def probe() -> bool:
        if answer is None:
            await asyncio.sleep(3600)  # a frozen laptop: never answers
        return bool(answer)

    return probe


def test_dead_names_only_the_callers_terminals_that_do_not_answer() -> None:
    live = LiveTerminals(timeout=0.2)
    live.add("/dev/pts/1", 1000, _probe(True))
    live.add("/dev/pts/2", 1000, _probe(None))
    live.add("/dev/pts/3", 1000, _probe(False))
    live.add("/dev/pts/4", 2000, _probe(None))  # another tenant's
    dead = asyncio.run(
        live.dead(1000, ["/dev/pts/1", "/dev/pts/2", "/dev/pts/3", "/dev/pts/4", "/dev/pts/9"])
    )
    assert dead == ["/dev/pts/2", "/dev/pts/3"]
    # Removing needs the probe that was added (a newer pty on the same name stays).
    newer = _probe(True)
    live.add("/dev/pts/2", 1000, newer)
    live.remove("/dev/pts/2", _probe(True))
    assert asyncio.run(live.dead(1000, ["/dev/pts/2"])) == []
    live.remove("/dev/pts/2", newer)
    assert asyncio.run(live.dead(1000, ["/dev/pts/2"])) == []


def test_the_api_bounds_the_question_and_logs_a_failure_once(caplog) -> None:
    live = LiveTerminals(timeout=0.2)
    live.add("/dev/pts/5", 1000, _probe(None))
    d = Dispatcher()
    register(d, live)
    alice, mallory = Caller("alice", 1000, False, "socket"), Caller("mallory", 1001, False, "socket")

    def ask(caller, op, **args):
        return asyncio.run(d.handle(caller, {"op": op, "args": args, "id": 1}))

    assert ask(alice, "terminal.dead", ttys=["/dev/pts/5"])["result"] == {"dead": ["/dev/pts/5"]}
    # Mallory cannot learn about, or have anything done to, Alice's terminals.
    assert ask(mallory, "terminal.dead", ttys=["/dev/pts/5"])["result"] == {"dead": []}
    too_many = ask(mallory, "terminal.dead", ttys=[f"/dev/pts/{i}" for i in range(MAX_TTYS + 1)])
    assert not too_many["ok"] and f"at most {MAX_TTYS}" in too_many["error"]
    assert not ask(mallory, "terminal.dead", ttys=["x" * 65])["ok"]
    assert not ask(mallory, "terminal.dead", ttys="/dev/pts/5")["ok"]
    assert not ask(mallory, "terminal.failed", reason="x" * 2001)["ok"]
    with caplog.at_level(logging.WARNING, logger="mtgpu.tmux"):
        for _ in range(3):
            ask(mallory, "terminal.failed", reason="tmux broke\x1b[2J\nfake log line")
    lines = [r.getMessage() for r in caplog.records if "plain shell" in r.getMessage()]
    assert len(lines) == 1 and "\x1b" not in lines[0] and "\n" not in lines[0]
    assert "mallory (UID 1001)" in lines[0]


def test_failure_reasons_are_logged_on_one_line() -> None:
    assert one_line("ok\x07\x9b\nfake log line") == "ok\\x07\\x9b\\nfake log line"
