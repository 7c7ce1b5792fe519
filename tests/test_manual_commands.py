"""The manual's examples, run against a real daemon.

Every ``console`` block in docs/manual.md is preceded by a marker comment:

- ``<!-- example: run as=root -->``: each ``$ COMMAND`` line is run as root on the
  host (``sudo`` dropped), with ``MTGPU_CONFIG`` naming the test host's configuration;
- ``<!-- example: run as=alice -->``: each line is run in the tenant alice's session
  over the real ``ssh``; a line that starts with ``ssh -p 2222 gpu01`` is run from
  "the laptop" (here), with that ``ssh`` pointed at the host, and a line that starts
  with ``sudo`` is run as root on the host, as in a ``run as=root`` block;
- ``<!-- example: not run: REASON -->``: the block needs what one test host has not
  (a cluster, a GPU, podman, a day's history), and the reason says what.

``run`` may add ``check=status``: only the exit status is checked, not the output (a
status page full of pids and host keys). Otherwise each documented output line must
appear, in order, in what the command printed, with every number standing for any
number, runs of spaces for any spaces and ``...`` for anything; ``/etc/mtgpu/mtgpu.yaml``
stands for the host's configuration file. A command exits 0, unless the output shown
for it is its own error line (``mtgpu-server: ...``). A ``$ cat FILE`` line followed
by the file's lines writes that file first (in ``as=alice``, in her home and on "the
laptop", where its ``ssh`` lines run). A job id the manual shows as given (``Submitted
job 12``, or ``12`` alone from ``--parsable``) stands, in the commands after it (in
that block and the later ones: the blocks run in the manual's order, on one daemon),
for the id the daemon gave.

The host is named gpu01 and has two simulated rtx4090 cards, as the manual's are, and
16 CPUs for the scheduler (SIMULATED_CPUS); its file says ``ADMINS: []``, as an
installed one does.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mtgpu_testing import REPO, Host

MANUAL = REPO / "docs" / "manual.md"
MARK = re.compile(r"^<!-- example: (run|not run)(.*?) -->$")
BIN = Path(sys.executable).parent
LAPTOP_SSH = "ssh -p 2222 gpu01"
DEFAULT_CONFIG = "/etc/mtgpu/mtgpu.yaml"


@dataclass
class Step:
    command: str
    output: list[str] = field(default_factory=list)


@dataclass
class Block:
    line: int
    kind: str | None  # "run", "not run", or None: no marker
    options: dict[str, str]
    reason: str
    steps: list[Step]


def blocks(text: str) -> list[Block]:
    """Every ``console`` block of the manual with its marker and its steps."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        start = i + 1
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARK.match(prev.strip())
        kind = m.group(1) if m else None
        rest = m.group(2).strip() if m else ""
        options: dict[str, str] = {}
        reason = ""
        if kind == "not run":
            reason = rest.removeprefix(":").strip()
        else:
            options = dict(w.split("=", 1) for w in rest.split() if "=" in w)
        steps: list[Step] = []
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]  # a block in a list item
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i].removeprefix(indent)
            if line.startswith("$ "):
                steps.append(Step(line[2:]))
            elif steps:
                steps[-1].output.append(line)
            i += 1
        out.append(Block(start, kind, options, reason, steps))
        i += 1
    return out


BLOCKS = blocks(MANUAL.read_text())
RUN = [b for b in BLOCKS if b.kind == "run"]


def test_every_console_example_is_run_or_says_why_not() -> None:
    for b in BLOCKS:
        assert b.kind is not None, (
            f"docs/manual.md:{b.line}: a console block needs a marker before it: "
            "<!-- example: run as=root|alice --> or <!-- example: not run: REASON -->"
        )
        if b.kind == "not run":
            assert len(b.reason) > 10, f"docs/manual.md:{b.line}: say why the example is not run"
        else:
            assert b.options.get("as") in ("root", "alice"), f"docs/manual.md:{b.line}: as=root or as=alice"
            assert b.steps, f"docs/manual.md:{b.line}: no $ command in the block"
    assert len(RUN) >= 6


def pattern(line: str) -> re.Pattern[str]:
    r"""A documented output line as a pattern: numbers, spaces and ``...`` stand for any.

    >>> bool(pattern("  12  train   RUNNING ...").fullmatch("7 train RUNNING 00:00:03 gpu01"))
    True
    """
    parts = []
    for tok in re.findall(r"\.\.\.|[0-9]+|\s+|[^0-9\s.]+|\.", line.strip()):
        if tok == "...":
            parts.append(".*")
        elif tok.isdigit():
            parts.append("[0-9]+")
        elif tok.isspace():
            parts.append(r"\s+")
        else:
            parts.append(re.escape(tok))
    return re.compile("".join(parts))


