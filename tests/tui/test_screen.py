"""The full screen of remotegpu-cli in a real terminal: tmux runs it at 80x24, send-keys
types, capture-pane reads what a user would see."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.tmux, pytest.mark.podman]

REPO = Path(__file__).resolve().parent.parent.parent
#: SGR parameters that set a colour (foreground, background, 256/true colour, bright).
COLOUR = re.compile(r"^(3[0-8]|4[0-8]|9[0-7]|10[0-7])$")


class Pane:
    """remotegpu-cli in a tmux pane of its own server."""

    _count = 0

    def __init__(self, laptop, *args: str, **env: str) -> None:
        Pane._count += 1
        self.sock = f"remotegpu-{os.getpid()}-{Pane._count}"
        argv = [sys.executable, "-m", "mtgpu.tui.main", "--timeout", "2", "--interval", "0.5", *args]
        envs = laptop.env(**env)
        command = " ".join(f"{k}={shlex.quote(v)}" for k, v in envs.items() if k in (
            "HOME", "TERM", "LANG", "NO_COLOR", "PATH", "PYTHONPATH"))
        subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", "new-session", "-d", "-x", "80",
                        "-y", "24", "-c", str(REPO), f"env -i {command} {shlex.join(argv)}; echo EXITED-$?; sleep 600"],
                       check=True, env=envs)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True).stdout

    def screen(self, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", *(["-e"] if escapes else []))

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-l", text)
        self.tmux("send-keys", "Enter")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.time() + timeout
        while True:
            s = self.screen()
            m = re.search(pattern, s, re.M)
            if m:
                return m
            if time.time() > deadline:
                raise AssertionError(f"{pattern!r} did not appear; screen:\n{s}")
            time.sleep(0.1)

    def close(self) -> None:
        self.tmux("kill-server")


def colours(screen: str) -> set[str]:
    return {p for seq in re.findall(r"\x1b\[([0-9;]*)m", screen) for p in seq.split(";")
            if COLOUR.match(p)}


def check_no_color(p: Pane) -> None:
    """Under NO_COLOR the screen has no colour escapes, only bold and reverse video."""
    try:
        p.wait_for(r"GPU1 rtx4090")
        p.wait_for(r"dead\s+unreachable")
        screen = p.screen(escapes=True)
        # The focused line is in reverse video (SGR 7), the header in bold (1).
        params = {x for seq in re.findall(r"\x1b\[([0-9;]*)m", screen) for x in seq.split(";")}
        assert {"1", "7"} <= params, repr(screen)
        assert not colours(screen), repr(screen)
        p.keys("q")
        p.wait_for("EXITED-0")
    finally:
        p.close()


def test_the_screen_shows_gpus_jobs_workspaces_a_dead_server_and_no_color(laptop) -> None:
    blocker = laptop.home / "blocker.sh"
    blocker.write_text("#!/bin/sh\n#MTGPU gpus=nvidia:2 name=blocker\nsleep 300\n")
    small = laptop.home / "small.sh"
    small.write_text("#!/bin/sh\n#MTGPU gpus=nvidia:1 name=small\nsleep 2\necho small done\n")
    plain = Pane(laptop, NO_COLOR="1")  # side by side with the coloured one
    p = Pane(laptop)
    try:
        # The server from ~/.ssh/config with its simulated GPUs, and the one that never
        # answers, with the reason.
        p.wait_for(r"^\s+GPU1 rtx4090\s+\[.*\]\s+\d+\.\d/24\.0G")
        p.wait_for(r"dead\s+unreachable: no answer within 2 s")
        lines = p.screen().splitlines()
        assert len(lines) == 24 and all(len(x) <= 80 for x in lines)
        assert re.search(r"t terminal\s+j submit job", lines[-1])  # keys of the focused line
        assert colours(p.screen(escapes=True))  # colours follow the terminal unless NO_COLOR
        check_no_color(plain)

        # Submit from the keyboard: one job holds both GPUs, so the next waits.
        p.keys("Down")  # from the dead server to the live one
        p.keys("j")
        p.wait_for("Job file to submit on gpu:")
        p.type(str(blocker))
        big = p.wait_for(r"submitted job (\d+)")[1]
        p.wait_for(rf"^\s+{big} blocker\s+RUNNING")
        p.keys("j")
        p.type(str(small))
        little = p.wait_for(rf"submitted job ((?!{big}\b)\d+)")[1]
        p.wait_for(rf"^\s+{little} small\s+PENDING .*#1 Resources")

        # Cancel the running one from the keyboard: the pending one runs, then completes.
        p.keys("Down", "Down", "Down")  # GPU0, GPU1, then the first job
        p.keys("c")
        p.wait_for(rf"Cancel job {big} on gpu\? \(y/n\)")
        p.keys("y")
        p.wait_for(rf"^\s+{big} blocker\s+CANCELLED")
        p.wait_for(rf"^\s+{little} small\s+RUNNING")
        p.wait_for(rf"^\s+{little} small\s+COMPLETED\s+\S+\s+GPU\d\s+exit 0")
        assert "unreachable: no answer within 2 s" in p.screen()  # still listed, still dead

        # A workspace created from the keyboard shows with its state.
        p.keys(*["Up"] * 8, "Down")
        p.keys("n")
        p.wait_for(r"New workspace on gpu")
        p.type("dev busybox")
        p.wait_for(r"^WORKSPACES")
        p.wait_for(r"^ dev\s+RUNNING\s+gpu\s+mtgpu-test:1")

        p.keys("q")
        p.wait_for("EXITED-0")
    finally:
        p.close()
        plain.close()
        laptop.host.rm("dev")
