"""The README's "Five minutes", run as written against a real daemon.

The host is gpu01 with two simulated rtx4090 cards, as the README's is. Each ``$``
line runs as the README says: ``sudo`` lines as root on the host, ``ssh -p 2222
alice@gpu01 ...`` from "the laptop" (here, a directory with a new key of alice's) with
that ``ssh`` pointed at the host, and ``$ cat FILE`` with the file's lines after it
writes that file on the laptop. The README's first command (the install itself) is
tests/install/test_setup.py's: the daemon here is the installed one. The invite code
and job ids the README shows stand for those the daemon gives; the other output
lines must appear, in order (numbers, spaces and ``...`` standing for any), as
tests/test_manual_commands.py reads them. A command is run again until its output
matches, for up to a minute, as a user who reads the output would (a job's log is
there once the job ran)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from mtgpu_testing import REPO, Host
from test_manual_commands import BIN, Block, blocks, matches_in_order, with_ids

README = REPO / "README.md"
LAPTOP_SSH = "ssh -p 2222 alice@gpu01"
#: The invite code the README shows.
CODE = re.compile(r"Invite code for alice: (\S+)")


def five_minutes() -> list[Block]:
    text = README.read_text()
    start = text.index("\n## Five minutes")
    return blocks(text[start : text.index("\n## ", start + 1)])


@pytest.mark.root
def test_the_readmes_five_minutes_work_as_written(tmp_path: Path) -> None:
    shown_code = CODE.search(README.read_text())
    assert shown_code is not None, "the README shows an invite code"
    host = Host({"SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}]}, name="gpu01")
    host.start()
    try:
        laptop = tmp_path / "laptop"
        laptop.mkdir()
        key = laptop / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        ssh = shlex.join(host.ssh_argv("alice", key))
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MTGPU_CONFIG": str(host.config_path)}
        env.pop("PYTHONPATH", None)
        given = {shown_code.group(1): ""}  # what the README shows -> what the daemon gave
        ids: dict[str, str] = {}
        ran = 0
        for block in five_minutes():
            for step in block.steps:
                command = step.command
                if command.startswith("sudo bin/mtgpu-setup install"):
                    continue
                if re.fullmatch(r"cat \S+", command) and step.output:
                    (laptop / command.split()[1]).write_text("".join(line + "\n" for line in step.output))
                    continue
                for shown, real in given.items():
                    command = command.replace(shown, real or shown)
                command = with_ids(command, ids)
                if command.startswith("sudo "):
                    argv = ["bash", "-c", command.removeprefix("sudo ")]
                else:
                    assert command.startswith(LAPTOP_SSH), f"README.md: who runs `{command}`?"
                    argv = ["bash", "-c", command.replace(LAPTOP_SSH, ssh, 1)]
                expected = [
                    line.replace(shown, real or shown)
                    for line in step.output
                    for shown, real in given.items()
                ]
                deadline = time.monotonic() + 60
                while True:
                    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=laptop, timeout=120)
                    printed = r.stdout.splitlines() + r.stderr.splitlines()
                    if "invite" in command and (m := CODE.search(r.stdout)):
                        given[shown_code.group(1)] = m.group(1)
                        expected = [line.replace(shown_code.group(1), m.group(1)) for line in step.output]
                    missing = matches_in_order(expected, printed, ids)
                    if (r.returncode == 0 and missing is None) or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                where = f"README.md, Five minutes: $ {step.command}"
                assert r.returncode == 0, f"{where}\nexit status {r.returncode}\n{r.stdout}{r.stderr}"
                assert missing is None, f"{where}\nthe README shows {missing!r}; it printed:\n" + "\n".join(
                    printed
                )
                ran += 1
        assert ran >= 5, ran
    finally:
        host.cleanup()