def matches_in_order(expected: list[str], actual: list[str], ids: dict[str, str] | None = None) -> str | None:
    """None if each expected line matches an actual line, in order; else the first that does not.

    A job id the manual shows as given (``Submitted job 12``, ``Submitted batch job
    12``, or ``12`` alone, as ``--parsable`` prints it) is recorded in ``ids`` with the
    id the daemon gave, for the later commands.
    """
    rest = iter(line.strip() for line in actual)
    for want in expected:
        p = pattern(want)
        got = next((got for got in rest if p.fullmatch(got)), None)
        if got is None:
            return want
        given = re.fullmatch(r"(?:Submitted (?:batch )?job )?([0-9]+)", want.strip())
        if given is not None and ids is not None:
            ids[given.group(1)] = re.findall(r"[0-9]+", got)[-1]
    return None


def with_ids(command: str, ids: dict[str, str]) -> str:
    """The command with each job id the manual shows replaced by the one the daemon gave."""
    return re.sub(r"(?<![\w.])[0-9]+(?![\w.])", lambda m: ids.get(m.group(0), m.group(0)), command)


@pytest.fixture(scope="module")
def gpu01(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path, Path]]:
    config = {
        "SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}],
        "SIMULATED_CPUS": 16,
        "ADMINS": [],
    }
    host = Host(config, name="gpu01")
    host.start()
    try:
        key = host.add_user("alice")
        work = tmp_path_factory.mktemp("manual")
        yield host, key, work
    finally:
        host.cleanup()


def _run(block: Block, step: Step, host: Host, key: Path, work: Path) -> subprocess.CompletedProcess[str]:
    config = str(host.config_path)
    command = step.command.replace(DEFAULT_CONFIG, config)
    if block.options["as"] == "root" or command.startswith("sudo "):
        command = command.removeprefix("sudo ")
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MTGPU_CONFIG": config, "COLUMNS": "100"}
        env.pop("PYTHONPATH", None)
        return subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, env=env, cwd=work, timeout=120
        )
    if LAPTOP_SSH in command:
        ssh = shlex.join(host.ssh_argv("alice", key))
        argv = ["bash", "-c", command.replace(LAPTOP_SSH, ssh, 1)]
        return subprocess.run(argv, capture_output=True, text=True, cwd=work, timeout=120)
    r = host.ssh("alice", key, command, timeout=120)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def _write(block: Block, step: Step, host: Host, key: Path, work: Path) -> None:
    """``$ cat FILE`` with the file's lines after it: make that file."""
    name = step.command.split()[1]
    body = "".join(line + "\n" for line in step.output)
    (work / name).write_text(body)
    if block.options["as"] == "root":
        return
    r = host.ssh("alice", key, f"cat > {shlex.quote(name)}", input=body.encode(), timeout=120)
    assert r.returncode == 0, r.stderr


def settle(host: Host, timeout: float = 15) -> None:
    """Wait until no GPU without a job shows VRAM in use: the host's measured use (taken
    every USAGE_SAMPLE_INTERVAL) has caught up with the jobs the blocks before ended, as
    it has for someone who reads the text between two examples."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = host.api("nodes")["result"]
        if all(g["vram_used"] == 0 for n in nodes for g in n["gpus"] if not g["jobs"]):
            return
        time.sleep(0.2)


#: The job ids the manual showed as given, with those the daemon gave: a block goes on
#: with the jobs of the blocks before it (the examples run in the manual's order).
JOB_IDS: dict[str, str] = {}


@pytest.mark.root
@pytest.mark.parametrize("block", RUN, ids=[f"manual.md:{b.line}" for b in RUN])
def test_the_manual_example_works_as_shown(block: Block, gpu01: tuple[Host, Path, Path]) -> None:
    host, key, work = gpu01
    settle(host)
    ids = JOB_IDS
    for step in block.steps:
        if re.fullmatch(r"cat \S+", step.command) and step.output:
            _write(block, step, host, key, work)
            continue
        r = _run(block, Step(with_ids(step.command, ids)), host, key, work)
        where = f"docs/manual.md:{block.line}: $ {step.command}"
        printed = r.stdout.splitlines() + r.stderr.splitlines()
        program = step.command.removeprefix("sudo ").split()[0]
        own_error = bool(step.output) and step.output[0].startswith(f"{program}: ")
        assert r.returncode == 0 or own_error, f"{where}\nexit status {r.returncode}\n{r.stdout}{r.stderr}"
        if block.options.get("check") == "status":
            continue
        expected = [line.replace(DEFAULT_CONFIG, str(host.config_path)) for line in step.output]
        missing = matches_in_order(expected, printed, ids)
        assert missing is None, f"{where}\nthe manual shows {missing!r}; it printed:\n" + "\n".join(printed)
