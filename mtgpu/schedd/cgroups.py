"""Per-job cgroups: which hierarchies a host has, and one job's cgroups in them.

A job's cgroups are created by its supervisor before the job starts, and removed
after its last process has gone. They give the job:

- a memory limit the kernel enforces (``memory.limit_in_bytes``, plus
  ``memory.memsw.limit_in_bytes`` so swap does not stretch it; v2: ``memory.max``
  and ``memory.swap.max``), and an OOM kill counter to tell OUT_OF_MEMORY apart;
- a wall around GPU device files (v1 ``devices``): see :func:`device_deny_rules`;
- a bound on processes (``pids.max``) and the reserved cores (``cpuset``);
- one set of processes to signal: every process of the job, including children
  that called ``setsid()`` and double-forked, with ``freezer`` (v1) or
  ``cgroup.freeze``/``cgroup.kill`` (v2) so that none forks away while we signal.

Semantics of the v1 devices controller, checked on a 6.x kernel: a new cgroup
starts as ``a *:* rwm`` (allow all). Writing ``c 195:1 rwm`` to ``devices.deny``
then makes ``open()`` of 195:1 fail with EPERM, before any driver is asked, while
195:0 still reaches the driver (ENXIO when there is none). A wildcard deny
``c 195:* rwm`` cannot be narrowed by a later ``devices.allow`` of ``c 195:0``:
the write succeeds but changes nothing, because in allow-all mode the kernel only
removes an exception that matches exactly. ``devices.list`` keeps printing
``a *:* rwm`` whatever was denied. So a major with a reserved device is denied
minor by minor, and a major with none is denied with one wildcard.

cgroup v2 guards devices with a BPF program instead (:mod:`mtgpu.schedd.bpfdev`),
attached to the job's cgroup before the job enters it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mtgpu.fsafe import signal_members
from mtgpu.schedd import bpfdev

log = logging.getLogger("mtgpu.schedd.cgroups")

#: The v1 controllers a job uses, in the order they are created.
V1_CONTROLLERS = ("memory", "devices", "pids", "cpuset", "freezer")
#: v1 controllers detected for other users of the hierarchies (tenant sessions'
#: CPU weight, see mtgpu.schedd.fence); jobs do not use them.
OTHER_V1_CONTROLLERS = ("cpu",)
#: The v2 controllers a job uses (``devices`` has no v2 file interface).
V2_CONTROLLERS = ("memory", "pids", "cpuset")
#: Character device names in /proc/devices that belong to GPUs. Some numbers are
#: dynamic (nvidia-uvm, kfd), so they are read at each job start.
GPU_DEVICE_NAMES = frozenset(
    {
        "nvidia-frontend",
        "nvidia",
        "nvidia-uvm",
        "nvidia-caps",
        "nvidia-caps-imex-channels",
        "nvidia-nvlink",
        "nvidia-nvswitch",
        "nvidiactl",
        "kfd",
        "drm",
        "accel",
    }
)
#: NVIDIA's fixed major and the DRM major, which exist even before a driver loads.
FIXED_GPU_MAJORS = frozenset({195, 226})
#: Minors denied one by one on a major that has a reserved device.
MAX_MINOR = 255
#: A job's cgroup is named ``mtgpu_job_ID_HASH`` in every hierarchy; the hash of the
#: job's state directory keeps apart two members of one job on one machine (tests
#: run several hosts on one kernel), whose cgroups would otherwise share a name.
JOB_PREFIX = "mtgpu_job_"


def job_cgroup_name(job_id: str, job_dir: str, attempt: int = 0) -> str:
    """The name of a job's cgroup; each start of a requeued job has its own.

    >>> job_cgroup_name("42", "/var/lib/mtgpu/jobs/42")
    'mtgpu_job_42_cbd466c7'
    >>> job_cgroup_name("42", "/var/lib/mtgpu/jobs/42", 1)
    'mtgpu_job_42_cbd466c7_a1'
    """
    return f"{JOB_PREFIX}{job_id}_{zlib.crc32(job_dir.encode()):08x}" + (f"_a{attempt}" if attempt else "")


@dataclass(frozen=True)
class CgroupSystem:
    """The cgroup hierarchies of this host: v1 controller mounts and the v2 mount."""

    v1: Mapping[str, str] = field(default_factory=dict)
    v2: str | None = None
    v2_controllers: frozenset[str] = frozenset()

    @property
    def version(self) -> str:
        """``v1`` when any v1 controller we use is mounted, else ``v2``, else ``none``."""
        if self.v1:
            return "v1"
        return "v2" if self.v2 else "none"


def detect(mounts: str | None = None) -> CgroupSystem:
    """Read ``/proc/self/mounts`` (or ``mounts``) for writable cgroup hierarchies."""
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text()
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4 or not os.access(parts[1], os.W_OK):
            continue
        if parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in V1_CONTROLLERS or opt in OTHER_V1_CONTROLLERS:
                    v1.setdefault(opt, parts[1])
        elif parts[2] == "cgroup2":
            v2 = parts[1]
    ctrls: frozenset[str] = frozenset()
    if v2:
        try:
            ctrls = frozenset(Path(v2, "cgroup.controllers").read_text().split())
        except OSError:
            pass
    return CgroupSystem(v1, v2, ctrls)


def own_paths(text: str | None = None) -> dict[str, str]:
    """Our cgroup in each hierarchy, from ``/proc/self/cgroup``: controller -> path.

    The v2 path is under the key ``""``.

    >>> own_paths("4:memory:/a/b\\n3:cpu,cpuacct:/\\n0::/x")
    {'memory': '/a/b', 'cpu': '/', 'cpuacct': '/', '': '/x'}
    """
    if text is None:
        text = Path("/proc/self/cgroup").read_text()
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                out[ctrl] = parts[2]
    return out


def parents(system: CgroupSystem, root: str = "auto", version: str = "auto") -> dict[str, str]:
    """Directories under which a job's cgroups are made: controller (or ``v2``) -> dir.

    ``root="auto"`` nests jobs under the daemon's own cgroup in each v1 hierarchy, so
    limits set on the daemon's cgroup still bound its jobs; on v2 it is
    ``/mtgpu.jobs`` at the top, since a v2 cgroup with processes in it cannot hand
    controllers to children. Any other ``root`` is a path inside every hierarchy.
    """
    if version == "auto":
        version = system.version
    own = own_paths()
    if version == "v1":
        return {
            c: os.path.normpath(f"{m}/{own.get(c, '/') if root == 'auto' else root}")
            for c, m in system.v1.items()
            if c in V1_CONTROLLERS
        }
    if version == "v2" and system.v2:
        return {"v2": os.path.normpath(f"{system.v2}/{'mtgpu.jobs' if root == 'auto' else root}")}
    return {}


def gpu_majors(proc_devices: str) -> set[int]:
    """GPU character device majors named in ``/proc/devices``, plus the fixed ones.

    >>> sorted(gpu_majors("Character devices:\\n  1 mem\\n195 nvidia-frontend\\n"
    ...                   "235 nvidia-uvm\\n\\nBlock devices:\\n  7 loop\\n"))
    [195, 226, 235]
    """
    majors = set(FIXED_GPU_MAJORS)
    in_char = False
    for line in proc_devices.splitlines():
        if line.startswith("Character devices"):
            in_char = True
        elif line.startswith("Block devices"):
            in_char = False
        elif in_char:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1] in GPU_DEVICE_NAMES:
                majors.add(int(parts[0]))
    return majors


def device_deny_rules(allowed: Iterable[tuple[int, int]], majors: Iterable[int]) -> list[str]:
    """``devices.deny`` lines that shut a job out of every GPU device but ``allowed``.

    ``allowed`` are the (major, minor) numbers of the reserved GPUs' device files.
    Every major in ``majors`` or in ``allowed`` counts as a GPU major. A v1 wildcard
    deny cannot be narrowed afterwards (see the module docstring), so a major with
    a reserved device is denied minor by minor around it.

    >>> device_deny_rules([], [195])
    ['c 195:* rwm']
    >>> rules = device_deny_rules([(195, 0), (195, 255)], [195, 226])
    >>> rules[0], rules[-2], rules[-1], len(rules)
    ('c 195:1 rwm', 'c 195:254 rwm', 'c 226:* rwm', 255)
    """
    allowed = set(allowed)
    rules: list[str] = []
    for major in sorted(set(majors) | {a[0] for a in allowed}):
        keep = {mi for ma, mi in allowed if ma == major}
        if not keep:
            rules.append(f"c {major}:* rwm")
            continue
        top = max(MAX_MINOR, max(keep))
        rules += [f"c {major}:{mi} rwm" for mi in range(top + 1) if mi not in keep]
    return rules


def seal(path: str, gid: int) -> None:
    """Only root and the tenant's group may look into a tenant's cgroup (its
    ``cgroup.procs`` lists the PIDs that hidepid hides; its counters show its use):
    root-owned, group ``gid``, mode 0750. The tenant still reads its own limits."""
    os.chown(path, 0, gid)
    os.chmod(path, 0o750)


def unlisted(path: str) -> None:
    """A directory of tenants' cgroups that tenants pass through but cannot list (0711):
    which tenants have sessions, and every job's cgroup name, stay unseen."""
    os.chmod(path, 0o711)


