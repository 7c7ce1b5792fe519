"""The package's layers, as DESIGN.md draws them: imports point down.

Every ``import`` in ``mtgpu/`` (at the top of a module or inside a function) is read
from the source, so a shortcut added later fails here with the line that adds it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mtgpu"

#: Top to bottom. A module may import its own part, anything in a lower layer, and
#: nothing above it.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"server", "install"}),  # wiring at start; the installer beside it
    frozenset({"sshd"}),
    frozenset({"gateway", "cli", "tui"}),  # the CLIs and the TUI know the API's client
    frozenset({"api"}),
    frozenset({"workspaces"}),
    frozenset({"schedd", "tmux"}),
    frozenset({"accounts"}),
    frozenset(
        {
            "state",
            "cluster",
            "gpuinfo",
            "config",
            "errors",
            "proc",
            "aio",
            "clock",
            "fsafe",
            "text",
            "cmdline",
            "logsetup",
            "lograte",
            "scripts",
            "data",
            "jobstate",  # job states: the scheduler, the CLIs, the API and remotegpu-cli read them
            "jobspec",  # what a job asked for and where it went: the state codec stores them
            "jsonl",  # the API's JSON lines: the daemon, the tools, remotegpu-cli and peers
            "",
        }
    ),
)

#: Programs a tenant runs, which live with the part whose tool they drive (tmux,
#: podman's hook) and talk to the daemon through the API's client library only.
CLIENT = "mtgpu.api.client"
CLIENT_USERS = frozenset({"mtgpu.tmux.attach", "mtgpu.workspaces.hook", "mtgpu.workspaces.tenant_podman"})

#: Shortcuts that once existed, named so that their return says what it is.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    (
        "mtgpu.cluster",
        "mtgpu.api",
        "the cluster registers no API operations itself (mtgpu/api/cluster.py does, on the API's side)",
    ),
    (
        "mtgpu.workspaces",
        "mtgpu.cli",
        "a CLI only parses and prints; what the shim "
        "shares with mt-podman lives in mtgpu.workspaces.tenant_podman",
    ),
    (
        "mtgpu.cli",
        "mtgpu.tmux",
        "the CLIs know only the API's client; the tenant's tmux is driven by mtgpu.tmux.attach (mt-attach)",
    ),
    ("mtgpu.state", "mtgpu.cluster", "the replicated store is handed its transport"),
    ("mtgpu.gpuinfo", "mtgpu.schedd", "probes never import the scheduler"),
    ("mtgpu.cli", "mtgpu.install", "the CLIs do not reach into the installer"),
)


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache
def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every mtgpu import in mtgpu/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = _module(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from mtgpu.api import cluster` imports the module mtgpu.api.cluster.
                targets = [
                    f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names
                ]
            else:
                continue
            found += [(mod, t, node.lineno) for t in targets if t == "mtgpu" or t.startswith("mtgpu.")]
    return found


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _layer(module: str) -> int:
    part = _part(module)
    for i, parts in enumerate(LAYERS):
        if part in parts:
            return i
    raise AssertionError(
        f"{module}: part {part!r} is in no layer of tests/test_layers.py; "
        "place it where DESIGN.md's layers put it"
    )


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_scan_sees_the_known_imports() -> None:
    """The scanner itself: it finds imports at the top, inside functions and relative."""
    found = {(a, b) for a, b, _ in imports()}
    assert ("mtgpu.server", "mtgpu.api.cluster") in found
    assert ("mtgpu.cli.podman", "mtgpu.workspaces.tenant_podman") in found
    assert ("mtgpu.install.setup", "mtgpu.sshd.server") in found  # inside a function
    assert len(found) > 300


def test_every_part_has_a_layer() -> None:
    for importer, target, _ in imports():
        _layer(importer)
        _layer(target)


def test_imports_point_down() -> None:
    wrong = []
    for importer, target, line in imports():
        if _layer(target) >= _layer(importer) or _part(target) == _part(importer):
            continue
        if _within(target, CLIENT) and importer in CLIENT_USERS:
            continue
        wrong.append(f"mtgpu/{importer.replace('.', '/')}.py:{line} imports {target}")
    assert not wrong, "imports that point up the layers (DESIGN.md, Layout):\n" + "\n".join(wrong)


@pytest.mark.parametrize(("importer", "target", "why"), FORBIDDEN, ids=[f"{a}->{b}" for a, b, _ in FORBIDDEN])
def test_no_shortcut(importer: str, target: str, why: str) -> None:
    wrong = [
        f"{a}:{line} imports {b}" for a, b, line in imports() if _within(a, importer) and _within(b, target)
    ]
    assert not wrong, f"{importer} must not import {target}: {why}\n" + "\n".join(wrong)


#: What starts a process, outside mtgpu/proc.py. ``os.execve`` is not here: it
#: replaces the process that calls it (a session's forced command becoming the shell).
STARTERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}


def _bypasses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in STARTERS:
            found += [(node.lineno, a.name) for a in node.names if a.name in STARTERS[node.module]]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if isinstance(f.value, ast.Name) and f.attr in STARTERS.get(f.value.id, ()):
                found.append((node.lineno, f"{f.value.id}.{f.attr}"))
    return sorted(found)


def test_every_process_starts_through_the_process_helper() -> None:
    """Each command MTGPU runs is logged, takes an argv list and maps a missing program
    or a timeout to one error (mtgpu/proc.py); a call that bypasses it fails here."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != PACKAGE / "proc.py":
            rel = path.relative_to(PACKAGE.parent)
            wrong += [
                f"{rel}:{line} {what}" for line, what in _bypasses(ast.parse(path.read_text(), str(path)))
            ]
    assert not wrong, "processes started around mtgpu.proc:\n" + "\n".join(wrong)


def test_the_process_check_sees_each_form_of_a_bypass() -> None:
    src = (
        "import subprocess, os, asyncio\n"
        "from subprocess import Popen\n"
        "subprocess.run(['x'])\n"
        "os.system('x')\n"
        "asyncio.create_subprocess_exec('x')\n"
        "p: subprocess.Popen[bytes]\n"  # a type, not a start
    )
    assert _bypasses(ast.parse(src)) == [
        (2, "Popen"),
        (3, "subprocess.run"),
        (4, "os.system"),
        (5, "asyncio.create_subprocess_exec"),
    ]
