"""Read-only bind mounts: the kernel, not file modes, keeps tenants from writing.

A bind mount made read-only refuses every write below it with ``EROFS`` ("Read-only
file system"), whoever asks and whatever the files' modes say. ``--rbind`` carries
filesystems mounted inside the directory along, and each of them is made read-only
too, so nothing below stays writable.

The mount table is read with psutil; ``mount`` and ``umount`` (util-linux) run through
:func:`mtgpu.proc.run`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import psutil

from mtgpu.errors import CommandError, MountError
from mtgpu.proc import run


@dataclass(frozen=True)
class MountEntry:
    device: str
    path: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def table() -> list[MountEntry]:
    """This mount namespace's mounts, in mount order (a later one covers an earlier one)."""
    return [
        MountEntry(p.device, p.mountpoint, p.fstype, tuple(p.opts.split(",")))
        for p in psutil.disk_partitions(all=True)
    ]


def top(path: str, mounts: list[MountEntry] | None = None) -> MountEntry | None:
    """The visible mount at exactly ``path``, if ``path`` is a mount point."""
    found = None
    for m in table() if mounts is None else mounts:
        if m.path == path:
            found = m
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def bind_read_only(source: str, target: str, source_fd: int | None = None) -> None:
    """Bind ``source`` (and what is mounted inside it) at ``target``, all read-only.

    With ``source_fd`` (a descriptor of ``source``, opened without following links),
    the directory bound is the one that descriptor holds, whatever ``source`` names by
    then: ``mount`` gets its ``/proc`` path and is told not to resolve it again.
    """
    src = source if source_fd is None else f"/proc/{os.getpid()}/fd/{source_fd}"
    # Made read-only in a root-only staging place first, then bound at
    # ``target``: a bind copies the read-only flag, so the copies that propagate into
    # tenants' mount namespaces at once are read-only from the start (a remount
    # afterwards would change only this namespace's copy). The staging directory is
    # root's alone (0700), and its unmount reaches wherever its bind propagated.
    stage = tempfile.mkdtemp(prefix="mtgpu-bind-")
    try:
        try:
            run(["mount", "--no-canonicalize", "--rbind", src, stage])
        except CommandError as exc:
            raise MountError(f"cannot bind {source} at {target}: {exc}") from exc
        try:
            make_read_only(stage)
            run(["mount", "--no-canonicalize", "--rbind", stage, target])
        except CommandError as exc:
            raise MountError(f"cannot bind {source} at {target}: {exc}") from exc
        finally:
            unmount(stage)
    finally:
        try:
            os.rmdir(stage)
        except OSError:
            pass
    make_read_only(target)


def make_shared(target: str) -> None:
    """Make the mount at ``target`` shared, so mounts made below it later reach the
    mount namespaces copied from it (tenants' private ``/tmp`` namespaces)."""
    try:
        run(["mount", "--make-shared", target])
    except CommandError as exc:
        raise MountError(f"cannot make {target} shared: {exc}") from exc


def make_read_only(target: str) -> None:
    """Remount the visible mount at ``target`` and every mount below it read-only."""
    seen: list[str] = []
    for m in table():
        if _under(m.path, target) and m.path not in seen:
            seen.append(m.path)
    for path in seen:
        try:
            run(["mount", "-o", "remount,bind,ro", path])
        except CommandError as exc:
            raise MountError(f"cannot make {path} read-only: {exc}") from exc


def unmount(target: str) -> None:
    """Unmount ``target`` and the mounts below it; lazily if a process still uses them."""
    try:
        run(["umount", "--recursive", target])
    except CommandError:
        try:
            run(["umount", "--recursive", "--lazy", target])
        except CommandError as exc:
            raise MountError(f"cannot unmount {target}: {exc}") from exc


def mount_tmpfs(target: str, device: str) -> None:
    """A small root-owned tmpfs at ``target`` to hold mount points."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    try:
        run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m,nosuid,nodev,noexec", device, target])
    except CommandError as exc:
        raise MountError(f"cannot mount a tmpfs at {target}: {exc}") from exc
