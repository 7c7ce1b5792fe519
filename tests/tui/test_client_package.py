"""The laptop package: ``clients/remotegpu`` installs into a clean virtualenv without any
of the server's dependencies, and its remotegpu-cli talks to a real server."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
CLIENT = REPO / "clients" / "remotegpu"
SERVER_ONLY = {"psutil", "nvidia-ml-py", "amdsmi", "libtmux", "pysyncobj", "filelock"}
#: What the client's modules may import besides the standard library.
ALLOWED = {
    "asyncssh",
    "cryptography.utils",  # asyncssh's own dependency: mtgpu/__init__ quiets its deprecations
    "yaml",
    "urwid",
    "tabulate",
    "mtgpu.errors",
    "mtgpu.text",
    "mtgpu.cmdline",
    "mtgpu.proc",
    "mtgpu.jobstate",
    "mtgpu.jsonl",
    "mtgpu.tui",
}
#: Calls that do not exist on Windows.
POSIX_ONLY = {
    "fcntl",
    "termios",
    "pwd",
    "grp",
    "resource",
    "tty",
    "pty",
    "getuid",
    "geteuid",
    "getgid",
    "fork",
    "setsid",
    "killpg",
    "SIGWINCH",
    "SIGHUP",
    "SIGKILL",
    "tzset",
}


def client_modules() -> list[Path]:
    return sorted((REPO / "mtgpu" / "tui").glob("*.py")) + [
        REPO / "mtgpu" / "errors.py",
        REPO / "mtgpu" / "text.py",
        REPO / "mtgpu" / "cmdline.py",  # --help's examples and --version
        REPO / "mtgpu" / "proc.py",  # the process helper (ssh)
        REPO / "mtgpu" / "jobstate.py",  # the job states the screen shows
        REPO / "mtgpu" / "jsonl.py",  # the API's JSON lines
        REPO / "mtgpu" / "__init__.py",
    ]


def test_the_client_imports_nothing_of_the_server_and_nothing_posix_only() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in client_modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert (
                    (top in stdlib and top not in POSIX_ONLY)
                    or top == "__future__"
                    or name == "mtgpu"  # the package's own __init__ (its version), shipped too
                    or (
                        path.name == "cmdline.py" and name == "mtgpu.scripts"
                    )  # only its parsers(), for tests
                    or any(name == a or name.startswith(a + ".") for a in ALLOWED)
                ), f"{path.name}: {name}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in POSIX_ONLY, f"{path.name}:{node.lineno}: {node.attr}"


def _wheelhouse() -> Path:
    """The client's dependencies as wheels, downloaded once and kept between runs."""
    deps = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"]
    want = sorted([*deps, "setuptools>=64"])
    tag = hashlib.sha256(json.dumps(want).encode()).hexdigest()[:12]
    d = Path.home() / ".cache" / "mtgpu-tests" / f"remotegpu-wheels-{tag}"
    if not (d / "complete").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(d), *want],
            check=True,
            capture_output=True,
            timeout=300,
        )
        (d / "complete").write_text("\n".join(want))
    return d


@pytest.mark.root
@pytest.mark.podman
def test_a_clean_venv_gets_only_the_client_and_it_reads_a_real_server(laptop, tmp_path) -> None:
    wheels = _wheelhouse()
    # A copy of just what the client distribution packs, so no build output lands in
    # the checkout (the layout is the repository's: clients/remotegpu and mtgpu/).
    src = tmp_path / "src"
    shutil.copytree(CLIENT, src / "clients" / "remotegpu", ignore=shutil.ignore_patterns("build"))
    shutil.copytree(
        REPO / "mtgpu" / "tui", src / "mtgpu" / "tui", ignore=shutil.ignore_patterns("__pycache__")
    )
    for f in ("__init__.py", "errors.py", "text.py", "cmdline.py", "proc.py", "jobstate.py", "jsonl.py"):
        shutil.copy(REPO / "mtgpu" / f, src / "mtgpu" / f)
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(wheels),
            str(src / "clients" / "remotegpu"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    site = next(venv.glob("lib/python3*/site-packages"))
    names = {d.name.split("-")[0].lower() for d in site.glob("*.dist-info")}
    assert {"remotegpu", "asyncssh", "urwid", "pyyaml"} <= names
    assert not names & {n.replace("-", "_") for n in SERVER_ONLY} and "mtgpu" not in names
    files = sorted(str(p.relative_to(venv)) for p in venv.rglob("mtgpu/**/*.py"))
    assert not [
        f
        for f in files
        if "/tui/" not in f
        and not f.endswith(
            ("__init__.py", "errors.py", "text.py", "cmdline.py", "proc.py", "jobstate.py", "jsonl.py")
        )
    ]

    job = tmp_path / "probe.sh"
    job.write_text("#!/bin/sh\n#MTGPU name=probe\ntrue\n")
    laptop.host.run("mt-job submit -", input=job.read_bytes())
    runs = {
        args: subprocess.Popen(
            [str(venv / "bin" / "remotegpu-cli"), "--timeout", "1", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=laptop.env(),
            cwd=tmp_path,
        )
        for args in (("servers", "--json"), ("jobs", "--all", "--json"), ("servers",))
    }
    out = {}
    for args, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=60)
        out[args] = (proc.returncode, stdout, stderr)

    rc, stdout, stderr = out[("servers", "--json")]
    assert rc == 0, stderr
    by = {s["name"]: s for s in json.loads(stdout)}
    assert set(by) == {"gpu", "dead"}
    assert by["gpu"]["status"] == "up" and by["gpu"]["user"] == "lena"
    assert [g["type"] for g in by["gpu"]["gpus"]] == ["rtx4090", "rtx4090"]
    assert by["dead"]["status"] == "unreachable"
    assert by["dead"]["reason"] == "no answer within 1 s"

    rc, stdout, stderr = out[("jobs", "--all", "--json")]
    assert rc == 0, stderr
    jobs = json.loads(stdout)
    assert "probe" in [j["name"] for j in jobs]
    assert all(j["server"] == "gpu" and j["user"] == "lena" for j in jobs)
    assert "remotegpu-cli: dead: no answer within 1 s" in stderr

    rc, stdout, stderr = out[("servers",)]
    assert rc == 0 and "2x rtx4090 24.0G" in stdout, stdout + stderr
