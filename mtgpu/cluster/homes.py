"""Whether members share ``TENANT_HOME_ROOT``: shared, independent or mixed homes.

Each member writes a marker, ``TENANT_HOME_ROOT/.mtgpu-member-NAME`` (root's, mode
0644), holding a random token it makes at start, then records the token in the
replicated member list. Every member then looks for the other members' markers in
its own ``TENANT_HOME_ROOT``: it sees member X's marker with X's current token only
if the two directories are the same storage (an NFS export, say). A copied or stale
marker holds another token and does not count. What each member sees is replicated
too (:meth:`~mtgpu.cluster.members.Members.set_homes`, written only when it changes),
so every member can answer ``mtgpu-admin cluster status`` and the layout outlives a
failover.

A member that cannot write its marker (NFS exported with ``root_squash``, say) has no
token, and the layout shows ``unknown`` until it can.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mtgpu.cluster.members import Members

log = logging.getLogger("mtgpu.cluster")

MARKER_PREFIX = ".mtgpu-member-"
#: Seconds between two looks at the markers for a while after a change (a member
#: joined, left or restarted with a new token)...
CHECK_INTERVAL = 2.0
#: ...for this long; then looks are this far apart, to spare a shared file system.
FAST_PERIOD = 60.0
SLOW_INTERVAL = 30.0


def marker_path(root: str, name: str) -> Path:
    return Path(root) / f"{MARKER_PREFIX}{name}"


def write_marker(root: str, name: str, token: str) -> bool:
    """Write this member's marker atomically; False if the directory refuses it."""
    path = marker_path(root, name)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(f"{token}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("cannot write %s (%s): this member's homes layout stays unknown", path, exc.strerror)
        try:
            tmp.unlink()
        except OSError:
            pass
        return False


def read_marker(root: str, name: str) -> str | None:
    try:
        with open(marker_path(root, name), "rb") as f:
            return f.read(200).decode(errors="replace").strip() or None
    except OSError:
        return None


def observe(root: str, me: str, members: Members) -> list[str]:
    """The other members whose current marker this member sees in ``root``."""
    seen = []
    for name, rec in sorted(members.homes.items()):
        token = rec.get("token")
        if name == me or not token or name not in members.members:
            continue
        if read_marker(root, name) == token:
            seen.append(name)
    return seen


def layout(members: Members) -> dict[str, Any]:
    """``{"homes": shared|independent|mixed|unknown, "shares": {member: [members]}}``.

    Two members share homes when each one sees the other's marker: one side alone is
    a copied marker (or the other has not looked yet), not one directory. ``shared``: every member shares with every
    other (a cluster of one too); ``independent``: none does; ``mixed``: some do;
    ``unknown``: a member has not recorded what it sees yet.
    """
    names = sorted(members.members)
    recs = members.homes
    # Each member's own list as a set: the cost is the markers recorded, not the
    # square of the members (a thousand members start jobs with this).
    seen = {n: set((recs.get(n) or {}).get("shares", ())) for n in names}
    shares: dict[str, list[str]] = {
        a: sorted(b for b in seen[a] if b != a and a in seen.get(b, ())) for a in names
    }
    if any(not (recs.get(n) or {}).get("token") for n in names):
        kind = "unknown"
    elif all(len(s) == len(names) - 1 for s in shares.values()):
        kind = "shared"
    elif not any(shares.values()):
        kind = "independent"
    else:
        kind = "mixed"
    return {"homes": kind, "shares": shares}


def workdir_help(members: Members, node: str, root: str, workdir: str) -> str:
    """What to tell the owner of a job whose ``workdir`` is missing on ``node``."""
    others = [n for n in sorted(members.members) if n != node]
    if not others:
        return ""
    recs = members.homes
    shared = {
        b
        for b in (recs.get(node) or {}).get("shares", ())
        if b != node and b in members.members and node in (recs.get(b) or {}).get("shares", ())
    }
    inside = os.path.normpath(workdir) == os.path.normpath(root) or os.path.normpath(workdir).startswith(
        os.path.normpath(root).rstrip("/") + "/"
    )
    if shared != set(others):
        where = (
            f"{node} does not share TENANT_HOME_ROOT with {', '.join(n for n in others if n not in shared)}"
        )
    elif inside:
        return ""  # the homes are shared: the directory is missing everywhere
    else:
        where = f"{workdir} is outside TENANT_HOME_ROOT ({root}), on {node}'s own disk"
    return (
        f"{where}: copy the directory to {node}, keep it on storage every member "
        f"shares, or pin the job with server= to a member that has it"
    )


class HomesProbe:
    """This member's side: write the marker, look for the others', record changes."""

    def __init__(
        self, root: str, name: str, members: Members, replicate: Callable[..., Awaitable[Any]]
    ) -> None:
        self.root = root
        self.name = name
        self.members = members
        self.replicate = replicate
        self.token: str | None = secrets.token_hex(16)
        self._written = False
        self._made_root = False

    def current(self) -> tuple[str | None, list[str]]:
        """(token, members seen) as they should be recorded now."""
        if not self._made_root:  # as the accounts would (once: never after a removal)
            self._made_root = True
            try:
                Path(self.root).mkdir(parents=True, exist_ok=True, mode=0o755)
            except OSError:
                pass
        if not self._written:
            self._written = write_marker(self.root, self.name, self.token or "")
        elif read_marker(self.root, self.name) != self.token:
            self._written = write_marker(self.root, self.name, self.token or "")  # removed?
        token = self.token if self._written else None
        return token, observe(self.root, self.name, self.members) if token else []

    async def check(self) -> bool:
        """Record what this member sees if it changed; True if it recorded something."""
        if self.name not in self.members.members:
            return False  # not admitted yet (or removed)
        token, seen = await asyncio.to_thread(self.current)
        rec = self.members.homes.get(self.name) or {}
        if rec.get("token") == token and rec.get("shares") == seen and rec:
            return False
        await self.replicate(self.members.set_homes, self.name, token, seen, time.time())
        if seen:
            log.info("TENANT_HOME_ROOT %s is shared with %s", self.root, ", ".join(seen))
        return True

    def _signature(self) -> tuple[Any, ...]:
        """What, when it changes, calls for quick looks: the members and their tokens."""
        return (
            tuple(sorted(self.members.members)),
            tuple(sorted((n, r.get("token") or "") for n, r in self.members.homes.items())),
        )

    async def run(self) -> None:
        seen_sig: tuple[Any, ...] | None = None
        fast_until = last = 0.0
        while True:
            now = time.monotonic()
            sig = self._signature()
            if sig != seen_sig:
                seen_sig, fast_until = sig, now + FAST_PERIOD
            if now < fast_until or now - last >= SLOW_INTERVAL:
                last = now
                try:
                    await self.check()
                except Exception as exc:  # noqa: BLE001 - retried at the next look
                    log.debug("recording the homes layout failed: %s", exc)
            await asyncio.sleep(CHECK_INTERVAL)
