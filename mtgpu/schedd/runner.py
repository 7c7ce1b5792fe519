"""Running jobs on this host: the daemon's side of job execution.

The daemon hands each job member to :meth:`Runner.start` as a :class:`JobLaunch`.
The runner writes the launch to a root-only directory for the job and starts a
supervisor for it (forked by the launcher of ``launcher.py``, which behaves as
``python -m mtgpu.schedd.supervisor SPEC``), in a session of its own and
re-parented away from the daemon, so that the job and its supervisor live on
if the daemon is restarted or killed. The supervisor never talks to the daemon: it
only writes files. A daemon, new or old, learns what happened by reading them.

One job's directory (``STATE_DIR/jobs/ID``, mode 0700, root)::

    spec.json        the launch and the cgroup parents     (written by the runner)
    supervisor.pid   pid, start time and boot id            (supervisor, at start)
    supervisor.log   the supervisor's own messages
    cgroups.json     the job's cgroup directories           (supervisor)
    cancel.json      a cancel request and its grace period  (runner)
    stop.json        a stop for a broken limit (VRAM), its state and reason (runner)
    result.json      the final JobResult                    (supervisor, last)
    acked            the daemon has recorded the result     (runner)

and, beside the jobs, ``.launcher.sock``, ``.launcher.pid`` and ``.launcher.log``, and
``.ends.sock``, where the daemon hears of each job's end as soon as its result is
written (polling finds what it missed).

Contract for the daemon:

- ``start(launch)`` returns once the supervisor runs (a fraction of a second);
  it raises :class:`JobAlreadyStarted` if the job was started here before.
- ``poll()``, called every 0.2-0.5 s (or ``async for r in runner.watch()``),
  returns each finished job's :class:`JobResult` once per runner object; the
  first call after a restart also returns results that ended while no daemon ran.
  After recording a result, call ``ack(job_id, attempt)`` so a later daemon does
  not report it again. Each start of a requeued job is an attempt of its own
  (``JobLaunch.attempt``): results are reported once per (job, attempt), so the
  report of an earlier attempt never stands for a later one's.
- ``running()`` lists the jobs whose supervisors are alive (re-adoption).
- ``cancel(job_id, grace, attempt=N)`` asks for SIGTERM to every process of the
  job, then SIGKILL after ``grace`` seconds; the result says CANCELLED. With
  ``attempt`` it stops only that attempt (never a later start of the same job).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from mtgpu.errors import CommandError, FenceError, JobError
from mtgpu.fsafe import signal_pid
from mtgpu.jobstate import OUT_OF_MEMORY, JobState
from mtgpu.proc import ROOT_CHILD_ENV, python_argv, run
from mtgpu.schedd import cgroups
from mtgpu.schedd.jobenv import JobLaunch, JobUser

__all__ = [
    "EarlierRunActive",
    "FinalState",
    "JobAlreadyStarted",
    "JobLaunch",
    "JobResult",
    "JobUser",
    "Runner",
]

log = logging.getLogger("mtgpu.schedd.runner")

SPEC, PIDFILE, LOGFILE = "spec.json", "supervisor.pid", "supervisor.log"
#: The daemon's socket for end notices, beside the job directories.
ENDS = ".ends.sock"
CGROUPS, CANCEL, RESULT, ACKED = "cgroups.json", "cancel.json", "result.json", "acked"
STOP = "stop.json"
#: A job directory with a spec but no supervisor after this long was never started
#: (the daemon stopped between writing the spec and starting the supervisor).
START_GRACE = 60.0
_BUILD = object()  # Runner.jobinit before the first start


class FinalState(StrEnum):
    """How a job ended, in Slurm's words."""

    COMPLETED = JobState.COMPLETED.value
    FAILED = JobState.FAILED.value
    CANCELLED = JobState.CANCELLED.value
    TIMEOUT = JobState.TIMEOUT.value
    OUT_OF_MEMORY = JobState.OUT_OF_MEMORY.value
    #: The supervisor itself vanished (a reboot, or it was killed) before recording.
    NODE_FAIL = JobState.NODE_FAIL.value


class JobAlreadyStarted(JobError):
    """The job was already started on this host; a second dispatch is refused."""


class EarlierRunActive(JobError):
    """A requeued job placed here again while its earlier run (another term) still runs."""


