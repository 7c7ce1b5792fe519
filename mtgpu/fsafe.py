"""Root's file operations on paths a tenant may control, and its signals, made safe.

Root never opens, creates, chowns, chmods or removes a path inside a tenant-writable
directory by name: a tenant can swap any name there for a link between root's check
and root's use. Everything here works on descriptors instead:

- :func:`open_dir` walks a path one component at a time from ``/`` with
  ``O_NOFOLLOW | O_DIRECTORY``, so no link anywhere in it is followed;
- :func:`give_socket` hands a socket in a root-owned directory to a tenant, by the
  directory's descriptor, never following a link;
- :func:`untrusted_component` names the first component of a path that someone
  other than root could change (the check behind published datasets);
- :class:`Pinned` is a process pinned by a pidfd: a signal through it reaches that
  process or nobody, even after its PID is reused.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: str) -> int:
    """A descriptor of the directory ``path``, reached without following any link.

    Raises ``OSError`` (``ELOOP``/``ENOTDIR``) if a component is a link or not a
    directory. ``path`` must be absolute.

    >>> fd = open_dir("/usr/bin"); os.path.samestat(os.fstat(fd), os.stat("/usr/bin"))
    True
    >>> os.close(fd)
    """
    if not os.path.isabs(path):
        raise ValueError(f"{path!r} is not an absolute path")
    fd = os.open("/", _DIR)
    try:
        for part in [p for p in path.split("/") if p]:
            if part == "..":
                raise OSError(f"{path}: '..' is not allowed here")
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def give_socket(path: str, uid: int, gid: int, mode: int = 0o600) -> None:
    """Make the socket at ``path`` the tenant's (``mode``), keeping its directory root's.

    The directory must be root's and writable by nobody else, so its entries cannot
    be swapped; the socket is checked through the directory's descriptor and changed
    without following a link. The directory is made ``0711``: the tenant reaches the
    socket inside, and lists nothing.
    """
    parent, name = os.path.split(path)
    dfd = open_dir(parent)
    try:
        st = os.fstat(dfd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise PermissionError(f"{parent} is not root's alone; not handing out {name}")
        if not stat.S_ISSOCK(os.lstat(name, dir_fd=dfd).st_mode):
            raise PermissionError(f"{path} is not a socket")
        os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        # No lchmod on Linux: the entry was checked above in a directory only root writes.
        os.chmod(name, mode, dir_fd=dfd)
        os.fchmod(dfd, 0o711)
    finally:
        os.close(dfd)


def untrusted_component(path: str, last: bool = True) -> tuple[str, str] | None:
    """The first component of ``path`` that someone other than root could change, and why.

    A component is trusted if root owns it and no one else may write to it, or if it
    is a sticky directory root owns (``/tmp``: others cannot rename what root put
    there). The last component counts too unless ``last`` is False (what is inside a
    directory does not change which directory a path names). A link is followed only
    from a trusted directory; its target is then checked from the start. None if every
    component is trusted.

    >>> untrusted_component("/usr/bin") is None
    True
    """
    seen = 0
    todo = [p for p in os.path.normpath(path).split("/") if p]
    here = "/"
    while todo:
        part = todo.pop(0)
        nxt = os.path.join(here, part)
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            seen += 1
            if seen > 40:
                return nxt, "has too many links"
            target = os.readlink(nxt)
            base = "/" if os.path.isabs(target) else here
            todo = [p for p in os.path.normpath(os.path.join(base, target)).split("/") if p] + todo
            here = "/"
            continue
        why = _untrusted(st) if todo or last else ""
        if why:
            return nxt, why
        here = nxt
    return None


def _untrusted(st: os.stat_result) -> str:
    if st.st_uid != 0:
        return f"is owned by UID {st.st_uid}, not root"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"is writable by {'its group' if st.st_mode & 0o020 else 'everyone'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def open_trusted(path: str) -> int:
    """An ``O_PATH`` descriptor of the directory ``path``, opened without following a
    link, once :func:`untrusted_component` found nothing to object to. ``OSError`` if
    the path changed in between (a link appeared)."""
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    dfd = open_dir(parent)
    try:
        return os.open(name or ".", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)


# ------------------------------------------------------------------- processes


@dataclass
class Pinned:
    """A process held by a pidfd, so that signals never reach a process that reused its PID.

    Open it while the PID cannot have been reused: for a child, before it is reaped
    (:meth:`of_child`); for any other process, with a check that runs after the pidfd
    is open and confirms it is still the process meant (:meth:`of`).
    """

    pid: int
    fd: int = field(default=-1)

    @classmethod
    def of_child(cls, pid: int) -> Pinned:
        return cls(pid, os.pidfd_open(pid))

    @classmethod
    def of(cls, pid: int, still_it: Callable[[int], bool]) -> Pinned | None:
        """Pin ``pid`` if, once pinned, ``still_it(pid)`` says it is the process meant."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        p = cls(pid, fd)
        try:
            if still_it(pid):
                return p
        except OSError:
            pass
        p.close()
        return None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to this process if it still exists; False if it has gone."""
        if self.fd < 0:
            return False
        try:
            signal.pidfd_send_signal(self.fd, sig)
            return True
        except ProcessLookupError:
            return False

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def signal_pid(pid: int, sig: int, still_it: Callable[[int], bool]) -> bool:
    """Signal ``pid`` through a pidfd if ``still_it`` confirms, once pinned, that it is the
    process meant. False if it is gone or is another process now."""
    p = Pinned.of(pid, still_it)
    if p is None:
        return False
    try:
        return p.signal(sig)
    finally:
        p.close()


def signal_members(members: Callable[[], set[int]], sig: int) -> int:
    """Signal every process ``members()`` lists (a cgroup's, a supervisor's descendants)
    through pidfds: each PID is pinned, the list read again, and only a pinned process
    whose PID is still listed is signalled, so a PID reused meanwhile is left alone.
    Returns how many were signalled."""
    pinned = [p for p in (Pinned.of(pid, lambda _pid: True) for pid in members()) if p]
    try:
        now = members()
        return sum(1 for p in pinned if p.pid in now and p.signal(sig))
    finally:
        for p in pinned:
            p.close()
