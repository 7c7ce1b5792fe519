"""The container runtime back end: rootless podman, always run as the tenant.

:class:`ContainerRuntime` is the contract the workspace service calls; :class:`Podman`
implements it by running ``podman`` through :func:`mtgpu.proc.run` with the tenant's
uid, gid and groups, a clean environment (``HOME``, ``XDG_RUNTIME_DIR``) and the home
as working directory. Nothing here runs podman as root. A failure is raised as
:class:`~mtgpu.workspaces.types.PodmanError` with podman's own error line.

Every method blocks; the daemon calls them in a thread.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mtgpu.errors import CommandError, MtgpuError
from mtgpu.proc import run
from mtgpu.workspaces.types import LABEL, PodmanError, Tenant, WorkspaceError

log = logging.getLogger("mtgpu.workspaces")

#: Where the real podman is looked for; MTGPU's own ``podman`` (the policy wrapper in
#: ``RUN_DIR/bin``) is never on this path.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def real_podman(path: str = SYSTEM_PATH) -> str:
    """The podman binary itself, never a wrapper that would call back into MTGPU."""
    for d in path.split(":"):
        cand = os.path.join(d, "podman")
        if os.access(cand, os.X_OK) and not os.path.realpath(cand).endswith(("/mt-podman", ".py")):
            return cand
    return "podman"


def tenant_env(tenant: Tenant, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment podman runs with for ``tenant``."""
    env = {
        "HOME": tenant.home,
        "USER": tenant.name,
        "LOGNAME": tenant.name,
        "PATH": SYSTEM_PATH,
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": tenant.runtime_dir,
    }
    if tenant.storage_conf:
        env["CONTAINERS_STORAGE_CONF"] = tenant.storage_conf
    env.update(extra or {})
    return env


