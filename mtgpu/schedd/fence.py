"""Where a tenant's processes live: its session cgroup and its private mount namespace.

Every process a tenant starts through MTGPU (a login shell, the tmux server and its
panes, an exec command, ``sftp-server``) starts in the tenant's **session cgroup**,
``mtgpu.slice/tenant-UID`` in every hierarchy (v1 controllers and the v2 tree):

- ``memory`` bounds it at ``SESSION_MEMORY`` (swap included where accounted), and
  ``mtgpu.slice`` itself, all tenants' sessions together, at ``SESSIONS_MEMORY``: the
  session pool, which the scheduler does not offer to jobs (:meth:`TenantFence.offered_ram`),
  so job reservations and sessions together never ask for more than the host's RAM;
- ``pids`` at ``SESSION_PIDS``;
- ``cpu`` weights it at ``SESSION_CPU_WEIGHT`` against other tenants' sessions;
- ``devices`` (v1) denies every GPU device file, so a session opens none of them,
  reserved or not: GPU work goes through jobs and allocations;
- ``freezer`` lets the daemon end everything the tenant runs at once.

A job's processes stay in the job's own cgroup: asking the tenant's tmux server to
run something only starts it in the session cgroup, which has no GPUs and its own
limits. No tenant process can move itself: ``cgroup.procs`` files are root's.

Each tenant also gets one **mount namespace** per host, made at its first login (or
job) and kept alive by a bind mount of its ``ns/mnt`` file under
``RUN_DIR/tenants``, as ``ip netns`` keeps network namespaces. Later sessions and
the tenant's jobs enter it (``setns``); a daemon that lost the binding (restarted in
a namespace of its own) finds it again in the tenant's processes, but only one it
made itself: its tmpfs is named ``mtgpu-tmp-UID-TAG``, TAG from ``RUN_DIR``, so a
second daemon on the host never adopts the first one's. In it ``/tmp``, ``/var/tmp`` and
``/dev/shm`` are directories of one tmpfs of ``PRIVATE_TMP_SIZE`` whose pages are
charged to the memory cgroup of whoever writes them (the session's or the job's),
and ``/proc`` is a fresh mount with ``hidepid=invisible``, so a tenant sees only its
own processes. MTGPU's own directories that lie under those places (as in test
setups) are bound back in, so homes and the API socket stay where they are.

With ``TENANT_NETWORK: private`` each tenant also gets a network namespace of its
own (:mod:`mtgpu.schedd.netns`), entered beside the mount namespace.

Fail closed: a part that is configured but cannot be set up for a tenant (its session
cgroup, its private /tmp, its network namespace, or ``setpriv`` to start anything
fenced) raises :class:`~mtgpu.errors.FenceError`, naming the part and what the admin
can do, and the login, job, forward or workspace is refused; nothing of the tenant
runs with less isolation than configured. Each cause is logged once per tenant
(:class:`~mtgpu.schedd.netns.Refusals`) and listed by ``mtgpu-setup status``.

Nothing here ever runs as a tenant or reads tenant-controlled paths: every path is
root's (cgroup files, ``RUN_DIR``).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mtgpu.errors import CommandError
from mtgpu.proc import run
from mtgpu.schedd import bpfdev, cgroups
from mtgpu.schedd.cgroups import CgroupSystem
from mtgpu.schedd.netns import Refusals, TenantNetwork, mount_point, release_file

if TYPE_CHECKING:
    from mtgpu.config import Options

log = logging.getLogger("mtgpu.schedd.fence")

#: The slice under which every tenant's session cgroup is made.
SLICE = "mtgpu.slice"
#: The v1 controllers a session cgroup uses.
SESSION_V1_CONTROLLERS = ("memory", "pids", "cpu", "devices", "freezer")
#: The v2 controllers a session cgroup uses (devices has no v2 file interface).
SESSION_V2_CONTROLLERS = ("memory", "pids", "cpu")
#: The directories a tenant gets its own copy of.
PRIVATE_PLACES = ("/tmp", "/var/tmp", "/dev/shm")
#: hidepid is per /proc mount (not per PID namespace) from this kernel on.
HIDEPID_KERNEL = (5, 8)
#: The fence parts set up here, as refusals name them, and what the admin can do.
TMP_PART = "private /tmp, /var/tmp and /dev/shm (PRIVATE_TMP)"
TMP_FIX = "see the cause in `mtgpu-setup status` or the daemon's log and remove it, or set PRIVATE_TMP: false"
CGROUP_PART = f"session cgroup ({SLICE}/tenant-UID)"
CGROUP_FIX = "see the cause in `mtgpu-setup status` or the daemon's log and repair the cgroup hierarchy"
SPAWN_PART = "session fence (setpriv)"

# Runs as root with only our own paths as arguments: joins the session cgroups, then
# execs what follows "--" (nsenter and setpriv, then the tenant's program).
_JOIN = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || { echo "mtgpu: cannot join the '
    'session cgroup $1" >&2; exit 126; }; shift; done; shift; exec "$@"'
)

# Runs as root in the new mount namespace. $1 the tmpfs size, $2 its source name
# (:meth:`TenantFence.tmp_source`), $3 a root-only staging directory, $4 1 to mount
# /proc with hidepid, then the directories to bind back.
_SETUP = r"""set -eu
size=$1 source=$2 stage=$3 hide=$4; shift 4
mount -t tmpfs -o "size=$size,mode=0700,nosuid,nodev" "$source" "$stage"
for d in tmp var-tmp shm; do mkdir -m 1777 "$stage/$d"; chmod 1777 "$stage/$d"; done
for p in "$@"; do
  case "$p" in
    /tmp/*) rel=tmp/${p#/tmp/} ;;
    /var/tmp/*) rel=var-tmp/${p#/var/tmp/} ;;
    /dev/shm/*) rel=shm/${p#/dev/shm/} ;;
    *) continue ;;
  esac
  [ -d "$p" ] || continue
  (umask 022; mkdir -p "$stage/$rel")
  mount --rbind "$p" "$stage/$rel"
  # A bound-back directory holding the staging mount got a copy of it: drop that.
  case "$stage" in "$p"/*) umount -l "$stage/$rel${stage#"$p"}" ;; esac
done
mount --rbind "$stage/var-tmp" /var/tmp
mount --rbind "$stage/shm" /dev/shm
mount --rbind "$stage/tmp" /tmp
# The staging mount goes; where it lay under /tmp (test setups) it is hidden already.
umount -l "$stage" 2>/dev/null || true
if [ "$hide" = 1 ]; then mount -t proc -o nosuid,nodev,noexec,hidepid=invisible proc /proc; fi
"""


@dataclass(frozen=True)
class SessionLimits:
    """The limits of every tenant's session cgroup (``SESSION_*`` keys)."""

    memory: int | None = None
    #: All tenants' sessions together (``SESSIONS_MEMORY``, on ``mtgpu.slice``).
    pool: int | None = None
    pids: int | None = 4096
    cpu_weight: int = 100
    #: ``none``: sessions open no GPU; ``free``: the GPUs no job holds (SESSION_GPUS).
    gpus: str = "none"


def session_dirs(system: CgroupSystem, uid: int, own: dict[str, str] | None = None) -> dict[str, str]:
    """The session cgroup of ``uid`` in each hierarchy: controller (or ``v2``) -> dir.

    On v1 it nests under the daemon's own cgroup, as jobs do, so limits set on the
    daemon's cgroup bound its tenants too; a v2-only host puts it at the top, since
    a v2 cgroup holding processes cannot hand controllers to children. A hybrid
    host's controller-less v2 tree gets it too, for process tracking.

    >>> s = CgroupSystem({"pids": "/cg/pids"}, "/cg/unified")
    >>> session_dirs(s, 20001, {"pids": "/a", "": "/"})
    {'pids': '/cg/pids/a/mtgpu.slice/tenant-20001', 'v2': '/cg/unified/mtgpu.slice/tenant-20001'}
    """
    own = cgroups.own_paths() if own is None else own
    name = f"{SLICE}/tenant-{uid}"
    out = {
        c: os.path.normpath(f"{m}/{own.get(c, '/')}/{name}")
        for c, m in system.v1.items()
        if c in SESSION_V1_CONTROLLERS
    }
    if system.v2:
        base = own.get("", "/") if system.v1 else "/"
        out["v2"] = os.path.normpath(f"{system.v2}/{base}/{name}")
    return out


def kernel_at_least(release: str, want: tuple[int, int]) -> bool:
    """Whether a kernel ``release`` string is ``want`` or newer.

    >>> kernel_at_least("6.1.0-18-amd64", (5, 8)), kernel_at_least("5.4.0", (5, 8))
    (True, False)
    """
    nums = []
    for part in release.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit()) or "0"
        nums.append(int(digits))
    return tuple(nums + [0] * (2 - len(nums))) >= want


class TenantFence:
    """The session cgroups and private namespaces of this host's tenants.

    ``ns_dir`` is a root-only directory (``RUN_DIR/tenants``) for the namespace
    files; ``tmp_size`` is ``None`` to leave ``/tmp`` shared (``PRIVATE_TMP: false``).
    ``keep`` are MTGPU's own directories, bound back where they lie under a private
    place.
    """

    def __init__(
        self,
        system: CgroupSystem,
        limits: SessionLimits,
        ns_dir: str,
        *,
        tmp_size: int | None,
        keep: Iterable[str] = (),
        hidepid: bool = True,
    ) -> None:
        self.system = system
        self.limits = limits
        self.ns_dir = ns_dir
        self.tmp_size = tmp_size
        self.keep = tuple(sorted({os.path.normpath(k) for k in keep if k}))
        #: Names the namespaces this daemon makes, the same after a restart: daemons
        #: on one host have RUN_DIRs of their own.
        self.tag = hashlib.sha256(os.path.realpath(ns_dir).encode()).hexdigest()[:12]
        self.hidepid = hidepid and kernel_at_least(os.uname().release, HIDEPID_KERNEL)
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self.tools = {t: shutil.which(t) for t in ("nsenter", "setpriv", "unshare")}
        self._ns_ready = False
        #: With SESSION_GPUS free: the device numbers jobs hold now, and the session
        #: devices cgroups that follow them.
        self._held_devices: set[tuple[int, int]] = set()
        self._free_dirs: set[str] = set()
        #: Namespaces found again that could not be bound: uid -> descriptor.
        self._held: dict[int, int] = {}
        #: Each tenant's network namespace (TENANT_NETWORK), None to share the host's.
        self.network: TenantNetwork | None = None
        #: The parts that cannot be set up now, per tenant (shared with the network's).
        self.refusals = Refusals()

    def refused(self) -> list[dict[str, object]]:
        """The tenants' fence parts refused now (for ``mtgpu-setup status``)."""
        return self.refusals.now()

    def keep_also(self, paths: Iterable[str]) -> None:
        """Bind ``paths`` back too in the namespaces made from now on (what the daemon
        learns after start: the prefixes of published interpreters, a reload's
        datasets)."""
        self.keep = tuple(sorted({*self.keep, *(os.path.normpath(k) for k in paths if k)}))

    # ------------------------------------------------------------- reporting

    def lacking(self) -> list[str]:
        """One line per protection this kernel or host cannot give (empty when none)."""
        out = []
        have = set(self.system.v1)
        v2 = self.system.v2_controllers if self.system.v2 and not self.system.v1 else frozenset()
        for ctrl, what in (
            ("memory", "SESSION_MEMORY and SESSIONS_MEMORY are not enforced"),
            ("pids", "SESSION_PIDS is not enforced"),
            ("cpu", "SESSION_CPU_WEIGHT is not applied"),
        ):
            if ctrl not in have and ctrl not in v2:
                out.append(f"no {ctrl} cgroup controller: {what} for sessions")
        if "devices" not in have and not v2:
            out.append(
                "no cgroup v1 devices controller: sessions are not walled off from GPU "
                "device files (only the GPU visibility variables guard them)"
            )
        elif "devices" not in have and self.limits.gpus == "free":
            out.append(
                "cgroup v2 with SESSION_GPUS: free: sessions are not walled off from GPU "
                "device files (only the GPU visibility variables guard them); SESSION_GPUS: none walls them"
            )
        elif "devices" not in have and (why := bpfdev.unavailable()):
            out.append(
                f"cgroup v2 without BPF device programs ({why}): sessions and jobs are not walled "
                "off from GPU device files (only the GPU visibility variables guard them)"
            )
        if not self.tools["setpriv"]:
            out.append("setpriv (util-linux) is missing: tenants' sessions are refused")
        if self.tmp_size is not None and not (self.tools["nsenter"] and self.tools["unshare"]):
            out.append(
                "nsenter/unshare (util-linux) are missing: tenants' sessions and jobs "
                "are refused (PRIVATE_TMP: false would let them share /tmp)"
            )
        if self.network is not None and self.network.wanted and self.network.unsupported():
            out.append(
                f"TENANT_NETWORK is private but {self.network.unsupported()}: tenants' "
                "sessions and jobs are refused (TENANT_NETWORK: shared would let them "
                "share the host's loopback)"
            )
        if self.tmp_size is not None and not self.hidepid:
            out.append(
                f"kernel {os.uname().release} is older than 5.8: /proc is not mounted "
                "with hidepid (it would apply to the whole host), so tenants see "
                "each other's processes"
            )
        return out

    def describe(self) -> str:
        """What sessions get, for the daemon's start-up log."""
        from mtgpu.config.units import format_size

        lim = self.limits
        return (
            f"sessions run in {SLICE}/tenant-UID (memory "
            f"{format_size(lim.memory) if lim.memory else 'unlimited'} each, "
            f"{format_size(lim.pool) if lim.pool else 'unlimited'} for all, pids "
            f"{lim.pids or 'unlimited'}, cpu weight {lim.cpu_weight}, "
            f"{'GPUs no job holds' if lim.gpus == 'free' else 'no GPU devices'}); private "
            f"/tmp, /var/tmp, /dev/shm: {format_size(self.tmp_size) if self.tmp_size else 'off'}"
            f"{', /proc hidepid' if self.tmp_size and self.hidepid else ''}"
        )

    # -------------------------------------------------------------- cgroups

    def session_cgroup(self, uid: int, gid: int) -> list[str]:
        """Make (or refresh) ``uid``'s session cgroup; its ``cgroup.procs`` files.
        Each directory is root's with group ``gid`` (0750) and ``mtgpu.slice`` cannot be
        listed (0711): no tenant reads another's PIDs or sees who has sessions.

        A controller whose cgroup cannot be made (or, for ``devices``, walled off
        from the GPUs) raises :class:`FenceError`: the session is refused. A limit
        the kernel refuses to lower is logged (:func:`_write_limit`).
        """
        dirs = session_dirs(self.system, uid)
        procs = []
        try:
            majors = cgroups.gpu_majors(Path("/proc/devices").read_text())
        except OSError:
            majors = set(cgroups.FIXED_GPU_MAJORS)
        for ctrl, path in dirs.items():
            try:
                if ctrl == "v2":
                    self._setup_v2(path, majors, gid)
                else:
                    os.makedirs(path, exist_ok=True)
                    self._seal(path, gid)
                    self._setup_v1(ctrl, path, majors)
                procs.append(f"{path}/cgroup.procs")
            except OSError as exc:
                raise self.refusals.refuse(uid, CGROUP_PART, f"{ctrl} at {path}: {exc}", CGROUP_FIX) from exc
        self.refusals.cleared(uid, CGROUP_PART)
        return procs

    def _setup_v1(self, ctrl: str, path: str, majors: set[int]) -> None:
        lim = self.limits
        if ctrl == "memory":
            _write_pool_v1(os.path.dirname(path), lim.pool)
            value = str(lim.memory) if lim.memory else "-1"
            _write_limit(f"{path}/memory.limit_in_bytes", value)
            if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):
                _write_limit(f"{path}/memory.memsw.limit_in_bytes", value)
        elif ctrl == "pids":
            _write_limit(f"{path}/pids.max", str(lim.pids) if lim.pids else "max")
        elif ctrl == "cpu":
            # cpu.shares is v1's weight: 1024 is the default, as 100 is for cpu.weight.
            _write_limit(f"{path}/cpu.shares", str(max(2, lim.cpu_weight * 1024 // 100)))
        elif ctrl == "devices":
            if lim.gpus == "free":
                # Minor by minor, so that a GPU a job gives back can be allowed again
                # (the kernel drops an exact deny on a matching allow). A cgroup left
                # with a wildcard deny (SESSION_GPUS was none) is reset first: only
                # "a" removes a wildcard.
                if path not in self._free_dirs:
                    cgroups._write(f"{path}/devices.allow", "a")
                for ma, mi in sorted(self._held_devices):
                    cgroups._write(f"{path}/devices.deny", f"c {ma}:{mi} rwm")
                self._free_dirs.add(path)
            else:
                for rule in cgroups.device_deny_rules([], majors):
                    cgroups._write(f"{path}/devices.deny", rule)

    @staticmethod
    def _seal(path: str, gid: int) -> None:
        cgroups.unlisted(os.path.dirname(path))
        cgroups.seal(path, gid)

    def _setup_v2(self, path: str, majors: set[int], gid: int) -> None:
        top = Path(path).parent.parent
        made = not os.path.isdir(path)
        os.makedirs(path, exist_ok=True)
        self._seal(path, gid)
        if self.system.v1:
            return  # a hybrid host's v2 tree has no controllers: membership only
        lim = self.limits
        if made and lim.gpus != "free":
            # The GPU wall, before any process enters: a BPF device program the
            # cgroup keeps for its life (a failure refuses the session).
            bpfdev.attach(path, [], majors)
        for p in (top, Path(path).parent):
            for c in SESSION_V2_CONTROLLERS:
                if c in self.system.v2_controllers:
                    try:
                        cgroups._write(str(p / "cgroup.subtree_control"), f"+{c}")
                    except OSError:
                        pass
        if "memory" in self.system.v2_controllers:
            slice_ = str(Path(path).parent)
            _write_pool(f"{slice_}/memory.max", str(lim.pool) if lim.pool else "max")
            if os.path.exists(f"{slice_}/memory.swap.max"):
                _write_pool(f"{slice_}/memory.swap.max", "0" if lim.pool else "max")
        for fname, value in (
            ("memory.max", str(lim.memory) if lim.memory else "max"),
            ("memory.swap.max", "0" if lim.memory else "max"),
            ("pids.max", str(lim.pids) if lim.pids else "max"),
            ("cpu.weight", str(lim.cpu_weight)),
        ):
            if os.path.exists(f"{path}/{fname}"):
                _write_limit(f"{path}/{fname}", value)

    def sessions_memory_used(self) -> int:
        """What all tenants' sessions hold in memory now (their processes' own pages and
        their tmpfs pages, without page cache the kernel can drop), from ``mtgpu.slice``'s
        ``memory.stat``; 0 when it cannot be read."""
        v1 = "memory" in self.system.v1
        path = session_dirs(self.system, 0).get("memory" if v1 else "v2")
        if path is None:
            return 0
        keys = ("total_rss", "total_shmem") if v1 else ("anon", "shmem")
        try:
            text = Path(os.path.dirname(path), "memory.stat").read_text()
        except OSError:
            return 0
        stats = dict(ln.split(None, 1) for ln in text.splitlines() if " " in ln)
        try:
            return sum(int(stats.get(k, 0)) for k in keys)
        except ValueError:
            return 0

    def offered_ram(self, total: int, used: int) -> tuple[int, int]:
        """(total, used) RAM as the scheduler offers it to jobs: the host's ``total``
        less the session pool (``SESSIONS_MEMORY``), and what is ``used`` less what the
        sessions hold inside that pool (it is theirs, not the jobs').

        >>> f = TenantFence(CgroupSystem({}, None), SessionLimits(pool=100), "/nonexistent", tmp_size=None)
        >>> f.offered_ram(1000, 300)
        (900, 300)
        """
        pool = self.limits.pool
        if not pool:
            return total, used
        sessions = min(pool, self.sessions_memory_used())
        return max(0, total - pool), max(0, used - sessions)

    def set_held_gpus(self, devices: Iterable[tuple[int, int]]) -> None:
        """With ``SESSION_GPUS: free``, wall sessions off exactly the GPU device
        numbers jobs hold now, giving back the ones released. A device a session
        opened before a job took it stays open (the kernel checks at open)."""
        if self.limits.gpus != "free":
            return
        held = set(devices)
        taken, freed = held - self._held_devices, self._held_devices - held
        self._held_devices = held
        for path in sorted(self._free_dirs):
            if not os.path.isdir(path):
                self._free_dirs.discard(path)
                continue
            for fname, devs in (("devices.deny", taken), ("devices.allow", freed)):
                for ma, mi in sorted(devs):
                    try:
                        cgroups._write(f"{path}/{fname}", f"c {ma}:{mi} rwm")
                    except OSError as exc:
                        log.warning("session GPUs: %s %d:%d in %s: %s", fname, ma, mi, path, exc)

    def remove_cgroup(self, uid: int) -> None:
        """End every process in ``uid``'s session cgroup and remove the cgroup."""
        cg = cgroups.JobCgroup(session_dirs(self.system, uid))
        cg.dirs = {k: v for k, v in cg.dirs.items() if os.path.isdir(v)}
        if not cg.dirs:
            return
        import signal

        cg.signal_all(signal.SIGKILL)
        cg.remove()

    # ------------------------------------------------------------ namespace

    def namespace(self, uid: int) -> str | None:
        """The file of ``uid``'s private mount namespace, made on first use; None only
        when ``PRIVATE_TMP`` is off. Raises :class:`FenceError` when it is on and the
        namespace cannot be made (the cause is logged once)."""
        if self.tmp_size is None:
            return None
        if not (self.tools["unshare"] and self.tools["nsenter"]):
            raise self.refusals.refuse(
                uid,
                TMP_PART,
                "nsenter/unshare (util-linux) are missing",
                "install util-linux, or set PRIVATE_TMP: false",
            )
        path = os.path.join(self.ns_dir, f"{uid}.mnt")
        with self._guard:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            try:
                found = self._namespace_locked(uid, path)
            except (OSError, CommandError) as exc:
                raise self.refusals.refuse(uid, TMP_PART, str(exc), TMP_FIX) from exc
            self.refusals.cleared(uid, TMP_PART)
            return found

    def _namespace_locked(self, uid: int, path: str) -> str:
        if os.path.ismount(path):
            return path
        if uid in self._held:
            return f"/proc/{os.getpid()}/fd/{self._held[uid]}"
        found = self._find_namespace(uid, path)
        if found:
            return found
        self._make_namespace(uid, path)
        return path

    def tmp_source(self, uid: int) -> str:
        """The source name of the tmpfs of ``uid``'s private places in the namespaces
        this daemon makes (``mtgpu-tmp-UID-TAG``, :attr:`tag`): how it tells its own
        from another daemon's on the same host, whose tenant is in the same session
        cgroup."""
        return f"mtgpu-tmp-{uid}-{self.tag}"

    def _prepare_dir(self) -> None:
        if self._ns_ready:
            return
        os.makedirs(self.ns_dir, mode=0o700, exist_ok=True)
        st = os.lstat(self.ns_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise OSError(f"{self.ns_dir} is not a directory of root's: remove it and restart the daemon")
        os.chmod(self.ns_dir, 0o700)
        # A namespace file can only be bound onto a mount that does not propagate;
        # unbindable also keeps the files out of recursive binds of RUN_DIR. A daemon
        # killed earlier may have left the directory bound (and unbindable) already:
        # binding it again would fail, so it is taken as it is.
        if not mount_point(self.ns_dir):
            run(["mount", "--bind", self.ns_dir, self.ns_dir], check=True, timeout=30)
        run(["mount", "--make-unbindable", self.ns_dir], check=True, timeout=30)
        self._ns_ready = True

    def _stage(self) -> str:
        # Outside ns_dir, which is unbindable and so cannot be a bind source; the
        # tmpfs mounted on it exists only in the new namespace.
        stage = os.path.join(os.path.dirname(self.ns_dir), "tenants-stage")
        os.makedirs(stage, mode=0o700, exist_ok=True)
        return stage

    def _make_namespace(self, uid: int, path: str) -> None:
        self._prepare_dir()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        argv = [
            str(self.tools["unshare"]),
            f"--mount={path}",
            "--propagation",
            "slave",
            "/bin/sh",
            "-c",
            _SETUP,
            "mtgpu-private-tmp",
            str(self.tmp_size),
            self.tmp_source(uid),
            self._stage(),
            "1" if self.hidepid else "0",
            *self.keep,
        ]
        # The kernel binds a namespace's file only into an older namespace, and it
        # tells their age by ids handed out in per-CPU batches: a namespace made on
        # one CPU can look older than the daemon's own (when the daemon runs in a
        # namespace of its own, as in tests) and the bind fails with EINVAL. So the
        # namespace is made on each CPU in turn until one takes.
        taskset = shutil.which("taskset")
        cpus = sorted(os.sched_getaffinity(0)) if taskset else []
        for cpu in [None, *cpus]:
            pin = [] if cpu is None else [str(taskset), "-c", str(cpu)]
            r = run(
                [*pin, *argv],
                check=False,
                timeout=60,
                cwd="/",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
            if r.returncode == 0 or "ns/mnt" not in r.stderr:
                break
        if r.returncode != 0:
            if os.path.ismount(path):
                run(["umount", path], check=False, timeout=30)
            raise OSError(f"{' '.join(argv[:4])}... exited {r.returncode}: {r.stderr.strip()[-400:]}")
        log.info("uid %d: private /tmp, /var/tmp and /dev/shm made (%s)", uid, path)

    def _find_namespace(self, uid: int, path: str) -> str | None:
        """Bind ``uid``'s namespace at ``path`` again from one of its session processes
        (a daemon restarted in a namespace of its own lost the binding; the tenant's
        tmux server still lives in it). Only a process in our user namespace counts:
        a mount namespace it is in was made by root, never by the tenant. And only one
        this daemon made (its /tmp is :meth:`tmp_source`): another daemon on this host
        (tests run several) shares the tenant's session cgroup, and its namespace
        shows that daemon's homes and directories, not ours."""
        own_mnt = os.stat("/proc/self/ns/mnt").st_ino
        own_user = os.stat("/proc/self/ns/user").st_ino
        for pid in sorted(self._procs_now(uid)):
            try:
                fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                user = os.stat(f"/proc/{pid}/ns/user").st_ino
                status = Path(f"/proc/{pid}/status").read_text()
                uids = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("Uid:")), [])
                # Checked after the descriptor was opened: it is that process's.
                if (
                    st.st_ino == own_mnt
                    or user != own_user
                    or uids != [str(uid)] * 4
                    or not _has_private_tmp(pid, self.tmp_source(uid))
                    or not self._keeps_ours(pid)
                    or pid not in self._procs_now(uid)
                ):
                    os.close(fd)
                    continue
            except OSError:
                os.close(fd)
                continue
            log.info("uid %d: private /tmp found again in process %d", uid, pid)
            try:
                self._prepare_dir()
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
                run(
                    ["mount", "--bind", f"/proc/self/fd/{fd}", path],
                    check=True,
                    timeout=30,
                    pass_fds=(fd,),
                )
            except (OSError, CommandError):
                # The kernel binds a namespace's file only into a namespace older than
                # it (a daemon restarted in a namespace of its own is newer than its
                # tenants'): hold the descriptor instead, reached as /proc/PID/fd/N.
                self._held[uid] = fd
                return f"/proc/{os.getpid()}/fd/{fd}"
            os.close(fd)
            return path
        return None

    def _keeps_ours(self, pid: int) -> bool:
        """Whether ``pid``'s namespace shows this daemon's directories that lie under a
        private place (bound back when it was made). Another daemon's tenant namespace
        (several daemons on one host share the session cgroup, as in tests) or one made
        before RUN_DIR moved hides them: entering it would hide the tools and socket."""
        for k in self.keep:
            if not any(k == p or k.startswith(p + "/") for p in PRIVATE_PLACES):
                continue
            try:
                here = os.stat(k)
            except OSError:
                continue
            try:
                there = os.stat(f"/proc/{pid}/root{k}")
            except OSError:
                return False
            if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
                return False
        return True

    def _procs_now(self, uid: int) -> set[int]:
        dirs = session_dirs(self.system, uid)
        path = dirs.get("pids") or dirs.get("freezer") or dirs.get("v2")
        if path is None:
            return set()
        try:
            return {int(x) for x in Path(path, "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def net_namespace(self, uid: int) -> str | None:
        """The file of ``uid``'s network namespace (made on first use), None when
        tenants share the host's network (``TENANT_NETWORK: shared``). Raises
        :class:`FenceError` when it is private and cannot be made."""
        if self.network is None:
            return None
        return self.network.namespace(uid)

    def remove_namespace(self, uid: int) -> None:
        """Let ``uid``'s namespace go (its tmpfs is freed with its last process)."""
        path = os.path.join(self.ns_dir, f"{uid}.mnt")
        held = self._held.pop(uid, None)
        if held is not None:
            os.close(held)
        release_file(path)

    def remove(self, uid: int) -> None:
        """Clean everything of ``uid`` here: its processes, cgroup, private /tmp and
        private network."""
        self.remove_cgroup(uid)
        self.remove_namespace(uid)
        if self.network is not None:
            self.network.remove(uid)

    # ------------------------------------------------------------ spawning

    def prefix(self, uid: int, gid: int, groups: Sequence[int], cwd: str) -> list[str]:
        """The argv that starts a tenant program fenced: run as root, it joins the
        session cgroup, enters the private namespace, becomes the tenant and execs
        what follows. Raises :class:`FenceError` when a part cannot be set up (or
        setpriv is missing): the program is not started at all."""
        setpriv = self.tools["setpriv"]
        if not setpriv:
            raise self.refusals.refuse(
                uid, SPAWN_PART, "setpriv (util-linux) is missing", "install util-linux"
            )
        procs = self.session_cgroup(uid, gid)
        ns = self.namespace(uid)
        net = self.net_namespace(uid)
        return fenced_argv(
            procs, ns, net, uid, gid, groups, cwd, setpriv=setpriv, nsenter=str(self.tools["nsenter"])
        )


def fenced_argv(
    procs: Sequence[str],
    mount_ns: str | None,
    net_ns: str | None,
    uid: int,
    gid: int,
    groups: Sequence[int],
    cwd: str,
    *,
    setpriv: str | None = None,
    nsenter: str | None = None,
    title: str = "mtgpu-session",
) -> list[str]:
    """The one argv prefix that starts a program as a tenant: run as root, it joins the
    cgroups whose ``cgroup.procs`` files are ``procs``, enters the mount and network
    namespaces, becomes ``uid`` and execs what follows. A session's (:meth:`TenantFence.prefix`)
    or an ended job's (its container's removal, in the job's own cgroups)."""
    setpriv = setpriv or shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"
    nsenter = nsenter or shutil.which("nsenter", path="/usr/bin:/bin") or "/usr/bin/nsenter"
    argv = ["/bin/sh", "-c", _JOIN, title, *procs, "--"]
    if mount_ns or net_ns:
        argv += [
            nsenter,
            *([f"--mount={mount_ns}"] if mount_ns else []),
            *([f"--net={net_ns}"] if net_ns else []),
            f"--wd={cwd}",
            "--",
        ]
    argv += [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
        "--",
    ]
    return argv


def _has_private_tmp(pid: int, source: str) -> bool:
    """Whether ``pid``'s /tmp is the tmpfs named ``source`` (:meth:`TenantFence.tmp_source`)
    that :data:`_SETUP` mounted (in a namespace owned by our user namespace, so the
    tenant cannot have mounted it)."""
    try:
        text = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False
    top: list[str] = []  # the last mount on /tmp is the one its processes see
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/tmp" and " - " in line:
            top = line.split(" - ", 1)[1].split()
    return len(top) > 1 and top[0] == "tmpfs" and top[1] == source


def _write_limit(path: str, value: str) -> None:
    """Write a limit; one below what the cgroup holds now is logged, not raised."""
    try:
        cgroups._write(path, value)
    except OSError as exc:
        log.warning("cannot set %s to %s: %s", path, value, exc)


def _write_pool(path: str, value: str) -> None:
    """Write the session pool's limit on ``mtgpu.slice``. One below what the sessions
    hold now is logged (the kernel keeps the old one until they shrink); any other
    failure raises, and the session is refused: the pool is what keeps sessions from
    pushing the host into its global OOM killer."""
    try:
        cgroups._write(path, value)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise OSError(
                exc.errno, f"cannot set the session pool (SESSIONS_MEMORY) {path} to {value}: {exc.strerror}"
            ) from exc
        log.warning("cannot set %s to %s yet: the sessions hold more (%s)", path, value, exc)


def _write_pool_v1(slice_: str, pool: int | None) -> None:
    """v1: ``memory.limit_in_bytes`` never above ``memory.memsw.limit_in_bytes``, so
    the two are written in the order that keeps it so, whether raised or lowered."""
    value = str(pool) if pool else "-1"
    files = [f"{slice_}/memory.limit_in_bytes"]
    if os.path.exists(f"{slice_}/memory.memsw.limit_in_bytes"):
        files.append(f"{slice_}/memory.memsw.limit_in_bytes")
        try:
            current = int(Path(files[0]).read_text())
        except (OSError, ValueError):
            current = 0
        if not pool or pool > current:
            files.reverse()  # raising: the memory+swap limit first
    for f in files:
        _write_pool(f, value)


def memory_limit(spec: int | str | None, total: int) -> int | None:
    """``SESSION_MEMORY`` in bytes: a size, or a share (``50%``) of ``total``.

    >>> memory_limit("50%", 1000), memory_limit(123, 1000), memory_limit(None, 1000)
    (500, 123, None)
    """
    if isinstance(spec, str):
        return int(total * float(spec[:-1]) / 100)
    return spec


def from_options(
    options: Options, *, extra_keep: Iterable[str] = (), loop: asyncio.AbstractEventLoop | None = None
) -> TenantFence:
    """The fence a daemon with ``options`` (an :class:`mtgpu.config.Options`) puts up;
    ``loop`` runs its network's DNS relays."""
    import psutil

    o = options
    total = psutil.virtual_memory().total
    pool = memory_limit(o.sessions_memory, total)
    each = memory_limit(o.session_memory, total)
    limits = SessionLimits(
        # One tenant's sessions never get more than all tenants' sessions together.
        memory=each if pool is None else min(each or pool, pool),
        pool=pool,
        pids=o.session_pids,
        cpu_weight=o.session_cpu_weight,
        gpus=o.session_gpus,
    )
    # Everything the configuration names that tenants or their jobs use.
    # The configuration file's directory: tenants' mt-* tools and mtgpu-admin read
    # it to find the API socket. The pre-pulled image archives: tenants' own podman
    # loads them.
    keep = [
        o.tenant_home_root,
        o.run_dir,
        o.state_dir,
        *o.datasets_directories,
        *(os.path.dirname(i.path) for i in o.python_interpreters),
        *([os.path.dirname(os.path.abspath(o.source))] if o.source else []),
        o.containers.archive_dir,
        *([o.containers.storage] if o.containers.storage.startswith("/") else []),
        *extra_keep,
    ]
    ns_dir = os.path.join(o.run_dir, "tenants")
    f = TenantFence(
        cgroups.detect(), limits, ns_dir, tmp_size=o.private_tmp_size if o.private_tmp else None, keep=keep
    )
    f.network = TenantNetwork(
        ns_dir,
        o.tenant_network_subnet,
        wanted=o.tenant_network == "private",
        prepare=f._prepare_dir,
        loop=loop,
        open_ports=(o.ssh_listen[1], 22),  # this server's and OpenSSH's
    )
    f.network.refusals = f.refusals
    return f
