"""Every process that runs with a tenant's UID starts through one function.

``TenantFence.prefix`` (mtgpu/schedd/fence.py) puts a tenant's program in its session
cgroup, private mount namespace and network namespace before it becomes the tenant;
the job supervisor does the same for jobs in the job's own cgroups. This test reads
the source and fails on any other place that changes identity or starts a process
with another user's identity (``setpriv``, ``runuser``, ``su``, a ``user=`` given to
the process helpers of mtgpu.proc, ``os.set*uid``): a new one must go through the
fence, or be added below with the reason it is not a tenant's process.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mtgpu_testing import REPO

#: Identity changes that are not a tenant's program outside its fence, each with why.
ALLOWED = {
    ("mtgpu/schedd/fence.py", "str:setpriv"): "TenantFence.prefix and fenced_argv themselves, the tool "
    "lookup and report",
    ("mtgpu/schedd/netns.py", "str:setpriv"): "the list of tools a private network needs (a lookup)",
    (
        "mtgpu/schedd/supervisor.py",
        "call:setgroups",
    ): "the job supervisor, in the job's own cgroups and namespaces",
    (
        "mtgpu/schedd/supervisor.py",
        "call:setresuid",
    ): "the job supervisor, in the job's own cgroups and namespaces",
    ("mtgpu/gateway/spawn.py", "user"): "spawn_as and connect_as without a fence: a daemon that is not root",
    ("mtgpu/accounts/published.py", "user"): "probes a published interpreter as nobody, not a tenant",
    ("mtgpu/server.py", "user"): "reads a local account's authorized_keys as that account (not a tenant)",
    ("mtgpu/schedd/fence.py", "str:--reuid"): "TenantFence.prefix itself",
    ("mtgpu/workspaces/storage.py", "user"): "probes podman's storage as nobody, not a tenant",
}
#: Calls that start processes; a ``user=`` to any other call is a field, not an identity.
STARTERS = {"run", "arun", "spawn", "aspawn", "call", "Popen", "create_subprocess_exec"}
MODULES = {"subprocess", "asyncio", "proc", "os"}
IDENTITY_CALLS = {"setuid", "setresuid", "setreuid", "seteuid", "setgroups", "initgroups"}
TOOLS = {"setpriv", "runuser", "su", "--reuid"}


def _changes(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.split("=", 1)[0]
            if word in TOOLS:
                found.add(f"str:{word}")
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"user", "group"} <= keys:
                found.add("user")  # kwargs made to be splatted into a process helper
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in IDENTITY_CALLS:
                found.add(f"call:{name}")
            direct = isinstance(fn, ast.Name) or (
                isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id in MODULES
            )
            if name in STARTERS and direct and any(kw.arg == "user" for kw in node.keywords):
                found.add("user")
            if name == "dict" and any(kw.arg == "user" for kw in node.keywords):
                found.add("user")
    return found


def test_no_process_runs_as_a_tenant_outside_the_fence() -> None:
    seen = set()
    for path in sorted((REPO / "mtgpu").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for change in _changes(ast.parse(path.read_text())):
            seen.add((rel, change))
    unexpected = sorted(seen - set(ALLOWED))
    assert not unexpected, f"start these through TenantFence.prefix (or say why not in ALLOWED): {unexpected}"
    assert not set(ALLOWED) - seen, f"no longer there, remove from ALLOWED: {sorted(set(ALLOWED) - seen)}"


def test_the_guard_sees_each_kind_of_identity_change() -> None:
    code = """
import os
run(["id"], user=1000)
argv = ["setpriv", "--reuid=1000"]
os.setresuid(1, 1, 1)
kw = {"user": 1, "group": 1}
"""
    assert _changes(ast.parse(code)) == {"user", "str:setpriv", "str:--reuid", "call:setresuid"}
    assert _changes(ast.parse("Record(user='ann')\nx = {'user': 'ann'}")) == set()


def test_connect_as_takes_the_fence_not_a_namespace_of_its_own() -> None:
    text = (REPO / "mtgpu" / "gateway" / "spawn.py").read_text()
    assert "--reuid" not in text and "nsenter" not in text.split("def connect_as", 1)[1]
    assert Path(REPO / "mtgpu" / "schedd" / "fence.py").read_text().count("def prefix(") == 1
