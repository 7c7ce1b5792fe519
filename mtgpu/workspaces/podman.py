"""The container runtime back end: rootless podman, always run as the tenant.

:class:`ContainerRuntime` is the contract the workspace service calls; :class:`Podman`
implements it by running ``podman`` as the tenant, with a clean environment (``HOME``,
``XDG_RUNTIME_DIR``) and the home as working directory. Nothing here runs podman as
root. A failure is raised as :class:`~mtgpu.workspaces.types.PodmanError` with
podman's own error line.

Where the daemon is root every command starts through the tenant's fence
(:meth:`~mtgpu.schedd.fence.TenantFence.prefix`): session cgroup, private mount and
network namespaces, then the tenant's identity. The two that start a container's
processes, ``start`` and ``exec``, join the cgroups of the workspace's reservation (its
holding job's: its GPUs, its memory) instead of the session's, in the same namespaces:
on a host where rootless podman makes no cgroups of its own, what they start stays in
the caller's cgroup, and the session cgroup would deny the workspace its GPUs. Given no
reservation cgroups (a runtime used alone) they enter the network namespace only. A
fence part that cannot be made refuses the command; root without a fence refuses every
command.

Every method blocks; the daemon calls them in a thread.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mtgpu.errors import CommandError, MtgpuError
from mtgpu.proc import run
from mtgpu.schedd.fence import fenced_argv
from mtgpu.workspaces.types import LABEL, PodmanError, Tenant, WorkspaceError

if TYPE_CHECKING:
    from mtgpu.schedd.fence import TenantFence

log = logging.getLogger("mtgpu.workspaces")

#: Where the real podman is looked for; MTGPU's own ``podman`` (the policy wrapper in
#: ``RUN_DIR/bin``) is never on this path.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: podman commands that start a container's processes (see the module's docstring).
STARTS_CONTAINERS = frozenset({"start", "exec"})


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

    def start(self, tenant: Tenant, name: str, within: Sequence[str] = ()) -> None:
        """Start the container; ``within``: the ``cgroup.procs`` files of the workspace's
        reservation, which what it starts joins."""
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
        self,
        tenant: Tenant,
        name: str,
        argv: Sequence[str],
        user: str = "",
        timeout: float = 600,
        within: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def fenced(
        self,
        tenant: Tenant,
        argv: Sequence[str],
        *,
        starts: bool = False,
        what: str = "",
        within: Sequence[str] = (),
    ) -> list[str]:
        """``argv`` made to run as ``tenant`` inside its fence."""
        raise NotImplementedError


class Podman(ContainerRuntime):
    """Rootless podman as the tenant."""

    def __init__(self, binary: str | None = None, *, fence: TenantFence | None = None) -> None:
        self.binary = binary or real_podman()
        #: The tenants' fences. Podman runs in the tenant's network namespace
        #: (TENANT_NETWORK: private), so a workspace's published ports are on the
        #: tenant's own loopback, where its sessions and ``ssh -L`` reach them.
        self.fence = fence

    def fenced(
        self,
        tenant: Tenant,
        argv: Sequence[str],
        *,
        starts: bool = False,
        what: str = "",
        within: Sequence[str] = (),
    ) -> list[str]:
        """``argv`` made to run as ``tenant``, inside its fence; ``starts``: a command
        that starts a container's processes, in the cgroups ``within`` (see above).
        Unchanged where the daemon is not root (it runs everything as itself)."""
        if tenant.uid == 0:
            raise PodmanError(list(argv[:2]), "workspaces never run podman as root")
        if os.geteuid() != 0:
            return list(argv)
        if self.fence is None:
            raise WorkspaceError(
                f"{what + ': ' if what else ''}no tenant fence: nothing runs as {tenant.name}"
            )
        cwd = tenant.home if os.path.isdir(tenant.home) else "/"
        # The tenant's shell changes into the home once it is the tenant.
        inner = ["/bin/sh", "-c", 'cd -- "$0" 2>/dev/null || cd /; exec "$@"', cwd, *argv]
        uid, gid = tenant.uid, tenant.gid
        try:
            if not starts:
                return [*self.fence.prefix(uid, gid, list(tenant.groups), "/"), *inner]
            # Into the reservation's cgroups, with the tenant's namespaces; without them
            # (a runtime used alone) into the tenant's network namespace only.
            ns = self.fence.namespace(uid) if within else None
            net = self.fence.net_namespace(uid)
        except MtgpuError as exc:  # FenceError: never run podman with less isolation instead
            raise WorkspaceError(f"{what + ': ' if what else ''}{exc}") from exc
        prefix = fenced_argv(within, ns, net, uid, gid, tenant.groups, "/", title="mtgpu-workspace")
        return [*prefix, *inner]

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
        within: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS`` (or ``argv``) as ``tenant``; raise PodmanError with its message."""
        starts = argv is None and bool(args) and args[0] in STARTS_CONTAINERS
        argv = self.fenced(
            tenant,
            list(argv) if argv is not None else self.argv(*args),
            starts=starts,
            what=what,
            within=within,
        )
        try:
            return run(argv, env=tenant_env(tenant), timeout=timeout, check=check, cwd="/")
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

    def start(self, tenant: Tenant, name: str, within: Sequence[str] = ()) -> None:
        self.run(tenant, "start", name, what=f"starting {name}", within=within)

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
        self,
        tenant: Tenant,
        name: str,
        argv: Sequence[str],
        user: str = "",
        timeout: float = 600,
        within: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        opts = ["--user", user] if user else []
        return self.run(tenant, "exec", *opts, name, *argv, timeout=timeout, check=False, within=within)


def which(cmd: str) -> str | None:
    return shutil.which(cmd, path=SYSTEM_PATH)
