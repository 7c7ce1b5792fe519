"""Podman as the tenant, under the host's container policy: what ``mt-podman`` and the
``docker`` shim run (:mod:`mtgpu.cli.podman`, :mod:`mtgpu.workspaces.shim`).

MTGPU also links this program as ``podman`` first on tenants' PATH, so a tenant
who types plain ``podman`` meets the same policy. It asks the daemon for the policy
(``workspace.policy``: the home, the datasets, the GPUs the tenant holds here, the
port policy), checks the command line with :func:`mtgpu.workspaces.policy.check_podman`,
and then *execs* the real podman with ``XDG_RUNTIME_DIR`` set, so podman owns the
terminal and its exit status is the command's. A refusal names the rule and exits
125, podman's own status for an error in podman.

``mt-podman --rules`` prints the rules as they apply to the caller.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

REFUSED = 125


def _client() -> Any:
    from mtgpu.api.client import ApiClient, socket_path_from_config

    path = os.environ.get("MTGPU_API_SOCKET") or socket_path_from_config(None)
    return ApiClient(path)


def podman_env(policy: dict[str, Any]) -> dict[str, str]:
    """The caller's environment for podman: its runtime directory, its container store
    (local on this member with CONTAINERS.storage), and no config swap."""
    env = dict(os.environ)
    # CONTAINERS_CONF would replace every containers.conf, the policy hook's included.
    env.pop("CONTAINERS_CONF", None)
    if policy.get("runtime_dir"):
        env["XDG_RUNTIME_DIR"] = policy["runtime_dir"]
    if policy.get("storage_conf"):
        env["CONTAINERS_STORAGE_CONF"] = policy["storage_conf"]
    elif "runtime_dir" in policy:  # the daemon answered: the store is the home
        env.pop("CONTAINERS_STORAGE_CONF", None)
    return env


#: Commands that create nothing and run nothing new; they work while the daemon is down.
READ_ONLY = frozenset(
    {
        "ps",
        "images",
        "inspect",
        "logs",
        "version",
        "info",
        "port",
        "top",
        "stats",
        "events",
        "stop",
        "kill",
        "rm",
        "rmi",
        "diff",
        "history",
        "help",
        "--help",
        "--version",
        "-v",
    }
)


def read_only(argv: Sequence[str]) -> bool:
    """True if ``argv`` (after ``podman``) only looks at or removes things.

    >>> read_only(["ps", "-a"]), read_only(["container", "ls"]), read_only(["run", "x"])
    (True, True, False)
    """
    words = [a for a in argv if not a.startswith("-")] or list(argv[:1])
    if not words:
        return True
    if words[0] in ("container", "image", "pod", "volume", "network") and len(words) > 1:
        return words[1] in READ_ONLY | {"ls", "list", "exists", "prune"}
    return words[0] in READ_ONLY


def run_podman(argv: Sequence[str], prog: str = "mt-podman") -> int:
    """Check ``argv`` against the caller's policy and exec podman; returns only on refusal."""
    from mtgpu.errors import ApiError
    from mtgpu.workspaces.podman import real_podman
    from mtgpu.workspaces.policy import check_podman, describe_rules
    from mtgpu.workspaces.types import Policy, PolicyRefusal

    try:
        pol = _client().call("workspace.policy")
    except ApiError as exc:
        if read_only(argv):  # nothing is created: podman may answer without the policy
            binary = real_podman()
            os.execve(binary, [binary, *argv], podman_env({}))
        print(f"{prog}: cannot get the container policy from MTGPU: {exc}", file=sys.stderr)
        return REFUSED
    if not pol.get("enabled"):
        print(
            f"{prog}: containers are off on this host (CONTAINERS.enabled is false); ask an admin",
            file=sys.stderr,
        )
        return REFUSED
    policy = Policy.from_dict(pol)
    if list(argv[:1]) == ["--rules"]:
        print(describe_rules(policy))
        return 0
    try:
        checked = check_podman(argv, policy, cwd=os.getcwd(), realpath=os.path.realpath)
    except PolicyRefusal as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return REFUSED
    binary = pol.get("podman") or "podman"
    try:
        os.execve(binary, [binary, *checked], podman_env(pol))
    except OSError as exc:
        print(f"{prog}: cannot run {binary}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execve does not return
