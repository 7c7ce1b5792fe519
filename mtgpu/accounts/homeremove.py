"""Archive and remove a tenant's home as root, by directory descriptor, never through a mount.

Retention removes homes unattended, as root, in directories the tenant controls. A
path-based ``rm -rf --one-file-system`` compares device numbers, and a bind mount
of the same filesystem (``mount --bind /srv/proj ~/project``) has the same device:
``rm`` emptied the bind mount's source. So this module:

1. opens ``TENANT_HOME_ROOT`` (root's) and the home below it with ``O_NOFOLLOW``, and
   refuses a home that is not owned by the tenant's own UID, naming its owner;
2. refuses, before touching anything, when ``/proc/self/mountinfo`` lists a mount
   point under the home, or when the walk meets an entry on another mount (by mount
   ID, ``statx(STATX_MNT_ID)``: a same-filesystem bind mount has its own ID), or an
   immutable or append-only entry (``chattr +i``/``+a``), or the home's filesystem is
   read-only: each would leave the home half removed;
3. archives (a tar, written to a temporary name and renamed when complete) and
   removes by ``openat``/``unlinkat`` from each directory's descriptor, checking each
   directory it opens is still the inode it listed, on the home's mount.

The archive holds what is on disk: a sparse file (``truncate -s 15T``: a few KiB
allocated) is stored as GNU tar's sparse format 1.0 (its data segments, found with
``SEEK_DATA``/``SEEK_HOLE``, and a map), never read hole by hole; and before a byte is
written the archive's size is bounded by what the home holds on disk (``st_blocks``)
and checked against the destination's free space (:meth:`Home.archive`).

Errors: :class:`HomeRefused` (nothing was touched, says why) and
:class:`HomeRemoveFailed` (removal started and stopped, says where).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import pwd
import stat
import tarfile
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from typing import Self

from mtgpu.errors import AccountError

log = logging.getLogger("mtgpu.accounts.homeremove")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The deepest tree removed; deeper needs an administrator (each level holds a descriptor).
MAX_DEPTH = 400
#: How many problems a refusal names.
NAMED = 5

_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_STATX_BASIC_STATS = 0x7FF
_STATX_MNT_ID = 0x1000
_STATX_ATTR_IMMUTABLE = 0x10
_STATX_ATTR_APPEND = 0x20
_STATX_ATTR_MOUNT_ROOT = 0x2000


class HomeRefused(AccountError):
    """The home was not touched: removing it would reach what is not the tenant's."""


class HomeRemoveFailed(AccountError):
    """Removal started and stopped part-way."""


@dataclass(frozen=True)
class Entry:
    """``statx`` of one entry, as this module needs it."""

    mode: int
    ino: int
    uid: int
    mnt_id: int
    attributes: int
    size: int
    mtime: int
    nlink: int
    gid: int
    #: Bytes allocated on disk (``stx_blocks`` * 512): what a sparse file really holds.
    disk: int = 0


_libc = ctypes.CDLL(None, use_errno=True)
_statx = getattr(_libc, "statx", None)


def statx(dir_fd: int, name: str) -> Entry:
    """``statx`` of ``name`` under ``dir_fd`` (``""``: ``dir_fd`` itself), links not followed."""
    if _statx is None:  # pragma: no cover - glibc older than 2.28
        raise HomeRefused("this system's C library has no statx(); homes are not removed")
    buf = ctypes.create_string_buffer(256)
    flags = _AT_SYMLINK_NOFOLLOW | (_AT_EMPTY_PATH if name == "" else 0)
    if _statx(dir_fd, os.fsencode(name), flags, _STATX_BASIC_STATS | _STATX_MNT_ID, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), name)
    raw = buf.raw
    mask = int.from_bytes(raw[0:4], "little")
    if not mask & _STATX_MNT_ID:  # pragma: no cover - Linux older than 5.8
        raise HomeRefused(
            "this kernel does not report mount IDs (statx STATX_MNT_ID, Linux 5.8); homes are not removed"
        )

    def u32(o: int) -> int:
        return int.from_bytes(raw[o : o + 4], "little")

    def u64(o: int) -> int:
        return int.from_bytes(raw[o : o + 8], "little")

    return Entry(
        mode=int.from_bytes(raw[28:30], "little"),
        ino=u64(32),
        uid=u32(20),
        mnt_id=u64(144),
        attributes=u64(8),
        size=u64(40),
        mtime=int.from_bytes(raw[112:120], "little", signed=True),
        nlink=u32(16),
        gid=u32(24),
        disk=u64(48) * 512,
    )


