"""The full screen of remotegpu-cli in a real terminal: tmux runs it (80x24 unless a test
asks for a wider one), send-keys types, capture-pane reads what a user would see. Every
test here shares the package's one server (conftest's ``laptop``)."""

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

    def __init__(self, laptop, *args: str, width: int = 80, **env: str) -> None:
        Pane._count += 1
        self.sock = f"remotegpu-{os.getpid()}-{Pane._count}"
        argv = [sys.executable, "-m", "mtgpu.tui.main", "--timeout", "2", "--interval", "0.5", *args]
        envs = laptop.env(**env)
        command = " ".join(
            f"{k}={shlex.quote(v)}"
            for k, v in envs.items()
            if k in ("HOME", "TERM", "LANG", "NO_COLOR", "PATH", "PYTHONPATH")
        )
        subprocess.run(
            [
                "tmux",
                "-L",
                self.sock,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                str(width),
                "-y",
                "24",
                "-c",
                str(REPO),
                f"env -i {command} {shlex.join(argv)}; echo EXITED-$?; sleep 600",
            ],
            check=True,
            env=envs,
        )

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


#: A GPU line: its utilisation bar, a history of at least three samples, then memory.
GPU_LINE = r"^\s+GPU1 rtx4090\s+\[[█░]+\]\s+\d+%\s+[▁▂▃▄▅▆▇█ ]*[▁▂▃▄▅▆▇█]{3}\s\[[█░]+\]\s+\d+\.\d/24\.0G"
#: No overlay on the screen.
CLOSED = r"\A(?![\s\S]*Esc closes)"
SPARK = r"\d+%\s+[▁▂▃▄▅▆▇█ ]*[▁▂▃▄▅▆▇█]{3}\s\["


def colours(screen: str) -> set[str]:
    return {p for seq in re.findall(r"\x1b\[([0-9;]*)m", screen) for p in seq.split(";") if COLOUR.match(p)}