@dataclass(frozen=True)
class JobResult:
    """How one job member ended.

    ``exit_code`` is the main process's exit status, or ``None`` when a signal
    ended it (then ``signal`` says which) or it never started. ``reason`` is one
    sentence for ``mt-job show``, empty for COMPLETED. Times are seconds since the
    epoch. ``limits`` says how each limit was enforced (``memory``:
    ``cgroup v1 (memory+swap)``, ``watchdog``...).
    """

    job_id: str
    state: FinalState
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    start_time: float = 0.0
    end_time: float = 0.0
    term: int = 0
    node_rank: int = 0
    memory_peak: int | None = None
    limits: Mapping[str, str] = field(default_factory=dict)
    #: Which run of a requeued job this was (its requeue count when it started).
    attempt: int = 0
    #: CPU seconds the job's processes used (user, system), as ``getrusage`` of the
    #: processes its supervisor reaped (Slurm's ``UserCPU``/``SystemCPU``).
    cpu_user: float | None = None
    cpu_system: float | None = None
    #: The job's peak memory, bytes (``MaxRSS``): its cgroup's peak where it has one,
    #: else the largest resident set of one of its processes.
    max_rss: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form with snake_case keys."""
        d = asdict(self)
        d["state"] = str(self.state)
        d["limits"] = dict(self.limits)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobResult:
        """The inverse of :meth:`to_dict`."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["state"] = FinalState(known["state"])
        return cls(**known)


# ---------------------------------------------------------------- shared file helpers


def write_json(path: Path, data: Any, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, rename), mode 0600.

    ``durable`` also syncs the file and its directory. A job's own files are not
    synced: the spec, pid file and cgroups describe processes that a power cut ends
    anyway, and the result survives a crash of any process but not a power cut, after
    which the job is recorded NODE_FAIL (the replicated state, which is synced, says
    what ran). Syncing them cost a busy host milliseconds per job.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data, sort_keys=True).encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or torn."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@functools.cache