def _unescape(field: str) -> str:
    r"""A mountinfo path: spaces and the like are octal escapes.

    >>> _unescape(r"/home/a\040b")
    '/home/a b'
    """
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def mounts_under(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[tuple[int, str]]:
    """(mount ID, mount point) of every mount at or below ``path``, in mount order."""
    path = path.rstrip("/") or "/"
    out = []
    with open(mountinfo) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            point = _unescape(fields[4])
            if point == path or point.startswith(path + "/"):
                out.append((int(fields[0]), point))
    return out


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name!r} (UID {uid})"
    except KeyError:
        return f"UID {uid} (no account here)"


def foreign_owner(path: str, uid: int) -> str:
    """Who owns ``path`` if it exists and is not ``uid``'s own directory ("" otherwise)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
        return owner_name(st.st_uid) if stat.S_ISDIR(st.st_mode) else f"a file of {owner_name(st.st_uid)}"
    return ""


class Home:
    """A tenant's home, opened from ``TENANT_HOME_ROOT``; close it with :meth:`close`."""

    def __init__(self, home_root: str, name: str, uid: int) -> None:
        # TENANT_HOME_ROOT is the admin's (it may be a link, /home -> /data/home); the
        # mount table names the real path.
        home_root = os.path.realpath(home_root)
        self.path = os.path.join(home_root, name)
        self.name = name
        self.root_fd = os.open(home_root, _DIR_FLAGS)
        try:
            try:
                self.fd = os.open(name, _DIR_FLAGS, dir_fd=self.root_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise HomeRefused(
                        f"{self.path} is not a directory (a link or a file); left alone"
                    ) from exc
                raise
            me = statx(self.fd, "")
            if me.uid != uid:
                os.close(self.fd)
                raise HomeRefused(
                    f"{self.path} belongs to {owner_name(me.uid)}, not to the tenant (UID {uid}); left alone"
                )
        except BaseException:
            os.close(self.root_fd)
            raise
        self.mnt_id = me.mnt_id
        self.ino = me.ino
        self.mount_root = bool(me.attributes & _STATX_ATTR_MOUNT_ROOT)

    def close(self) -> None:
        for fd in (self.fd, self.root_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- the walk

    def _open_dir(self, dir_fd: int, name: str, ino: int) -> int:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        st = statx(fd, "")
        if st.ino != ino or st.mnt_id != self.mnt_id:
            os.close(fd)
            raise HomeRemoveFailed(
                f"{name!r} changed while the home was walked, or is on another mount; stopped"
            )
        return fd

    def walk(self, leave: bool = False) -> Generator[tuple[str, int, str, Entry, bool], None, None]:
        """(relative dir, its fd, name, entry, left) for every entry, a directory before
        its contents; with ``leave``, each directory again after them (``left`` True, its
        own descriptor closed). Entries on another mount are yielded but not entered.
        One descriptor is open per level."""
        # (fd, relative path, names left, own name, own entry: None for the home itself)
        stack: list[tuple[int, str, list[str], str, Entry | None]] = [
            (os.dup(self.fd), "", sorted(os.listdir(self.fd), reverse=True), "", None)
        ]
        try:
            while stack:
                fd, rel, names, me, entry = stack[-1]
                if not names:
                    os.close(fd)
                    stack.pop()
                    if leave and stack and entry is not None:
                        yield stack[-1][1], stack[-1][0], me, entry, True
                    continue
                name = names.pop()
                e = statx(fd, name)
                yield rel, fd, name, e, False
                if stat.S_ISDIR(e.mode) and e.mnt_id == self.mnt_id:
                    if len(stack) > MAX_DEPTH:
                        raise HomeRefused(
                            f"{self.path} is nested more than {MAX_DEPTH} levels deep; remove it by hand"
                        )
                    sub = self._open_dir(fd, name, e.ino)
                    stack.append(
                        (
                            sub,
                            f"{rel}/{name}" if rel else name,
                            sorted(os.listdir(sub), reverse=True),
                            name,
                            e,
                        )
                    )
        finally:
            for fd, *_ in stack:
                os.close(fd)

    def where(self, rel: str, name: str) -> str:
        return "/".join(p for p in (self.path, rel, name) if p)

    def problems(self) -> list[str]:
        """Why removing this home would reach what is not the tenant's, or stop half-way."""
        found = [f"{p} is a mount point (mount ID {i})" for i, p in mounts_under(self.path)]
        if self.mount_root and not found:
            found.append(f"{self.path} is itself a mount point")
        if os.fstatvfs(self.fd).f_flag & os.ST_RDONLY:
            found.append(f"{self.path} is on a read-only filesystem")
        with closing(self.walk()) as entries:
            for rel, _fd, name, e, _ in entries:
                where = self.where(rel, name)
                if e.mnt_id != self.mnt_id:
                    if not any(p.startswith(where + " ") for p in found):
                        found.append(f"{where} is a mount point (mount ID {e.mnt_id})")
                elif e.attributes & (_STATX_ATTR_IMMUTABLE | _STATX_ATTR_APPEND):
                    found.append(f"{where} is immutable or append-only (chattr +i/+a)")
                if len(found) >= NAMED:
                    break
        return found

    def check(self) -> None:
        """Raise :class:`HomeRefused` naming what stands in the way; nothing is changed."""
        found = self.problems()
        if found:
            raise HomeRefused(
                "not removed, nothing was touched: "
                + "; ".join(found[:NAMED])
                + ". Unmount it or clear the attribute (chattr -i), then the "
                "next retention pass removes the home"
            )

    # ------------------------------------------------------------- archive

    def disk_usage(self) -> int:
        """What an archive of the home holds at most, before compression: each regular
        file's bytes on disk (``st_blocks``, not its apparent size; a hard link once)
        and a header block or two per entry."""
        total, seen = 2 * _BLOCK, set()
        with closing(self.walk()) as entries:
            for _rel, _fd, _name, e, _ in entries:
                total += _HEADER
                if stat.S_ISREG(e.mode) and e.ino not in seen:
                    seen.add(e.ino)
                    total += min(e.size, e.disk) + _BLOCK
        return total

    def archive(self, dest: str) -> str:
        """Write a tar.gz of the home to ``dest`` (root only; links stored as links,
        sparse files as their data). Refused (:class:`HomeRefused`, nothing written)
        when the destination's free space is below what the home holds on disk
        (:meth:`disk_usage`)."""
        need = self.disk_usage()
        vfs = os.statvfs(os.path.dirname(dest) or ".")
        free = vfs.f_bavail * vfs.f_frsize
        if free < need:
            log.warning("home %s not archived: may need %d bytes, %d free at %s", self.path, need, free, dest)
            raise HomeRefused(
                f"not archived, nothing was touched: the archive of {self.path} may need "
                f"{_size(need)} and {os.path.dirname(dest)} has {_size(free)} free; free space "
                "there or set TENANT_RETENTION_ARCHIVE_DIR to a larger disk, then the next "
                "retention pass archives the home"
            )
        part = dest + ".partial"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
                top = statx(self.fd, "")
                tar.addfile(self._info(self.name, top))
                links: dict[int, str] = {}
                with closing(self.walk()) as entries:
                    for rel, dfd, name, e, _ in entries:
                        if e.mnt_id != self.mnt_id:
                            raise HomeRemoveFailed(f"{self.where(rel, name)} is a mount point; not archived")
                        arc = "/".join(p for p in (self.name, rel, name) if p)
                        self._add(tar, dfd, name, arc, e, links)
            os.rename(part, dest)
        except BaseException:
            try:
                os.unlink(part)
            except OSError:
                pass
            raise
        return dest

    @staticmethod
    def _info(arc: str, e: Entry) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arc)
        info.mode, info.uid, info.gid, info.mtime = e.mode & 0o7777, e.uid, e.gid, e.mtime
        info.type = tarfile.DIRTYPE if stat.S_ISDIR(e.mode) else tarfile.REGTYPE
        return info

    def _add(
        self, tar: tarfile.TarFile, dfd: int, name: str, arc: str, e: Entry, links: dict[int, str]
    ) -> None:
        info = self._info(arc, e)
        if stat.S_ISDIR(e.mode):
            tar.addfile(info)
        elif stat.S_ISLNK(e.mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dfd)
            tar.addfile(info)
        elif stat.S_ISFIFO(e.mode):
            info.type = tarfile.FIFOTYPE
            tar.addfile(info)
        elif stat.S_ISREG(e.mode):
            if e.nlink > 1 and e.ino in links:
                info.type, info.linkname = tarfile.LNKTYPE, links[e.ino]
                tar.addfile(info)
                return
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != e.ino or not stat.S_ISREG(st.st_mode):
                    raise HomeRemoveFailed(f"{arc} changed while it was archived; stopped")
                segments = data_segments(f.fileno(), st.st_size)
                if sum(n for _, n in segments) < st.st_size:
                    _add_sparse(tar, info, f.fileno(), st.st_size, segments)
                else:
                    info.size = st.st_size
                    tar.addfile(info, f)
            if e.nlink > 1:
                links[e.ino] = arc
        # Sockets and device nodes have no content to keep.

    # -------------------------------------------------------------- remove

    def remove(self) -> None:
        """Remove everything below the home (post-order, by descriptor), then the home."""
        with closing(self.walk(leave=True)) as entries:
            for rel, fd, name, e, left in entries:
                if e.mnt_id != self.mnt_id:
                    raise HomeRemoveFailed(f"{self.where(rel, name)} is a mount point; stopped before it")
                if stat.S_ISDIR(e.mode) and not left:
                    continue  # removed when left, once empty
                try:
                    (os.rmdir if left else os.unlink)(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise HomeRemoveFailed(
                        f"cannot remove {self.where(rel, name)}: {exc.strerror}; stopped there"
                    ) from exc
        try:
            os.rmdir(self.name, dir_fd=self.root_fd)
        except OSError as exc:
            raise HomeRemoveFailed(f"cannot remove {self.path}: {exc.strerror}") from exc


_BLOCK = tarfile.BLOCKSIZE
#: A tar header with a pax header before it (long names, ids): a generous bound.
_HEADER = 4 * _BLOCK


def _size(n: int) -> str:
    from mtgpu.config.units import format_size

    return format_size(n)


def data_segments(fd: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of each stretch of ``fd`` that holds data, by ``SEEK_DATA`` and
    ``SEEK_HOLE``; the whole file where the filesystem cannot tell."""
    out: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if end > start:
                out.append((start, end - start))
            pos = end
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return [(0, size)]
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return out


class _SparseData:
    """The data area of a GNU sparse 1.0 member: the map (entry count, then offset and
    length of each data segment, one decimal number a line, padded to a block), then
    the segments' bytes. A segment read short (the file shrank) is padded with zeros,
    so the member stays as long as its header says."""

    def __init__(self, fd: int, segments: list[tuple[int, int]]) -> None:
        text = "".join(f"{n}\n" for n in [len(segments), *(x for seg in segments for x in seg)])
        head = text.encode()
        self.head = head + b"\0" * (-len(head) % _BLOCK)
        self.fd, self.segments = fd, segments
        self.size = len(self.head) + sum(n for _, n in segments)
        self._pos, self._seg, self._off = 0, 0, 0

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        want = self.size if n < 0 else n
        if self._pos < len(self.head):
            piece = self.head[self._pos : self._pos + want]
            self._pos += len(piece)
            out += piece
        while len(out) < want and self._seg < len(self.segments):
            start, length = self.segments[self._seg]
            take = min(want - len(out), length - self._off, 1 << 20)
            piece = os.pread(self.fd, take, start + self._off) or b""
            piece = piece + b"\0" * (take - len(piece))
            out += piece
            self._off += take
            if self._off == length:
                self._seg, self._off = self._seg + 1, 0
        return bytes(out)


def _add_sparse(
    tar: tarfile.TarFile, info: tarfile.TarInfo, fd: int, size: int, segments: list[tuple[int, int]]
) -> None:
    """Add a sparse file as GNU tar's sparse format 1.0 (pax headers naming the real
    name and size; GNU tar and Python's tarfile restore its holes)."""
    if not segments or sum(segments[-1]) < size:
        # An empty segment at the end, as GNU tar writes it: its readers take the
        # file's length from the map.
        segments = [*segments, (size, 0)]
    data = _SparseData(fd, segments)
    real = info.name
    head, _, tail = real.rpartition("/")
    info.name = f"{head}/GNUSparseFile.0/{tail}" if head else f"GNUSparseFile.0/{tail}"
    info.pax_headers = {
        # Its own "path" first, so that readers apply the real name after it.
        "path": info.name,
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": real,
        "GNU.sparse.realsize": str(size),
    }
    info.size = data.size
    tar.addfile(info, data)
