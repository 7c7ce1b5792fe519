"""The operating-system packages MTGPU needs, and installing them where a mirror answers.

Standard library only: the first stage of ``mtgpu-setup install`` runs it with the
system Python. Commands are looked for under a host root: ``/`` on a real host, a
stand-in directory in tests (``MTGPU_HOST_ROOT``); packages are installed only
into ``/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtgpu.proc import run


@dataclass(frozen=True)
class OsPackage:
    """A Debian/Ubuntu package, the command that shows it is there, and what needs it."""

    command: str
    package: str
    required: bool  # MTGPU cannot work at all without it
    without: str  # what does not work without it


#: iproute2 and iptables: optional only where TENANT_NETWORK is shared.
PRIVATE_NETWORK = (
    "tenants' logins and jobs under the default TENANT_NETWORK: private (each tenant's own "
    "network): they are refused, never run in the host's network; TENANT_NETWORK: shared does without"
)
OS_PACKAGES = (
    OsPackage("tmux", "tmux", True, "terminals: an interactive ssh login runs in the tenant's tmux"),
    OsPackage("sftp-server", "openssh-sftp-server", True, "sftp, scp and VS Code Remote-SSH"),
    OsPackage("setsid", "util-linux", True, "tenants' commands and jobs in sessions of their own"),
    OsPackage("useradd", "passwd", True, "tenant accounts, created on first login"),
    OsPackage("newuidmap", "uidmap", False, "container workspaces (rootless podman maps subordinate IDs)"),
    OsPackage("podman", "podman", False, "container workspaces (CONTAINERS.enabled)"),
    OsPackage("ip", "iproute2", False, PRIVATE_NETWORK),
    OsPackage("iptables", "iptables", False, PRIVATE_NETWORK),
    # The C fast paths: mt-job's submit and list (fastjob.c) and the job-start
    # helper (jobinit.c). Without them MTGPU works, only slower.
    OsPackage(
        "cc",
        "gcc",
        False,
        "the C fast paths (mt-job submit/list, the job-start helper): the Python ones are used, slower",
    ),
)
VENV = OsPackage("venv", "python3-venv", True, "building MTGPU's virtualenv")


def host_root() -> Path:
    """The root of the host being set up: ``/``, or a stand-in directory in tests."""
    return Path(os.environ.get("MTGPU_HOST_ROOT") or "/")


def have(command: str, root: Path | None = None) -> bool:
    root = root or host_root()
    if command == "sftp-server":
        return any(
            (root / p).exists() for p in ("usr/lib/openssh/sftp-server", "usr/libexec/openssh/sftp-server")
        )
    if str(root) == "/" and shutil.which(command) is not None:
        return True
    return any((root / d / command).exists() for d in ("usr/local/bin", "usr/bin", "bin", "usr/sbin", "sbin"))


def containers_enabled(config: Path) -> bool:
    try:
        import yaml  # Debian's python3-yaml; without it podman is not asked for

        raw = yaml.safe_load(config.read_text()) or {}
    except Exception:  # noqa: BLE001 - the first stage must not fail on this
        return False
    c = raw.get("CONTAINERS") if isinstance(raw, dict) else None
    return isinstance(c, dict) and c.get("enabled") is True


def missing(config: Path, *, python: str, venv_check: str, containers: bool | None = None) -> list[OsPackage]:
    """What this host lacks (podman only where the configuration turns workspaces on:
    ``containers``, or read from ``config`` where PyYAML is there to read it)."""
    root = host_root()
    if containers is None:
        containers = containers_enabled(config)
    wanted = [p for p in OS_PACKAGES if p.command != "podman" or containers]
    out = [p for p in wanted if not have(p.command, root)]
    if run([python, "-c", venv_check], check=False).returncode != 0:
        out.append(VENV)
    return out


def ensure(
    config: Path,
    *,
    skip: bool,
    python: str,
    venv_check: str,
    say: Callable[[str], None],
    containers: bool | None = None,
) -> tuple[list[OsPackage], str]:
    """Install what is missing with apt-get where it can; return what is still missing
    and why it could not be installed."""
    lacking = missing(config, python=python, venv_check=venv_check, containers=containers)
    if not lacking:
        return [], ""
    if skip:
        return lacking, "--skip-os-packages: not installing them"
    if str(host_root()) != "/":
        return lacking, f"packages are not installed into a host root other than / ({host_root()})"
    if shutil.which("apt-get") is None:
        return lacking, "there is no apt-get on this host"
    pkgs = [p.package for p in lacking]
    say(f"installing OS packages: {', '.join(pkgs)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", *pkgs]
    proc = run(argv, env=env, check=False, timeout=None)
    if proc.returncode != 0:
        run(["apt-get", "update", "-q"], env=env, check=False, timeout=None)
        proc = run(argv, env=env, check=False, timeout=None)
    last = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    why = f"apt-get could not install them (no package mirror answered: {last[-1] if last else 'no output'})"
    return missing(config, python=python, venv_check=venv_check, containers=containers), why
