"""API operations on container workspaces: workspace.create/list/show/start/stop/rm/save/
logs/ports/shell, workspace.policy (for mt-podman, the docker shim and the OCI hook),
workspace.templates, and workspace.prepull for admins.

Every operation acts for the authenticated caller only: a workspace is found by the
caller's UID and name, and podman runs as that caller.
"""

from __future__ import annotations

from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.config.units import parse_size
from mtgpu.errors import ApiError, ValidationError
from mtgpu.workspaces.service import Workspaces
from mtgpu.workspaces.types import PolicyRefusal, WorkspaceError


def _tenant(caller: Caller) -> tuple[str, int]:
    if caller.uid == 0 or caller.via == "peer":
        raise ApiError("workspaces belong to tenants; log in as the tenant", "forbidden")
    return caller.name, caller.uid


def _wrap(fn: Any) -> Any:
    """Turn workspace errors into API refusals with a code (``policy`` names the rule)."""
    import functools

    @functools.wraps(fn)
    async def inner(caller: Caller, args: dict[str, Any]) -> Any:
        try:
            return await fn(caller, args)
        except PolicyRefusal as exc:
            raise ApiError(str(exc), f"policy:{exc.rule}") from exc
        except WorkspaceError as exc:
            raise ApiError(str(exc), "workspace") from exc

    return inner


def _overrides(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("gpus", "cpus"):
        v = arg(args, k, int, None)
        if v is not None:
            low, high = (0, 1024) if k == "gpus" else (1, 1 << 20)
            if not low <= v <= high:
                raise ValidationError(f"{k} must be a whole number from {low} to {high}")
            out[k] = v
    for k in ("ram", "vram"):
        v = arg(args, k, (str, int), None)
        if v is not None:
            try:
                out[k] = parse_size(v)
            except ValueError as exc:
                raise ValidationError(f"{k}: {exc}") from exc
    gt = arg(args, "gpu_type", str, None)
    if gt:
        out["gpu_type"] = gt.lower()
    ports = arg(args, "ports", list, [])
    for p in ports:
        if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535:
            raise ValidationError(f"port {p!r} is not a number from 1 to 65535")
    out["ports"] = ports
    env = arg(args, "env", dict, {})
    out["env"] = {str(k): str(v) for k, v in env.items()}
    return out


def register(d: Dispatcher, ws: Workspaces) -> None:
    """Register the workspace operations on ``d``."""

    @_wrap
    async def create(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Create a workspace from a template, an image, a saved image or a devcontainer.json."""
        user, uid = _tenant(caller)
        req = {
            "name": arg(args, "name", str),
            "template": arg(args, "template", str, None),
            "image": arg(args, "image", str, None),
            "saved": arg(args, "saved", str, None),
            "devcontainer": arg(args, "devcontainer", dict, None),
            "queue": arg(args, "queue", bool, True),
            "wait": arg(args, "wait", (int, float), 20),
            **_overrides(args),
        }
        return await ws.create(user, uid, req)

    @_wrap
    async def list_(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Your workspaces on this host."""
        return await ws.list(*_tenant(caller))

    @_wrap
    async def show(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One workspace."""
        return await ws.show(*_tenant(caller), arg(args, "name", str))

    @_wrap
    async def start(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Start a stopped workspace (reserving again if its reservation was released)."""
        return await ws.start_ws(
            *_tenant(caller), arg(args, "name", str), arg(args, "wait", (int, float), 20)
        )

    @_wrap
    async def stop(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Stop a workspace; release=true also gives its reservation back."""
        return await ws.stop_ws(*_tenant(caller), arg(args, "name", str), arg(args, "release", bool, False))

    @_wrap
    async def rm(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Remove a workspace and end its reservation."""
        return await ws.rm(*_tenant(caller), arg(args, "name", str))

    @_wrap
    async def save(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Save a workspace as an image that --saved NAME starts again."""
        return await ws.save(*_tenant(caller), arg(args, "name", str), arg(args, "image", str))

    @_wrap
    async def logs(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The workspace's main process output."""
        return await ws.logs(*_tenant(caller), arg(args, "name", str), arg(args, "tail", int, 200))

    @_wrap
    async def ports(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Published ports and how to reach them."""
        return await ws.ports(*_tenant(caller), arg(args, "name", str))

    @_wrap
    async def shell(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """What mt-container shell runs (the container, user and working directory)."""
        return await ws.shell_info(*_tenant(caller), arg(args, "name", str))

    @_wrap
    async def policy(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The container policy for you here (mt-podman, the docker shim, the OCI hook)."""
        return await ws.policy_view(*_tenant(caller))

    def templates(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """The admin's workspace templates."""
        return [
            {"name": n, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in t.items()}}
            for n, t in sorted(ws.options.containers.templates.items())
        ]

    @_wrap
    async def prepull(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Copy the pre-pull images into this host's archives now."""
        return await ws.prepull(arg(args, "force", bool, False))

    d.register("workspace.create", create)
    d.register("workspace.list", list_)
    d.register("workspace.show", show)
    d.register("workspace.start", start)
    d.register("workspace.stop", stop)
    d.register("workspace.rm", rm)
    d.register("workspace.save", save)
    d.register("workspace.logs", logs)
    d.register("workspace.ports", ports)
    d.register("workspace.shell", shell)
    d.register("workspace.policy", policy)
    d.register("workspace.templates", templates)
    d.register("workspace.prepull", prepull, admin=True)
