"""The daemon's side of tenants' terminals: socket directories and live connections.

Runs as root in the daemon.

**Socket directories.** ``RUN_DIR/tmux`` is root's (0711: tenants pass through
it, nobody lists it) and holds one ``tmux-UID`` per tenant, the tenant's, 0700.
They are made through directory descriptors opened with ``O_NOFOLLOW`` from
``RUN_DIR`` down and fixed with ``fchown``/``fchmod`` on the descriptor, never by
name: no path a tenant can write is followed. A shared, world-writable place
such as ``/tmp`` is not used, because there anyone can make ``/tmp/tmux-UID``
for another uid first and so deny that tenant every terminal.

**Live connections** (:class:`LiveTerminals`). Every pty the gateway serves is
recorded by its terminal name with a probe that asks the client's SSH
connection for an answer (:mod:`mtgpu.gateway.liveness`). A new login asks which
of the terminals attached to its sessions are on connections that no longer
answer (a laptop asleep, a network gone), so it can take those sessions over.
The gateway starts those questions (:meth:`LiveTerminals.prime`) as soon as the
new terminal is opened, so the answer is ready when the login asks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from mtgpu.text import one_line

log = logging.getLogger("mtgpu.tmux")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The most a probe may take before its terminal counts as dead. The gateway's
#: probe bounds itself much sooner (mtgpu.gateway.liveness.ANSWER_DEADLINE); this
#: only stops one that never returns.
PROBE_TIMEOUT = 5.0
#: What one question may name (a tenant's own terminals; more is refused).
MAX_TTYS = 64
#: Distinct failures remembered so that each is logged once.
_MAX_REPORTED = 1000


def tmux_root(run_dir: str) -> str:
    return os.path.join(run_dir, "tmux")


def ensure_socket_dir(run_dir: str, uid: int, gid: int) -> str:
    """Make ``RUN_DIR/tmux/tmux-UID`` (the tenant's, 0700); return ``RUN_DIR/tmux``."""
    run_fd = os.open(run_dir, _DIR_FLAGS)
    try:
        top = _subdir(run_fd, "tmux", os.geteuid(), os.getegid(), 0o711)
        try:
            os.close(_subdir(top, f"tmux-{uid}", uid, gid, 0o700))
        finally:
            os.close(top)
    finally:
        os.close(run_fd)
    return tmux_root(run_dir)


def _subdir(parent: int, name: str, uid: int, gid: int, mode: int) -> int:
    """``name`` in the directory ``parent`` as an open descriptor, with this owner and mode.

    The parent is root's and not writable by tenants, so whatever is found there
    was made by root; it is still opened without following links and checked to
    be a directory before its owner or mode is changed, on the descriptor.
    """
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - O_DIRECTORY refuses first
            raise NotADirectoryError(name)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


Probe = Callable[[], Awaitable[bool]]


@dataclass
class _Terminal:
    uid: int
    probe: Probe


class LiveTerminals:
    """The ptys this daemon serves, by terminal name, each with its connection's probe."""

    def __init__(self, timeout: float = PROBE_TIMEOUT) -> None:
        self.timeout = timeout
        self._by_tty: dict[str, _Terminal] = {}
        self._reported: set[tuple[int, str]] = set()

    def add(self, tty: str, uid: int, probe: Probe) -> None:
        self._by_tty[tty] = _Terminal(uid, probe)

    def prime(self, uid: int) -> int:
        """Start asking every terminal of ``uid`` now, without waiting (a new login
        of that tenant will ask :meth:`dead` shortly). Returns how many."""
        n = 0
        for t in self._by_tty.values():
            start = getattr(t.probe, "start", None)
            if t.uid == uid and start is not None:
                start()
                n += 1
        return n

    def remove(self, tty: str, probe: Probe) -> None:
        t = self._by_tty.get(tty)
        if t is not None and t.probe is probe:
            del self._by_tty[tty]

    async def dead(self, uid: int, ttys: Iterable[str]) -> list[str]:
        """Which of ``ttys`` (``uid``'s own) are on connections that do not answer.

        A terminal this daemon does not serve, or another uid's, is not reported:
        the caller treats it as live.
        """
        mine = [
            (tty, t)
            for tty in dict.fromkeys(ttys)
            if (t := self._by_tty.get(tty)) is not None and t.uid == uid
        ]
        answers = await asyncio.gather(*(self._answers(t) for _, t in mine))
        return [tty for (tty, _), ok in zip(mine, answers) if not ok]

    async def _answers(self, t: _Terminal) -> bool:
        try:
            return bool(await asyncio.wait_for(t.probe(), self.timeout))
        except TimeoutError:
            return False
        except Exception:  # noqa: BLE001 - a connection that errors is not live
            return False

    def report_failure(self, uid: int, name: str, reason: str) -> bool:
        """Log a tenant's failed terminal once per tenant and reason; True if logged."""
        reason = one_line(reason)[:300]
        key = (uid, reason)
        if key in self._reported:
            return False
        if len(self._reported) >= _MAX_REPORTED:
            self._reported.clear()
        self._reported.add(key)
        log.warning("terminal of %s (UID %d) fell back to a plain shell: %s", name, uid, reason)
        return True


def session_env(run_dir: str, uid: int, gid: int) -> dict[str, str]:
    """The variables that put a tenant session's tmux in its socket directory
    (made first), or nothing (tmux's own /tmp place) if it cannot be made."""
    try:
        root = ensure_socket_dir(run_dir, uid, gid)
    except OSError as exc:
        log.warning(
            "UID %d: the tmux socket directory under %s cannot be made: %s", uid, tmux_root(run_dir), exc
        )
        return {}
    # MTGPU_TMUX_DIR is what mt-attach believes; TMUX_TMPDIR lets the tenant's own
    # `tmux -L mtgpu` (and plain `tmux`) use the same protected directory.
    return {"MTGPU_TMUX_DIR": root, "TMUX_TMPDIR": root}