def boot_id() -> str:
    """This boot's id: a pid recorded before a reboot names nobody after it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if it is gone.

    Together with the pid it names one process: a recycled pid starts later.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields follow the last ')'.
    fields_ = stat[stat.rindex(")") + 2 :].split()
    if fields_[0] in ("Z", "X"):
        return None
    return int(fields_[19])


def pid_record(pid: int) -> dict[str, Any]:
    """What identifies process ``pid`` for :func:`is_alive` later."""
    return {"pid": pid, "start": process_start(pid), "boot_id": boot_id()}


def is_alive(record: Mapping[str, Any] | None) -> bool:
    """True if the process ``record`` names still runs (same boot, same start time)."""
    if not record or record.get("boot_id") != boot_id():
        return False
    start = process_start(int(record["pid"]))
    return start is not None and start == record.get("start")


def signal_record(record: Mapping[str, Any] | None, sig: int) -> bool:
    """Signal the process ``record`` names through a pidfd, checked to be that process
    (same boot and start time) once pinned: never a process that reused its PID."""
    if not record or "pid" not in record:
        return False
    return signal_pid(int(record["pid"]), sig, lambda _pid: is_alive(record))


# -------------------------------------------------------------------------- runner


class Runner:
    """Starts, watches, cancels and re-adopts the jobs of this host.

    ``state_dir`` holds one directory per job (the daemon passes
    ``STATE_DIR/jobs``). ``python`` runs the supervisor. ``cgroup_root`` is
    ``auto`` (under the daemon's own cgroup in each v1 hierarchy; ``/mtgpu.jobs``
    on v2), ``none`` (no cgroups: watchdogs only) or a path inside each hierarchy.
    ``cgroup_version`` forces ``v1`` or ``v2``. ``memory`` is ``auto`` (cgroup
    where there is one, else a watchdog) or ``watchdog``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        python: str = sys.executable,
        cgroup_root: str = "auto",
        *,
        cgroup_version: str = "auto",
        memory: str = "auto",
        workdir_help: Callable[[str], str] | None = None,
        tenant_namespace: Callable[[int], str | None] | None = None,
        tenant_net_namespace: Callable[[int], str | None] | None = None,
        job_network_on: Callable[[JobLaunch], None] | None = None,
        job_network_off: Callable[[str], None] | None = None,
        tenant_env: Callable[[int, int], Mapping[str, str]] | None = None,
    ) -> None:
        if memory not in ("auto", "watchdog"):
            raise ValueError("memory must be 'auto' or 'watchdog'")
        self.state_dir = Path(state_dir)
        self.python = python
        self.memory = memory
        #: When (monotonic) this process wrote each starting job's spec: how long its
        #: supervisor has had to start, whatever the wall clock did meanwhile.
        self._spec_written: dict[str, float] = {}
        self.system = cgroups.detect()
        self.cgroup_parents = (
            {} if cgroup_root == "none" else cgroups.parents(self.system, cgroup_root, cgroup_version)
        )
        #: Start supervisors through the launcher, a fork server (see launcher.py);
        #: False execs ``python -m mtgpu.schedd.supervisor`` for every job.
        self.use_launcher = True
        #: The job-start helper's path (see jobinit.py): built by :meth:`build_jobinit`
        #: (the daemon's start, after mtgpu-setup install), or else at the first start;
        #: None makes supervisors fork their jobs from Python.
        self.jobinit: Any = _BUILD
        #: Given a job's working directory, what to do if it is missing here (see
        #: JobLaunch.workdir_help); the daemon gives it in a cluster.
        self.workdir_help = workdir_help
        #: Given a tenant's uid, the file of its private mount namespace (see
        #: mtgpu.schedd.fence), which its jobs enter; None leaves jobs in ours.
        self.tenant_namespace = tenant_namespace
        #: Given a tenant's uid, the file of its private network namespace
        #: (mtgpu.schedd.netns), which its jobs enter; None leaves jobs in ours.
        self.tenant_net_namespace = tenant_net_namespace
        #: A multi-member job starts here (its launch: its job network is made, or
        #: FenceError) and a job ends (its id: its job network, if any, is removed).
        self.job_network_on = job_network_on
        self.job_network_off = job_network_off
        #: Given a tenant's uid and gid, variables its jobs get as its sessions do
        #: (where its tmux server listens), over the job's own.
        self.tenant_env = tenant_env
        self._active: set[str] = set()
        #: (job id, attempt) of the results poll() returned: a requeued job started
        #: here again is a new attempt, whose end is reported in its turn.
        self._reported: set[tuple[str, int]] = set()
        self._scanned = False

    def job_dir(self, job_id: str) -> Path:
        """The root-only directory of ``job_id`` on this host."""
        return self.state_dir / job_id

    # ---------------------------------------------------------------- start

    def start(self, launch: JobLaunch) -> None:
        """Start ``launch`` under a supervisor of its own; return once it runs.

        Blocks for a fork through the launcher, or for the start-up time of Python
        without one (call it in a thread from asyncio; concurrent calls are safe).
        Raises :class:`JobAlreadyStarted` for a job started here before,
        and :class:`JobError` if the supervisor cannot start (the job's result
        then says FAILED) or its tenant's private /tmp or network cannot be made
        (nothing is started: never in the host's instead).
        """
        job_dir = self.job_dir(launch.job_id)
        if launch.user.uid == 0:
            raise JobError(f"job {launch.job_id}: jobs never run as root")
        if launch.state_dir and os.path.normpath(launch.state_dir) != str(job_dir):
            raise JobError(
                f"job {launch.job_id}: its state_dir {launch.state_dir} is not "
                f"{job_dir}, where this runner keeps it"
            )
        launch = replace(launch, state_dir=str(job_dir))
        if self.workdir_help is not None and not launch.workdir_help:
            launch = replace(launch, workdir_help=self.workdir_help(launch.workdir))
        if self.tenant_env is not None:
            extra = self.tenant_env(launch.user.uid, launch.user.gid)
            if extra:
                launch = replace(launch, env={**launch.env, **extra})
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.jobinit is _BUILD:  # before the job's directory: building takes seconds
            from mtgpu.schedd.jobinit import helper

            self.jobinit = helper(self.state_dir)
        try:
            job_dir.mkdir(mode=0o700)
        except FileExistsError:
            if not (job_dir / SPEC).exists():
                # An earlier start died (the daemon was killed) before writing the
                # launch: nothing ran, so this start goes ahead in the same directory.
                pass
            else:
                old = read_json(job_dir / SPEC) or {}
                old_run = (old.get("launch", {}).get("term"), old.get("launch", {}).get("attempt", 0))
                if old_run[0] is not None and old_run != (launch.term, launch.attempt):
                    if not (job_dir / RESULT).exists():
                        raise EarlierRunActive(
                            f"job {launch.job_id}: its earlier run (term "
                            f"{old_run[0]}, attempt {old_run[1]}) still runs here"
                        ) from None
                    # A requeued job placed here again: its earlier run is over. Keep
                    # that run's files beside the new one's.
                    os.rename(job_dir, job_dir.with_name(f".{launch.job_id}.run{old_run[0]}-{old_run[1]}"))
                    return self.start(launch)
                raise JobAlreadyStarted(
                    f"job {launch.job_id} was already started on this host (term "
                    f"{old.get('launch', {}).get('term', '?')}); not starting it again"
                ) from None
        try:
            mount_ns = self.tenant_namespace(launch.user.uid) if self.tenant_namespace else None
            net_ns = self.tenant_net_namespace(launch.user.uid) if self.tenant_net_namespace else None
            if launch.nnodes > 1 and net_ns is not None:
                # A multi-member job's ranks run in their tenant's namespace too and
                # reach each other on the job's own network (netns.JobNet), made first.
                if self.job_network_on is None or len(launch.member_addrs) != launch.nnodes:
                    raise FenceError(
                        "this member cannot give the job a network of its own between its "
                        "members (an older member placed it?), and it never runs in the host's"
                    )
                self.job_network_on(launch)
        except FenceError as exc:
            # Its tenant's private /tmp or network cannot be made: the job does not
            # start (never in ours instead); nothing of it ran, so no trace is kept.
            try:
                job_dir.rmdir()
            except OSError:
                pass
            raise JobError(f"job {launch.job_id}: {exc}") from exc
        spec = {
            "version": 1,
            "launch": launch.to_dict(),
            "cgroup_parents": self.cgroup_parents,
            "memory": self.memory,
            "created": time.time(),
            "jobinit": self.jobinit,
            "mount_ns": mount_ns,
            "net_ns": net_ns,
        }
        write_json(job_dir / SPEC, spec, durable=False)
        self._spec_written[launch.job_id] = time.monotonic()
        # A clean environment; the supervisor runs this very code (python_argv).
        env = dict(ROOT_CHILD_ENV)
        try:
            self._start_supervisor(job_dir / SPEC, env)
        except CommandError as exc:
            now = time.time()
            write_json(
                job_dir / RESULT,
                JobResult(
                    launch.job_id,
                    FinalState.FAILED,
                    reason=f"its supervisor could not start: {exc}",
                    start_time=now,
                    end_time=now,
                    term=launch.term,
                    attempt=launch.attempt,
                    node_rank=launch.node_rank,
                ).to_dict(),
            )
            raise JobError(f"job {launch.job_id}: the supervisor could not start: {exc}") from exc
        self._active.add(launch.job_id)
        log.info("job %s started (term %d) as %s", launch.job_id, launch.term, launch.user.name)

    def _start_supervisor(self, spec: Path, env: dict[str, str]) -> None:
        """Start the supervisor through the launcher (a fork), else as a new interpreter."""
        # Imported here: the launcher imports the supervisor, which imports this module.
        from mtgpu.schedd import launcher

        if self.use_launcher:
            try:
                launcher.start(self.state_dir, self.python, env, spec)
                return
            except launcher.Unavailable as exc:
                log.warning("job launcher unavailable (%s); starting the supervisor directly", exc)
        run(python_argv(self.python, "mtgpu.schedd.supervisor", str(spec)), env=env, timeout=60, cwd="/")

    def build_jobinit(self) -> str | None:
        """Build the job-start helper now (or find it built), not at a job's start."""
        from mtgpu.schedd.jobinit import helper

        self.jobinit = helper(self.state_dir)
        return self.jobinit

    # ---------------------------------------------------------------- status

    def _job_ids(self) -> list[str]:
        try:
            return sorted(
                e.name
                for e in os.scandir(self.state_dir)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
            )
        except FileNotFoundError:
            return []

    def running(self) -> list[str]:
        """Jobs whose supervisors are alive now (and have not recorded a result)."""
        out = []
        for job_id in self._job_ids():
            d = self.job_dir(job_id)
            if not (d / RESULT).exists() and is_alive(read_json(d / PIDFILE)):
                out.append(job_id)
                self._active.add(job_id)
        return out

    def result(self, job_id: str) -> JobResult | None:
        """How ``job_id`` ended, or None while it runs (or if it is unknown here).

        A supervisor that vanished without a result (a reboot, a kill -9) is
        recorded here as NODE_FAIL, and the job's leftover processes are killed.
        """
        d = self.job_dir(job_id)
        data = read_json(d / RESULT)
        if data is not None:
            self._spec_written.pop(job_id, None)
            return JobResult.from_dict(data)
        if not (d / SPEC).exists():
            return None
        pid = read_json(d / PIDFILE)
        if pid is None:
            # Timed on the monotonic clock when this process wrote the spec (an NTP
            # step must not make a starting job look lost); by the spec's age only
            # for a job an earlier daemon started.
            written = self._spec_written.get(job_id)
            try:
                age = (
                    time.monotonic() - written
                    if written is not None
                    else time.time() - (d / SPEC).stat().st_mtime
                )
            except FileNotFoundError:
                return None
            if age < START_GRACE:
                return None
            self._spec_written.pop(job_id, None)
            return self._record_lost(
                job_id, "its supervisor never started (the daemon stopped while starting it)"
            )
        self._spec_written.pop(job_id, None)  # its supervisor started
        if is_alive(pid):
            return None
        # The supervisor writes the result and then exits: look again before
        # calling it lost.
        data = read_json(d / RESULT)
        if data is not None:
            return JobResult.from_dict(data)
        return self._record_lost(
            job_id,
            f"its supervisor (pid {pid.get('pid')}) stopped without "
            "recording an exit status; the host may have rebooted",
        )

    def _record_lost(self, job_id: str, reason: str) -> JobResult:
        d = self.job_dir(job_id)
        spec = read_json(d / SPEC) or {}
        launch = spec.get("launch", {})
        dirs = read_json(d / CGROUPS)
        if dirs:
            cg = cgroups.JobCgroup(dirs)
            if cg.procs():
                cg.signal_all(signal.SIGKILL)
                reason += "; its remaining processes were killed"
            cg.remove(timeout=2.0)
        result = JobResult(
            job_id,
            FinalState.NODE_FAIL,
            reason=reason,
            start_time=spec.get("created", 0.0),
            end_time=time.time(),
            term=launch.get("term", 0),
            node_rank=launch.get("node_rank", 0),
            attempt=launch.get("attempt", 0),
        )
        write_json(d / RESULT, result.to_dict())
        log.warning("job %s: %s", job_id, reason)
        return result

    def poll(self, only: Iterable[str] | None = None) -> list[JobResult]:
        """Results of jobs that ended since the last call (each once per runner).

        Cheap enough to call several times a second: it looks only at the jobs
        this runner knows to be running, or of those only at ``only`` (the jobs
        whose end was announced). The first call also scans every job directory, to
        pick up jobs started (or ended) under an earlier daemon.
        """
        if not self._scanned:
            self._scanned = True
            for job_id in self._job_ids():
                if not (self.job_dir(job_id) / ACKED).exists():
                    self._active.add(job_id)
        out = []
        look = self._active if only is None else self._active.intersection(only)
        for job_id in sorted(look):
            r = self.result(job_id)
            if r is not None:
                self._active.discard(job_id)
                if self.job_network_off is not None:
                    self.job_network_off(job_id)
                if (job_id, r.attempt) not in self._reported:
                    self._reported.add((job_id, r.attempt))
                    out.append(r)
        return out

    async def watch(self, interval: float = 0.5) -> AsyncIterator[JobResult]:
        """Yield each finished job's result, polling every ``interval`` seconds."""
        while True:
            for r in self.poll():
                yield r
            await asyncio.sleep(interval)

    def start_interrupted(self, job_id: str, wait: float = 10.0) -> bool:
        """Whether ``job_id``'s start here was cut short before its supervisor ran (the
        daemon was killed between writing the launch and the fork): no supervisor
        record and no result appear within ``wait`` seconds (a fork the launcher was
        making as the daemon died has written its record by then). Such a directory is
        set aside, so that the job can be started again in a fresh one."""
        d = self.job_dir(job_id)
        deadline = time.monotonic() + wait
        while True:
            if not (d / SPEC).exists() or (d / PIDFILE).exists() or (d / RESULT).exists():
                return False
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        os.rename(d, d.with_name(f".{job_id}.interrupted-{int(time.time())}"))
        log.warning("job %s: its start was interrupted before its supervisor ran; starting it again", job_id)
        return True

    def launch_run(self, job_id: str) -> tuple[int, int]:
        """The (scheduler term, attempt) ``job_id`` was started here with ((0, 0) if unknown)."""
        launch = (read_json(self.job_dir(job_id) / SPEC) or {}).get("launch", {})
        return int(launch.get("term") or 0), int(launch.get("attempt") or 0)

    def listen_ends(self) -> socket.socket | None:
        """A datagram socket on which supervisors announce ended jobs (``ENDS``).

        Non-blocking; each datagram is a job id, sent after its result is written.
        Only one listener per state directory (the daemon's agent); None if it
        cannot be made, and then only polling finds ends.
        """
        path = self.state_dir / ENDS
        if len(os.fsencode(path)) >= 100:
            return None
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.unlink(missing_ok=True)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
            s.bind(str(path))
            os.chmod(path, 0o600)
        except OSError as exc:
            log.warning("no end notices from supervisors (%s); polling only", exc)
            return None
        return s

    def ack(self, job_id: str, attempt: int | None = None) -> None:
        """The daemon has recorded ``job_id``'s result (of ``attempt``: a later start's
        result is left alone); later runners will not report it."""
        d = self.job_dir(job_id)
        data = read_json(d / RESULT)
        if data is not None and (attempt is None or int(data.get("attempt") or 0) == attempt):
            (d / ACKED).touch(mode=0o600)

    def remove(self, job_id: str) -> None:
        """Delete a finished job's directory (after ``JOB_RETENTION_DAYS``)."""
        d = self.job_dir(job_id)
        if not (d / RESULT).exists():
            raise JobError(f"job {job_id} has not finished; cancel it before removing it")
        for entry in os.scandir(d):
            os.unlink(entry.path)
        d.rmdir()
        for old in self.state_dir.glob(f".{job_id}.run*"):  # earlier runs of a requeued job
            shutil.rmtree(old, ignore_errors=True)
        self._active.discard(job_id)

    # ---------------------------------------------------------------- cancel

    def cancel(self, job_id: str, grace: float = 10.0, attempt: int | None = None) -> bool:
        """Ask the job's supervisor to stop the job: SIGTERM, then SIGKILL after ``grace``.

        Returns False if the job has already ended or is unknown here, or (with
        ``attempt``) if what runs here is another attempt of it. The request is a
        file, so it holds even if the signal that wakes the supervisor is lost; a
        second call with a shorter grace shortens the wait.
        """
        d = self.job_dir(job_id)
        if not (d / SPEC).exists() or (d / RESULT).exists():
            return False
        if attempt is not None and self.launch_run(job_id)[1] != attempt:
            return False
        write_json(d / CANCEL, {"grace": max(0.0, float(grace)), "time": time.time()})
        pid = read_json(d / PIDFILE)
        if signal_record(pid, signal.SIGUSR1):
            return True
        return self.result(job_id) is None

    def stop_over_limit(
        self, job_id: str, reason: str, notice: str, attempt: int | None = None, state: str = OUT_OF_MEMORY
    ) -> bool:
        """Ask the job's supervisor to stop it for a limit it broke (its VRAM): it
        writes ``notice`` in the job's standard error, sends SIGTERM, then SIGKILL
        after the job's grace, and records ``state`` with ``reason``.

        Returns False if the job has ended, is unknown here or (with ``attempt``)
        runs here as another attempt.
        """
        d = self.job_dir(job_id)
        if not (d / SPEC).exists() or (d / RESULT).exists():
            return False
        if attempt is not None and self.launch_run(job_id)[1] != attempt:
            return False
        write_json(
            d / STOP,
            {"state": str(FinalState(state)), "reason": reason, "notice": notice, "time": time.time()},
        )
        signal_record(read_json(d / PIDFILE), signal.SIGUSR1)
        return self.result(job_id) is None

    def supervisor_pid(self, job_id: str) -> int | None:
        """The pid of ``job_id``'s supervisor while it runs."""
        record = read_json(self.job_dir(job_id) / PIDFILE)
        return int(record["pid"]) if is_alive(record) and record and "pid" in record else None