def check_no_color(p: Pane) -> None:
    """Under NO_COLOR the screen has no colour escapes, only bold and reverse video."""
    try:
        p.wait_for(r"GPU1 rtx4090")
        p.wait_for(r"dead\s+unreachable")
        p.wait_for(SPARK)
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
    blocker.write_text("#!/bin/sh\n#MTGPU gpus=nvidia:2 name=blocker time=30\nsleep 300\n")
    small = laptop.home / "small.sh"
    small.write_text("#!/bin/sh\n#MTGPU gpus=nvidia:1 name=small\nsleep 2\necho small done\n")
    plain = Pane(laptop, NO_COLOR="1")  # side by side with the coloured one
    p = Pane(laptop)
    try:
        # The server from ~/.ssh/config with its simulated GPUs (bars for utilisation and
        # memory, and a history of utilisation), and the one that never answers, with
        # the reason.
        p.wait_for(GPU_LINE)
        p.wait_for(r"dead\s+unreachable: no answer within 2 s")
        lines = p.screen().splitlines()
        assert len(lines) == 24 and all(len(x) <= 80 for x in lines)
        assert re.search(r"s ssh\s+b submit job", " ".join(lines[-2:]))  # keys of the focused line
        assert colours(p.screen(escapes=True))  # colours follow the terminal unless NO_COLOR
        check_no_color(plain)

        # Submit from the keyboard (b, a batch job): one job holds both GPUs, so the
        # next waits. The running one shows how long it has run and has left.
        p.keys("j")  # from the dead server to the live one
        p.keys("b")
        p.wait_for("Job file to submit on gpu:")
        p.type(str(blocker))
        big = p.wait_for(r"submitted job (\d+)")[1]
        p.wait_for(r"^ JOBID NAME\s+STATE\s+NODES\s+GPUS\s+ELAPSED\s+LEFT\s+REASON")
        p.wait_for(rf"^\s+{big} blocker\s+RUNNING\s+testhost\s+0,1\s+\S+\s+\d+m\d\ds")
        p.keys("b")
        p.type(str(small))
        little = p.wait_for(rf"submitted job ((?!{big}\b)\d+)")[1]
        p.wait_for(rf"^\s+{little} small\s+PENDING .*#1 Resources")

        # Enter on the waiting job opens its details: the whole reason, not cut at 80.
        p.keys("j", "j", "j", "j")  # GPU0, GPU1, the running job, the waiting one
        p.keys("Enter")
        p.wait_for(rf"job {little} on gpu")
        detail = p.wait_for(r"reason\s+#1 Resources: (.+)")[1].strip()
        assert len(detail) > 10 and "time left" in p.screen(), p.screen()
        p.keys("Escape")
        p.wait_for(rf"^\s+{little} small\s+PENDING")
        p.keys("k", "k", "k")  # back to GPU0

        # Cancel the running one from the keyboard: the pending one runs, then completes.
        p.keys("Down", "Down")  # GPU1, then the first job
        p.keys("c")
        p.wait_for(rf"Cancel job {big} on gpu\? \(y/n\)")
        p.keys("y")
        p.wait_for(rf"^\s+{big} blocker\s+CANCELLED")
        p.wait_for(rf"^\s+{little} small\s+RUNNING")
        p.wait_for(rf"^\s+{little} small\s+COMPLETED\s+testhost\s+\d\s+\d+s\s+-\s+exit 0")
        assert "unreachable: no answer within 2 s" in p.screen()  # still listed, still dead

        # A workspace created from the keyboard shows with its state.
        p.keys(*["Up"] * 8, "Down")
        # n lists what the server offers first; a refusal is shown whole, not cut.
        p.keys("n")
        p.wait_for(r"New workspace on gpu \(templates: busybox")
        offered = " ".join(p.screen().split())
        assert "(templates: busybox; images: " in offered and "mtgpu-test:1" in offered, offered
        p.type("bad nosuch/image:1")
        p.wait_for(r"refused by the container policy")
        whole = " ".join(p.screen().split())
        assert "your saved images are localhost/mtgpu-saved/NAME" in whole, p.screen()
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


def focused_line(p: Pane, pattern: str, timeout: float = 30) -> str:
    """Wait until the line drawn in reverse video (the focus) matches ``pattern``."""
    deadline = time.time() + timeout
    while True:
        lines = [
            re.sub(r"\x1b\[[0-9;]*m", "", line)
            for line in p.screen(escapes=True).splitlines()
            if re.search(r"\x1b\[[0-9;]*\b7[;m]", line)
        ]
        if lines and re.search(pattern, lines[0]):
            return lines[0]
        if time.time() > deadline:
            raise AssertionError(f"focus is not on {pattern!r} but {lines}:\n{p.screen()}")
        time.sleep(0.1)