class ContainerRuntime:
    """What workspaces need from a container engine, done as the tenant.

    ``name`` is a container name. Every method raises
    :class:`~mtgpu.workspaces.types.PodmanError` (or a subclass of
    :class:`~mtgpu.workspaces.types.WorkspaceError`) on failure.
    """

    def containers(self, tenant: Tenant) -> list[dict[str, Any]]:
        """The tenant's workspace containers: ``name``, ``state``, ``ports``, ``labels``, ``image``."""
        raise NotImplementedError

    def image_exists(self, tenant: Tenant, image: str) -> bool:
        raise NotImplementedError

    def load(self, tenant: Tenant, archive: str) -> None:
        """Load an image archive into the tenant's image store."""
        raise NotImplementedError

    def pull(self, tenant: Tenant, image: str) -> None:
        raise NotImplementedError

    def build(self, tenant: Tenant, argv: Sequence[str], cwd: str) -> None:
        """Build an image (a devcontainer.json's ``build``)."""
        raise NotImplementedError

    def create(self, tenant: Tenant, argv: Sequence[str]) -> None:
        """``argv`` is a whole ``create ...`` command line from the policy's builder."""
        raise NotImplementedError

    def run_tool(self, tenant: Tenant, argv: Sequence[str]) -> None:
        """Run another container tool as the tenant (the ``devcontainer`` CLI)."""
        raise NotImplementedError

    def start(self, tenant: Tenant, name: str) -> None:
        raise NotImplementedError

    def stop(self, tenant: Tenant, name: str) -> None:
        raise NotImplementedError

    def remove(self, tenant: Tenant, name: str) -> None:
        raise NotImplementedError

    def commit(self, tenant: Tenant, name: str, image: str) -> str:
        raise NotImplementedError

    def logs(self, tenant: Tenant, name: str, tail: int) -> str:
        raise NotImplementedError

    def exec(
        self, tenant: Tenant, name: str, argv: Sequence[str], user: str = "", timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError


class Podman(ContainerRuntime):
    """Rootless podman as the tenant."""

    def __init__(
        self, binary: str | None = None, *, tenant_netns: Callable[[int], str | None] | None = None
    ) -> None:
        self.binary = binary or real_podman()
        #: Given a uid, the file of the tenant's private network namespace
        #: (TENANT_NETWORK: private), None where tenants share the host's. Podman runs
        #: in it, so a workspace's published ports are on the tenant's own loopback,
        #: where the tenant's sessions and ``ssh -L`` reach them, as with mt-podman.
        self.tenant_netns = tenant_netns

    def argv(self, *args: str) -> list[str]:
        return [self.binary, *args]

    def run(
        self,
        tenant: Tenant,
        *args: str,
        timeout: float = 120,
        check: bool = True,
        what: str = "",
        argv: Sequence[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS`` (or ``argv``) as ``tenant``; raise PodmanError with its message."""
        if tenant.uid == 0:
            raise PodmanError(["podman", *args], "workspaces never run podman as root")
        argv = list(argv) if argv is not None else self.argv(*args)
        kw: dict[str, Any] = {}
        cwd = tenant.home if os.path.isdir(tenant.home) else "/"
        try:
            netns = self.tenant_netns(tenant.uid) if self.tenant_netns and os.geteuid() == 0 else None
        except MtgpuError as exc:  # FenceError: never run podman in the host's network instead
            raise WorkspaceError(f"{what + ': ' if what else ''}{exc}") from exc
        if netns:
            # nsenter joins the namespace as root, setpriv becomes the tenant, and only
            # then does the tenant's shell change into the home.
            groups = ",".join(map(str, tenant.groups))
            nsenter = shutil.which("nsenter", path="/usr/bin:/bin") or "/usr/bin/nsenter"
            setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"
            argv = [
                nsenter,
                f"--net={netns}",
                "--",
                setpriv,
                f"--reuid={tenant.uid}",
                f"--regid={tenant.gid}",
                f"--groups={groups}" if groups else "--clear-groups",
                "--",
                "/bin/sh",
                "-c",
                'cd -- "$0" 2>/dev/null || cd /; exec "$@"',
                cwd,
                *argv,
            ]
            cwd = "/"
        elif os.geteuid() == 0:
            kw = {"user": tenant.uid, "group": tenant.gid, "extra_groups": list(tenant.groups)}
        try:
            return run(argv, env=tenant_env(tenant), timeout=timeout, check=check, cwd=cwd, **kw)
        except CommandError as exc:
            raise PodmanError(argv, exc.stderr or str(exc), what) from exc

    def containers(self, tenant: Tenant) -> list[dict[str, Any]]:
        out = self.run(tenant, "ps", "--all", "--filter", f"label={LABEL}", "--format", "json").stdout
        try:
            rows = json.loads(out or "[]") or []
        except ValueError as exc:
            raise PodmanError(["podman", "ps"], f"unreadable output: {out[:200]}") from exc
        result = []
        for r in rows:
            names = r.get("Names") or [r.get("Name", "")]
            result.append(
                {
                    "name": names[0],
                    "state": (r.get("State") or "").lower(),
                    "status": r.get("Status", ""),
                    "image": r.get("Image", ""),
                    "labels": r.get("Labels") or {},
                    "id": r.get("Id", ""),
                    "ports": [
                        {
                            "host_ip": p.get("host_ip", ""),
                            "host_port": p.get("host_port"),
                            "container_port": p.get("container_port"),
                            "protocol": p.get("protocol", "tcp"),
                        }
                        for p in (r.get("Ports") or [])
                    ],
                    "created": r.get("Created"),
                }
            )
        return result

    def image_exists(self, tenant: Tenant, image: str) -> bool:
        return self.run(tenant, "image", "exists", image, check=False).returncode == 0

    def load(self, tenant: Tenant, archive: str) -> None:
        self.run(
            tenant,
            "load",
            "--quiet",
            "--input",
            archive,
            timeout=1800,
            what=f"loading {os.path.basename(archive)}",
        )

    def pull(self, tenant: Tenant, image: str) -> None:
        self.run(tenant, "pull", "--quiet", image, timeout=1800, what=f"pulling {image}")

    def build(self, tenant: Tenant, argv: Sequence[str], cwd: str) -> None:
        self.run(tenant, *argv, timeout=3600, what="building the image")

    def create(self, tenant: Tenant, argv: Sequence[str]) -> None:
        self.run(tenant, *argv, timeout=600, what="creating the container")

    def run_tool(self, tenant: Tenant, argv: Sequence[str]) -> None:
        self.run(tenant, argv=argv, timeout=3600, what=f"running {os.path.basename(argv[0])}")

    def start(self, tenant: Tenant, name: str) -> None:
        self.run(tenant, "start", name, what=f"starting {name}")

    def stop(self, tenant: Tenant, name: str) -> None:
        self.run(tenant, "stop", "--ignore", name, what=f"stopping {name}")

    def remove(self, tenant: Tenant, name: str) -> None:
        self.run(tenant, "rm", "--force", "--ignore", "--volumes", name, what=f"removing {name}")

    def commit(self, tenant: Tenant, name: str, image: str) -> str:
        out = self.run(tenant, "commit", "--quiet", name, image, timeout=3600, what=f"saving {name}").stdout
        return out.strip()

    def logs(self, tenant: Tenant, name: str, tail: int) -> str:
        p = self.run(tenant, "logs", "--tail", str(tail), name, what=f"logs of {name}")
        return p.stdout + p.stderr

    def exec(
        self, tenant: Tenant, name: str, argv: Sequence[str], user: str = "", timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        opts = ["--user", user] if user else []
        return self.run(tenant, "exec", *opts, name, *argv, timeout=timeout, check=False)


def which(cmd: str) -> str | None:
    return shutil.which(cmd, path=SYSTEM_PATH)
