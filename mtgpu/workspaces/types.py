"""The data types of workspaces: what a workspace is made of, whose it is, and the policy.

Everything here is a frozen dataclass of plain values, so the job table can journal a
workspace's definition and the API can print it without conversion::

    WorkspaceSpec ── mounts ──> Mount
         │          build  ──> BuildSpec (a Dockerfile from a devcontainer.json)
    Tenant (uid, home, runtime dir)      Policy (what podman may be asked to do)

The errors of this part hang off :class:`~mtgpu.errors.MtgpuError`::

    WorkspaceError       a workspace cannot be created, found or used
    ├── PolicyRefusal    the container policy refuses a request; ``rule`` names the rule
    └── PodmanError      podman, run as the tenant, failed (argv and stderr attached)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mtgpu.errors import MtgpuError

#: Workspace names become container names and tmux session names.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\Z")
#: Where saved workspaces go in the tenant's own image store.
SAVED_PREFIX = "localhost/mtgpu-saved/"
#: The label podman keeps on every workspace container.
LABEL = "mtgpu.workspace"
#: The annotation (and label) of a containerized job's container: the job's id.
JOB_LABEL = "mtgpu.job"


class WorkspaceError(MtgpuError):
    """A workspace cannot be created, found or used."""


class PolicyRefusal(WorkspaceError):
    """The container policy refuses a request. ``rule`` is the rule's short name."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"refused by the container policy, rule {rule!r}: {message}")


class PodmanError(WorkspaceError):
    """Podman, run as the tenant, failed."""

    def __init__(self, argv: Sequence[str], stderr: str, what: str = "") -> None:
        self.argv = list(argv)
        self.stderr = stderr
        detail = _podman_message(stderr)
        super().__init__(f"{what + ': ' if what else ''}podman {' '.join(argv[1:3])} failed: {detail}")


def _podman_message(stderr: str) -> str:
    """The useful line of podman's stderr (its ``Error:`` line when there is one)."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else (lines[-1] if lines else "no message"))[:2000]


@dataclass(frozen=True)
class Mount:
    """A bind mount (``source`` on the host, ``~/`` for the home) or a named volume."""

    source: str
    target: str
    readonly: bool = False
    kind: str = "bind"  # "bind" or "volume"


@dataclass(frozen=True)
class BuildSpec:
    """An image built from a Dockerfile, as a devcontainer.json's ``build`` asks."""

    dockerfile: str
    context: str
    args: Mapping[str, str] = field(default_factory=dict)
    target: str = ""
    #: The devcontainer.json it came from, for the ``devcontainer`` CLI.
    config_path: str = ""
    workspace_folder: str = ""


@dataclass(frozen=True)
class WorkspaceSpec:
    """Everything a workspace is made from. ``command`` empty: a keep-alive process.

    ``source`` says where it came from: ``template:NAME``, ``image``, ``saved:NAME``
    or ``devcontainer:PATH``. ``post_create`` holds argv lists run once, in order,
    after the container is first created. ``user`` is the user ``shell`` and
    ``exec`` run as (devcontainer ``remoteUser``); empty: the tenant.
    """

    name: str
    image: str
    source: str = "image"
    gpus: int = 0
    gpu_type: str | None = None
    vram: int = 0
    cpus: int = 1
    ram: int = 1 << 30
    ports: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    command: tuple[str, ...] = ()
    use_image_command: bool = False
    post_create: tuple[tuple[str, ...], ...] = ()
    user: str = ""
    workdir: str = ""
    run_args: tuple[str, ...] = ()
    build: BuildSpec | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :meth:`from_dict` reads it back."""
        d = asdict(self)
        d["env"] = dict(self.env)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkspaceSpec:
        kw = dict(d)
        kw["ports"] = tuple(kw.get("ports", ()))
        kw["env"] = dict(kw.get("env", {}))
        kw["mounts"] = tuple(Mount(**m) for m in kw.get("mounts", ()))
        kw["command"] = tuple(kw.get("command", ()))
        kw["post_create"] = tuple(tuple(c) for c in kw.get("post_create", ()))
        kw["run_args"] = tuple(kw.get("run_args", ()))
        kw["warnings"] = tuple(kw.get("warnings", ()))
        b = kw.get("build")
        kw["build"] = BuildSpec(**{**b, "args": dict(b.get("args", {}))}) if b else None
        return cls(**kw)


@dataclass(frozen=True)
class Tenant:
    """Whose podman runs: the account, and its ``XDG_RUNTIME_DIR``."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()
    shell: str = "/bin/sh"
    #: With local container stores (CONTAINERS.storage): the ``storage.conf`` podman
    #: reads and the tenant's store directory on this member; empty: the home.
    storage_conf: str = ""
    storage_dir: str = ""

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.uid}"


@dataclass(frozen=True)
class Policy:
    """What a tenant's podman may be asked to do on this host.

    ``devices`` are the host device nodes of the GPUs the tenant holds here and
    ``cdi_devices`` their CDI names (``nvidia.com/gpu=...``); ``images`` are the
    images every tenant may use (templates and pre-pulled ones, fully qualified).
    ``system_sources`` are host paths that podman itself or CDI mount (never the
    tenant's choice), allowed only in the OCI hook's check. ``datasets`` are the
    published datasets' sources, mounted read-only at their own paths and at
    ``/datasets/NAME``; ``interpreters`` the prefixes of published Python
    interpreters that have one of their own, mounted read-only at the same paths.
    """

    home: str
    datasets: tuple[str, ...] = ()
    interpreters: tuple[str, ...] = ()
    port_publishing: str = "loopback"
    network: bool = True
    allow_user_images: bool = False
    images: tuple[str, ...] = ()
    registry: str = ""
    devices: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    runtime_dir: str = ""
    #: The tenant's local container store and its ``storage.conf`` (empty: the home).
    storage_dir: str = ""
    storage_conf: str = ""
    system_sources: tuple[str, ...] = ()
    #: Containerized jobs share the member's network (CONTAINERS.job_network: host).
    job_network_host: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Policy:
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in cls.__dataclass_fields__
        }
        return cls(**fields)