def _write(path: str, value: str) -> None:
    # One write() per value: cgroup files take one rule or number per write.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _keyed(text: str, key: str) -> int | None:
    """The number after ``key`` in a flat-keyed cgroup file such as memory.events."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return None


@dataclass
class JobCgroup:
    """One job's cgroups: ``dirs`` maps a controller (or ``v2``) to its directory."""

    dirs: dict[str, str]

    @property
    def version(self) -> str:
        """``v2`` for a unified cgroup, ``v1`` for per-controller ones, ``none``."""
        return "v2" if "v2" in self.dirs else ("v1" if self.dirs else "none")

    def _dir(self, controller: str) -> str | None:
        return self.dirs.get("v2") if self.version == "v2" else self.dirs.get(controller)

    @classmethod
    def create(
        cls,
        parent_dirs: Mapping[str, str],
        name: str,
        *,
        ram: int | None,
        cpus: Iterable[int],
        pids_max: int | None,
        deny: Iterable[str],
        use_memory: bool = True,
        gpus: tuple[Iterable[tuple[int, int]], Iterable[int]] = ((), ()),
        gid: int | None = None,
    ) -> tuple[JobCgroup, dict[str, str]]:
        """Make and configure the job's cgroups; return them and what each enforces.

        A controller that cannot be set up is left out and reported in the second
        value (controller -> description), so the supervisor can fall back and say
        why; nothing here raises for a missing feature. ``deny`` walls a v1 cgroup
        off from GPU devices (:func:`device_deny_rules`); on v2, ``gpus`` (the
        allowed devices and the GPU majors) does, with a BPF device program. With
        ``gid`` (the job owner's group) each directory is :func:`seal`-ed.
        """
        cpus = sorted(set(cpus))
        dirs: dict[str, str] = {}
        applied: dict[str, str] = {}
        if "v2" in parent_dirs:
            return cls._create_v2(
                parent_dirs["v2"],
                name,
                ram=ram,
                cpus=cpus,
                pids_max=pids_max,
                use_memory=use_memory,
                gpus=gpus,
                gid=gid,
            )
        for ctrl, parent in parent_dirs.items():
            if ctrl not in V1_CONTROLLERS or (ctrl == "memory" and not use_memory):
                continue
            path = f"{parent}/{name}"
            try:
                os.makedirs(path, exist_ok=True)
                dirs[ctrl] = path
                if gid is not None:
                    seal(path, gid)
                applied[ctrl] = _setup_v1(
                    ctrl, path, parent, ram=ram, cpus=cpus, pids_max=pids_max, deny=deny
                )
            except OSError as exc:
                applied[ctrl] = f"unavailable: {exc}"
                log.warning("cgroup %s %s: %s", ctrl, name, exc)
                if ctrl in dirs:
                    _rmdir(dirs.pop(ctrl))
        return cls(dirs), applied

    @classmethod
    def _create_v2(
        cls,
        parent: str,
        name: str,
        *,
        ram: int | None,
        cpus: list[int],
        pids_max: int | None,
        use_memory: bool,
        gpus: tuple[Iterable[tuple[int, int]], Iterable[int]],
        gid: int | None = None,
    ) -> tuple[JobCgroup, dict[str, str]]:
        applied: dict[str, str] = {}
        os.makedirs(parent, exist_ok=True)
        if gid is not None and os.path.basename(parent) == "mtgpu.jobs":
            unlisted(parent)  # ours alone (parents()), so its mode is ours to set
        # Hand the controllers down from the top to our parent (best effort: the
        # top may lack some, and the parent must hold no processes).
        top = Path(parent)
        chain = [top] + [p for p in top.parents if (p / "cgroup.subtree_control").exists()]
        avail = set(_read(str(chain[-1] / "cgroup.controllers")).split())
        wanted = [c for c in V2_CONTROLLERS if c in avail and (c != "memory" or use_memory)]
        for p in reversed(chain):
            for c in wanted:
                try:
                    _write(str(p / "cgroup.subtree_control"), f"+{c}")
                except OSError:
                    pass
        path = f"{parent}/{name}"
        os.makedirs(path, exist_ok=True)
        if gid is not None:
            seal(path, gid)
        enabled = set(_read(f"{parent}/cgroup.subtree_control").split())
        settings = {
            "memory": [("memory.max", str(ram) if ram else "max"), ("memory.swap.max", "0")],
            "pids": [("pids.max", str(pids_max) if pids_max else "max")],
            "cpuset": [("cpuset.cpus", ",".join(map(str, cpus)))] if cpus else [],
        }
        for ctrl in V2_CONTROLLERS:
            if ctrl not in enabled:
                applied[ctrl] = "unavailable: not enabled in the parent's cgroup.subtree_control"
                continue
            try:
                for fname, value in settings[ctrl]:
                    if os.path.exists(f"{path}/{fname}"):
                        _write(f"{path}/{fname}", value)
                applied[ctrl] = "cgroup v2"
            except OSError as exc:
                applied[ctrl] = f"unavailable: {exc}"
        applied["freezer"] = "cgroup v2"
        allowed, majors = set(gpus[0]), set(gpus[1])
        try:
            bpfdev.attach(path, allowed, majors | {ma for ma, _ in allowed})
            applied["devices"] = f"cgroup v2 (BPF device program: {len(allowed)} GPU device files allowed)"
        except OSError as exc:
            applied["devices"] = f"unavailable: {exc}"
            log.warning("cgroup v2 %s: no GPU device wall: %s", name, exc)
        return cls({"v2": path}), applied

    # ------------------------------------------------------------------ processes

    def attach(self, pid: int) -> None:
        """Move ``pid`` into every cgroup of the job (raises OSError on failure)."""
        for path in self.dirs.values():
            _write(f"{path}/cgroup.procs", str(pid))

    def procs(self) -> set[int]:
        """Every process of the job now (empty once all are gone)."""
        path = self._dir("freezer") or next(iter(self.dirs.values()), None)
        if path is None:
            return set()
        try:
            return {int(x) for x in _read(f"{path}/cgroup.procs").split()}
        except OSError:
            return set()

    def signal_all(self, sig: int) -> int:
        """Send ``sig`` to every process of the job, frozen so that none escapes.

        Returns how many processes were signalled.
        """
        if (
            sig == signal.SIGKILL
            and self.version == "v2"
            and os.path.exists(f"{self.dirs['v2']}/cgroup.kill")
        ):
            n = len(self.procs())
            _write(f"{self.dirs['v2']}/cgroup.kill", "1")
            return n
        frozen = self._freeze(True)
        try:
            return signal_members(self.procs, sig)
        finally:
            if frozen:
                self._freeze(False)

    def _freeze(self, on: bool) -> bool:
        """Freeze or thaw the job; False when there is no freezer."""
        if self.version == "v2":
            path, fname, value = self.dirs["v2"], "cgroup.freeze", "1" if on else "0"
        elif "freezer" in self.dirs:
            path, fname, value = self.dirs["freezer"], "freezer.state", "FROZEN" if on else "THAWED"
        else:
            return False
        try:
            _write(f"{path}/{fname}", value)
        except OSError:
            return False
        if on:
            # Freezing is asynchronous; a fork in flight finishes before the state
            # reads FROZEN, and its child is then in cgroup.procs as well.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                state = (
                    _keyed(_read(f"{path}/cgroup.events"), "frozen") == 1
                    if self.version == "v2"
                    else _read(f"{path}/freezer.state").strip() == "FROZEN"
                )
                if state:
                    break
                time.sleep(0.005)
        return True

    # ------------------------------------------------------------------- memory

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer took from this job; None if unknown."""
        path = self._dir("memory")
        if path is None:
            return None
        try:
            if self.version == "v2":
                return _keyed(_read(f"{path}/memory.events"), "oom_kill")
            return _keyed(_read(f"{path}/memory.oom_control"), "oom_kill")
        except OSError:
            return None

    def memory_peak(self) -> int | None:
        """The most memory the job held at once, in bytes; None if unknown."""
        path = self._dir("memory")
        if path is None:
            return None
        fname = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int(_read(f"{path}/{fname}").strip())
        except (OSError, ValueError):
            return None

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the job's cgroups; they must be empty. Retries while the last exits finish."""
        deadline = time.monotonic() + timeout
        for path in self.dirs.values():
            while not _rmdir(path) and time.monotonic() < deadline:
                time.sleep(0.05)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        log.warning("cannot remove cgroup %s: %s", path, exc)
        return True
    return True