def test_j_k_enter_slash_question_mark_and_q(laptop) -> None:
    """The keys of htop, k9s and lazygit: j/k move, Enter shows details, / filters as
    typed (Esc clears), ? lists every key, and q quits at once although a server is
    still connecting (--timeout 600 and a server that never answers)."""
    p = Pane(laptop, "--timeout", "600")
    try:
        p.wait_for(r"GPU1 rtx4090")
        p.wait_for(r"dead\s+connecting")
        focused_line(p, r"dead\s+connecting")
        p.keys("j")
        focused_line(p, r"● gpu\s+lena@")
        p.keys("j")
        focused_line(p, r"GPU0 rtx4090")
        p.keys("k", "k")
        focused_line(p, r"dead\s+connecting")

        p.keys("j", "Enter")
        p.wait_for(r"server gpu\s+\(Esc closes\)")
        p.wait_for(r"reached as\s+ssh ")
        p.wait_for(r"GPU1\s+rtx4090\s+util \d+%")
        p.keys("Escape")
        p.wait_for(CLOSED)

        p.keys("?")
        p.wait_for(r"remotegpu-cli keys")
        screen = p.screen()
        for line in (r"j Down\s+move down", r"/\s+show only lines", r"Enter\s+details", r"s t\s+ssh into"):
            assert re.search(line, screen), screen
        # Longer than the terminal: j scrolls it, as in less.
        assert "forward its ports" not in screen
        p.keys(*["j"] * 12)
        p.wait_for(r"f\s+forward its ports to localhost")
        p.keys("Escape")
        p.wait_for(CLOSED)

        p.keys("/")
        p.tmux("send-keys", "-l", "GPU")  # filtered while typing
        p.wait_for(r"filter: GPU")
        assert "dead" not in p.screen().split("filter: GPU", 1)[1], p.screen()
        assert re.search(r"GPU1 rtx4090", p.screen())
        p.keys("Enter")
        p.wait_for(r"showing lines with 'GPU'")
        p.keys("Escape")
        p.wait_for(r"dead\s+connecting")
        assert "filter:" not in p.screen()

        p.keys("q")
        p.wait_for("EXITED-0")
    finally:
        p.close()


def test_a_wide_terminal_shows_more_columns_and_histories(laptop) -> None:
    job = laptop.home / "wide.sh"
    job.write_text("#!/bin/sh\n#MTGPU gpus=nvidia:1 name=wide-terminal-job time=2:00:00\nsleep 120\n")
    _, out, _ = laptop.host.run("mt-job submit -", input=job.read_bytes())
    jid = re.search(r"(\d+)", out)[1]
    wide, narrow = Pane(laptop, width=170), Pane(laptop)
    try:
        head = wide.wait_for(r"^ JOBID NAME .*$")[0]
        for word in ("SUBMITTED", "CPUS", "RAM", "USER", "REASON"):
            assert word in head, head
        wide.wait_for(
            rf"^\s+{jid} wide-terminal-job\s+RUNNING\s+testhost\s+GPU\d\s+\S+\s+1h\d\dm\s+\S+ ago\s"
        )
        # Memory gets a history of its own beside utilisation's.
        wide.wait_for(
            r"GPU1 rtx4090\s+\[[█░]+\]\s+\d+%\s+[▁-█ ]+\[[█░]+\]\s+\d+\.\d/24\.0G\s+[▁-█ ]*[▁-█]{3}"
        )
        assert max(len(x) for x in wide.screen().splitlines()) > 120
        head80 = narrow.wait_for(r"^ JOBID NAME .*$")[0]
        assert "SUBMITTED" not in head80 and "ELAPSED" in head80 and "LEFT" in head80
        narrow.wait_for(rf"^\s+{jid} wide-termin…\s+RUNNING")
        # Widened, the narrow one lays itself out again.
        narrow.tmux("resize-window", "-x", "170")
        narrow.wait_for(r"^ JOBID NAME .*SUBMITTED")
    finally:
        wide.close()
        narrow.close()
        laptop.host.run(f"mt-job cancel {jid}", ok=False)


def test_s_opens_ssh_and_the_view_comes_back(laptop) -> None:
    """s (ssh, as in k9s) on a server hands the terminal to the system ssh, into the
    tenant's tmux session there; detaching brings the view back."""
    p = Pane(laptop)
    try:
        p.wait_for(r"GPU1 rtx4090")
        p.keys("j")
        focused_line(p, r"● gpu\s+lena@")
        p.keys("s")
        p.wait_for(r"\A(?![\s\S]*SERVERS)")  # the view has given the terminal away
        p.type("echo inside-$((6 * 7))")
        p.wait_for(r"^inside-42")
        p.keys("C-b", "d")  # the server's tmux: detach
        p.wait_for(r"back from gpu \(ssh exited 0\)")
        p.wait_for(r"GPU1 rtx4090")
        p.keys("q")
        p.wait_for("EXITED-0")
    finally:
        p.close()