def _setup_v1(
    ctrl: str,
    path: str,
    parent: str,
    *,
    ram: int | None,
    cpus: list[int],
    pids_max: int | None,
    deny: Iterable[str],
) -> str:
    """Configure one v1 controller of a job; returns what it enforces."""
    if ctrl == "memory":
        if ram is None:
            return "cgroup v1 (accounting only)"
        # memsw bounds memory plus swap; it must be set after the memory limit,
        # since the kernel keeps memsw >= memory.
        _write(f"{path}/memory.limit_in_bytes", str(ram))
        if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):
            _write(f"{path}/memory.memsw.limit_in_bytes", str(ram))
            return "cgroup v1 (memory+swap)"
        # Without swap accounting, keep the job from swapping past its limit.
        _write(f"{path}/memory.swappiness", "0")
        return "cgroup v1 (memory; swap not accounted)"
    if ctrl == "devices":
        rules = list(deny)
        for rule in rules:
            _write(f"{path}/devices.deny", rule)
        return f"cgroup v1 ({len(rules)} deny rules)"
    if ctrl == "pids":
        _write(f"{path}/pids.max", str(pids_max) if pids_max else "max")
        return f"cgroup v1 (max {pids_max or 'unlimited'})"
    if ctrl == "cpuset":
        # A v1 cpuset takes no process until both cpus and mems are set.
        _write(f"{path}/cpuset.mems", _read(f"{parent}/cpuset.mems").strip())
        _write(
            f"{path}/cpuset.cpus",
            ",".join(map(str, cpus)) if cpus else _read(f"{parent}/cpuset.cpus").strip(),
        )
        return "cgroup v1"
    return "cgroup v1"
