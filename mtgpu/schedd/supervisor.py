"""The supervisor of one job member: ``python -m mtgpu.schedd.supervisor SPEC``.

Like Slurm's slurmstepd or podman's conmon, one small root process per job:

1. detaches from whoever started it (fork, ``setsid``), writes its pid file and
   only then lets the starter return, so the daemon knows it is running;
2. makes the job's cgroups (memory, devices, pids, cpuset, freezer) before the job
   exists, and becomes a child subreaper, so double-forked children of the job
   come back to it rather than to init;
3. forks the job: the child joins the cgroups and pins its CPUs while still root,
   then becomes the tenant (groups, gid, uid, new session, umask 022) and only
   then enters the working directory and opens the output files, so every tenant
   path is resolved with the tenant's rights, never root's;
4. waits, enforcing the time limit, cancel requests (``cancel.json``, woken by
   SIGUSR1) and, without a memory cgroup, a memory watchdog;
5. when the main process ends, kills what is left of the job, writes
   ``result.json`` atomically, removes the cgroups and exits.

It never talks to the daemon; it only writes files in the job's directory, so a
restart or crash of the daemon does not touch it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import select
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtgpu.cluster.lease import now as lease_now
from mtgpu.cluster.lease import read_lease
from mtgpu.fsafe import signal_members
from mtgpu.jobstate import OUT_OF_MEMORY
from mtgpu.proc import posix_spawn
from mtgpu.schedd.cgroups import JobCgroup, device_deny_rules, gpu_majors, job_cgroup_name
from mtgpu.schedd.jobenv import JobLaunch, build_env, container_command, container_env, job_argv, output_paths
from mtgpu.schedd.runner import (
    CANCEL,
    CGROUPS,
    ENDS,
    LOGFILE,
    PIDFILE,
    RESULT,
    STOP,
    FinalState,
    JobResult,
    pid_record,
    write_json,
)
from mtgpu.schedd.submitenv import apply_limits, limits_argument

log = logging.getLogger("mtgpu.schedd.supervisor")

#: How often the memory watchdog measures the job, in seconds.
WATCHDOG_INTERVAL = 0.25
#: How often cancel.json is looked at even without a signal.
CANCEL_CHECK = 1.0
#: How long to keep killing leftovers after the main process ends.
REAP_TIMEOUT = 10.0
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
_PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)
#: Signals the helper starts with at their default action (none ignored, none handled).
_SPAWN_SIGDEF = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


#: Set by the launcher: the priority (nice value) jobs run at, above their supervisor's.
JOB_NICE_ENV = "MTGPU_JOB_NICE"


def job_nice() -> int:
    """The nice value of jobs: the daemon's, whatever the supervisor runs at."""
    try:
        return int(os.environ[JOB_NICE_ENV])
    except (KeyError, ValueError):
        return os.getpriority(os.PRIO_PROCESS, 0)


def default_signals() -> None:
    """Every signal back to its default action (a handler or an ignore we inherited)."""
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) is not signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000


def enter_mount_namespace(path: str, kind: int = _CLONE_NEWNS) -> None:
    """Join the mount namespace bound at ``path`` (the tenant's private /tmp), or with
    ``kind`` _CLONE_NEWNET, the network namespace (its private loopback)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, kind) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def set_process_name(name: str) -> None:
    """Name this process in ``ps``/``top`` (the kernel keeps 15 bytes)."""
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def script_fd(la: JobLaunch) -> int:
    """The job's script in an anonymous file, inheritable: nothing to find on disk, and
    the interpreter opens it by its /proc/self/fd path."""
    fd = os.memfd_create(f"mtgpu-job-{la.job_id}", 0)
    os.write(fd, la.script.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def env_file(env: dict[str, str]) -> int:
    """``env`` as NUL-ended NAME=VALUE entries in an anonymous file, inheritable (the
    job-start helper reads it)."""
    fd = os.memfd_create("mtgpu-job-env", 0)
    os.write(fd, b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def write_container_script(la: JobLaunch) -> None:
    """The script of a containerized job, written as the tenant (0600) where its
    container mounts it from (the tenant's runtime directory)."""
    d = os.path.dirname(la.container_script)
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd = os.open(
        la.container_script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    with os.fdopen(fd, "w") as f:
        f.write(la.script)


def remove_container(la: JobLaunch, procs: list[str], mount_ns: str | None, net_ns: str | None) -> str:
    """Remove a containerized job's container and script, as the tenant, inside the
    job's fence (its cgroups ``procs``, the tenant's namespaces); the error, if any.

    Run when the job has ended whatever ended it, before its cgroups go; removing one
    that podman's ``--rm`` already removed is no error."""
    from mtgpu.errors import CommandError
    from mtgpu.proc import run
    from mtgpu.schedd.fence import fenced_argv

    u = la.user
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = fenced_argv(
            procs, mount_ns, net_ns, u.uid, u.gid, list(u.groups), "/", title=f"mtgpu-job {la.job_id}"
        )
    error = ""
    try:
        run(
            [*prefix, la.container_argv[0], "rm", "--force", "--ignore", "--time", "0", la.container_name],
            env={"HOME": u.home, "USER": u.name, **la.container_env},
            cwd="/",
            timeout=120,
        )
    except CommandError as exc:
        error = (exc.stderr or str(exc)).strip()[-300:]
    try:  # as the tenant too: never a path in a tenant's directory as root
        run(
            [*prefix, "rm", "-f", "--", la.container_script],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            timeout=30,
        )
    except CommandError as exc:
        error = error or (exc.stderr or str(exc)).strip()[-300:]
    return error


def _announce_end(path: Path, job_id: str) -> None:
    """Tell the daemon, if it listens, that the result is written (it polls anyway)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.setblocking(False)
            s.sendto(job_id.encode(), str(path))
    except OSError:
        pass  # no daemon, or its queue is full: it will poll


def start_failure(la: JobLaunch, error: str) -> str:
    """The reason of a job that could not start: which member, what failed and, for a
    working directory missing on this member, what to do about it."""
    where = f" on {la.node_name}" if la.node_name else ""
    reason = f"the job could not start{where}: {error}"
    if la.workdir_help and error.startswith("entering the working directory "):
        reason += f"; {la.workdir_help}"
    return reason


def _describe(exc: BaseException, said: str = "") -> str:
    """``exc`` in words; its file name only when ``said`` (what is being done, e.g.
    ``opening the output file PATH``) does not name it already.

    >>> _describe(FileNotFoundError(2, "No such file or directory", "/x/o"), "opening /x/o")
    'No such file or directory'
    """
    if isinstance(exc, OSError) and exc.strerror:
        name = os.fsdecode(exc.filename) if exc.filename else ""
        return exc.strerror + (f": {name}" if name and name not in said else "")
    return str(exc) or type(exc).__name__


def _oom_score_adj(value: int) -> None:
    try:
        Path("/proc/self/oom_score_adj").write_text(str(value))
    except OSError:
        pass  # not root, or a kernel without it: nothing to protect or undo


def _size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g}{unit}"
    return f"{n}B"


def tell_job(pid: int, user: Any, line: str, timeout: float = 5.0) -> bool:
    """Append ``line`` to the standard error of the job's process ``pid``, as the tenant.

    A child that has become the tenant opens ``/proc/PID/fd/2``: the kernel checks the
    tenant's rights on whatever the job made its standard error, so a job that pointed
    it at a file it may only read gets nothing written there. Non-blocking, so a pipe
    nobody reads cannot hold the supervisor; the child is killed after ``timeout``.
    """
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            if os.geteuid() == 0:
                os.setgroups(list(user.groups) or [user.gid])
                os.setresgid(user.gid, user.gid, user.gid)
                os.setresuid(user.uid, user.uid, user.uid)
            fd = os.open(
                f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            )
            os.write(fd, line.encode(errors="replace"))
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child only reports by its status
            os._exit(1)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)  # our own child, not yet reaped: its pid is ours
            os.waitpid(child, 0)
            return False
        time.sleep(0.01)


class Supervisor:
    """Runs one job member to its end and records how it ended."""

    def __init__(self, launch: JobLaunch, spec: dict, job_dir: Path) -> None:
        self.launch = launch
        self.dir = job_dir
        self.parents: dict[str, str] = spec.get("cgroup_parents") or {}
        self.memory_mode: str = spec.get("memory", "auto")
        #: The job-start helper (jobinit.py), or None to fork the job from Python.
        self.jobinit: str | None = spec.get("jobinit")
        #: The tenant's private mount namespace, which the job enters (see fence.py).
        self.mount_ns: str | None = spec.get("mount_ns")
        #: The tenant's private network namespace, which the job enters (see netns.py).
        self.net_ns: str | None = spec.get("net_ns")
        self.cg: JobCgroup | None = None
        self.limits: dict[str, str] = {}
        self.watchdog = False
        self.pid: int | None = None
        self.status: int | None = None  # the main process's wait status
        self.start_error = ""
        self.cause: FinalState | None = None
        self.cause_reason = ""
        self.cause_grace = 0.0
        self.terminated = False
        #: SIGKILL reached some process of the job after its SIGTERM (the grace ran
        #: out with processes left): the reason says so only then.
        self.sigkilled = False
        self.kill_at: float | None = None
        self.cancel_grace: float | None = None
        self.stop_seen = False
        #: When this member's lease runs out, on the monotonic clock the loop waits on
        #: (None: no lease, a standalone host); read again from the lease file, on
        #: CLOCK_BOOTTIME, before acting.
        self.lease_until: float | None = None
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: What the job's processes used, read once they are all reaped (before any
        #: helper of our own, such as removing a container, adds to it).
        self.rusage: resource.struct_rusage | None = None

    # ----------------------------------------------------------------- setup

    def install_signals(self) -> None:
        """Route our signals through the wakeup pipe that the main loop selects on."""
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, lambda *_: None)  # the wakeup fd carries the number
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _cgroups(self) -> None:
        la = self.launch
        allowed = []
        for node in la.device_nodes:
            try:
                st = os.stat(node)
            except OSError as exc:
                log.warning("reserved device %s: %s", node, exc)
                continue
            if stat.S_ISCHR(st.st_mode):
                allowed.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
        try:
            majors = gpu_majors(Path("/proc/devices").read_text())
        except OSError:
            majors = set()
        self.cg, self.limits = JobCgroup.create(
            self.parents,
            job_cgroup_name(la.job_id, str(self.dir), la.attempt),
            ram=la.ram,
            cpus=la.cpus,
            pids_max=la.pids_max,
            deny=device_deny_rules(allowed, majors),
            use_memory=self.memory_mode != "watchdog",
            gpus=(allowed, majors),
            gid=la.user.gid,
        )
        if not self.cg.dirs:
            self.cg = None
        else:
            write_json(self.dir / CGROUPS, self.cg.dirs, durable=False)
        mem = self.limits.get("memory", "")
        if la.ram is not None and not mem.startswith("cgroup"):
            self.watchdog = True
            self.limits["memory"] = "watchdog (polls the job's resident memory)"
        self.limits.setdefault("devices", "none: no devices cgroup (GPU variables only)")
        self.limits["cpus"] = (
            ("affinity" + (" + cpuset" if self.limits.get("cpuset", "").startswith("cgroup") else ""))
            if la.cpus
            else "all"
        )
        log.info("job %s limits: %s", la.job_id, self.limits)

    # ----------------------------------------------------------------- the job

    def _spawn(self) -> int:
        """Start the job; returns the read end of the pipe that carries start errors."""
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        if self.jobinit and self.launch.container is None and os.access(self.jobinit, os.X_OK):
            try:
                self.pid = self._spawn_helper(err_w)
            finally:
                os.close(err_w)
            return err_r
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, reported through err_w
            os.close(err_r)
            self._child(err_w)
        os.close(err_w)
        self.pid = pid
        return err_r

    def _spawn_helper(self, report: int) -> int:
        """posix_spawn (a vfork) the job-start helper, which does what :meth:`_child`
        does in C and execs the job."""
        la, u = self.launch, self.launch.user
        jobinit = self.jobinit
        assert jobinit is not None  # only called when it exists (see _start)
        out, err, default = output_paths(la)
        script = script_fd(la)
        env_fd = env_file(build_env(la))
        try:
            procs = [f"{d}/cgroup.procs" for d in self.cg.dirs.values()] if self.cg else []
            argv = [
                jobinit,
                f"mtgpu-job {la.job_id}",
                str(job_nice()),
                u.name,
                str(report),
                str(u.uid),
                str(u.gid),
                ",".join(map(str, u.groups)),
                ",".join(map(str, la.cpus)),
                la.workdir,
                out,
                err,
                os.path.dirname(out) if default else "",
                str(env_fd),
                "" if la.umask is None else format(la.umask, "o"),
                limits_argument(la.rlimits),
                "append" if la.open_append else "truncate",
                *procs,
                "--",
                *job_argv(la, f"/proc/self/fd/{script}"),
            ]
            os.set_inheritable(report, True)
            # The helper runs as root until it becomes the tenant: its own environment is
            # empty, and the job's (LD_PRELOAD included, if the tenant asked) reaches only
            # the job, through env_fd.
            if self.mount_ns or self.net_ns:
                # nsenter joins the tenant's namespaces as root and execs the helper in them.
                nsenter = shutil.which("nsenter", path="/usr/bin:/bin") or "/usr/bin/nsenter"
                ns = [
                    *([f"--mount={self.mount_ns}"] if self.mount_ns else []),
                    *([f"--net={self.net_ns}"] if self.net_ns else []),
                ]
                return posix_spawn(nsenter, [nsenter, *ns, "--", *argv], {}, setsigdef=_SPAWN_SIGDEF)
            return posix_spawn(jobinit, argv, {}, setsigdef=_SPAWN_SIGDEF)
        finally:
            os.close(script)
            os.close(env_fd)

    def _child(self, report: int) -> None:
        la, u = self.launch, self.launch.user
        stage = "setting up"
        try:
            os.close(self.wake_r)
            os.close(self.wake_w)
            signal.set_wakeup_fd(-1)
            default_signals()  # ignored signals survive exec
            set_process_name(f"mtgpu-job {la.job_id}")
            _oom_score_adj(0)  # the job must not inherit our protection
            os.setpriority(os.PRIO_PROCESS, 0, job_nice())  # nor our lower priority
            stage = "joining the job's cgroups"
            if self.cg is not None:
                self.cg.attach(os.getpid())
            if la.cpus:
                stage = f"pinning the job to CPUs {list(la.cpus)}"
                os.sched_setaffinity(0, la.cpus)
            if self.net_ns:
                # Opened before the mount namespace changes: the file is under our RUN_DIR.
                stage = "entering the tenant's private network"
                enter_mount_namespace(self.net_ns, _CLONE_NEWNET)
            if self.mount_ns:
                stage = "entering the tenant's private /tmp"
                enter_mount_namespace(self.mount_ns)
            stage = f"becoming {u.name} (uid {u.uid})"
            if os.geteuid() == 0:
                os.setgroups(list(u.groups) or [u.gid])
                os.setresgid(u.gid, u.gid, u.gid)
                os.setresuid(u.uid, u.uid, u.uid)
            elif os.geteuid() != u.uid:
                raise PermissionError(f"the supervisor runs as uid {os.geteuid()}, not root")
            os.setsid()
            os.umask(0o022 if la.umask is None else la.umask)
            stage = "setting the submitting shell's resource limits"
            apply_limits(la.rlimits)  # as the tenant: held within the hard limits here
            # From here on every path is the tenant's and is opened with the tenant's rights.
            stage = f"entering the working directory {la.workdir}"
            if la.container_argv and not os.path.isdir(la.workdir):
                os.chdir(u.home)  # the working directory may be the image's own
            else:
                os.chdir(la.workdir)
            out, err, default = output_paths(la)
            stage = f"opening the output file {out}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if la.open_append else os.O_TRUNC)
            if default:
                os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
                flags |= os.O_NOFOLLOW  # our own default file is never a link
            fd_out = os.open(out, flags, 0o644)
            stage = f"opening the error file {err}"
            fd_err = fd_out if err == out else os.open(err, flags, 0o644)
            fd_in = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            stage = "loading the job script"
            if la.container_argv:
                env = build_env(la)
                write_container_script(la)
                argv = container_command(la, env)
                env = container_env(la, env)
            else:
                script = script_fd(la)  # made after becoming the tenant: the tenant's file
                argv = job_argv(la, f"/proc/self/fd/{script}")
                env = build_env(la)
            for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
                os.dup2(fd, target)
            stage = f"starting {argv[0]}"
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:  # noqa: BLE001 - reported, then _exit: never back into our loop
            try:
                os.write(report, f"{stage}: {_describe(exc, stage)}".encode()[:4000])
            finally:
                os._exit(127)

    def _procs(self) -> set[int]:
        """Every process of the job: its cgroup, or else our descendants (we are subreaper)."""
        if self.cg is not None:
            return self.cg.procs()
        me, children = os.getpid(), dict[int, list[int]]()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    text = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                ppid = int(text[text.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry))
        out, todo = set[int](), [me]
        while todo:
            for c in children.get(todo.pop(), ()):
                if c not in out:
                    out.add(c)
                    todo.append(c)
        return out

    def _signal_all(self, sig: int) -> int:
        if self.cg is not None:
            return self.cg.signal_all(sig)
        return signal_members(self._procs, sig)

    def _kill_all(self) -> None:
        if self._signal_all(signal.SIGKILL) and self.terminated:
            self.sigkilled = True

    def _how_stopped(self) -> str:
        """What was sent to stop the job, as it happened: SIGKILL only if it was sent."""
        if not self.terminated or self.cause_grace <= 0:
            return ""
        if self.sigkilled:
            return (
                f"; SIGTERM was sent to all its processes, then SIGKILL after {self.cause_grace:g}s "
                "to those still running"
            )
        return (
            f"; SIGTERM was sent to all its processes, and they ended within its {self.cause_grace:g}s grace"
        )

    def _terminate(self, cause: FinalState, reason: str, grace: float) -> None:
        """SIGTERM every process of the job now, SIGKILL after ``grace``; first cause wins."""
        if self.cause is None:
            self.cause, self.cause_reason, self.cause_grace = cause, reason, grace
        deadline = time.monotonic() + grace
        self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)
        if not self.terminated:
            self.terminated = True
            self._signal_all(signal.SIGCONT)  # a stopped process must run to see SIGTERM
            self._signal_all(signal.SIGTERM)

    def _check_stop(self) -> None:
        """A stop the daemon asked for (the VRAM watchdog's ``stop.json``): one line in the
        job's standard error, then as for a job over its RAM limit."""
        if self.stop_seen:
            return
        try:
            data = json.loads((self.dir / STOP).read_text())
            state = FinalState(data.get("state", OUT_OF_MEMORY))
            reason, notice = str(data["reason"])[:1000], str(data.get("notice", ""))[:1000]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        self.stop_seen = True
        grace = self.launch.kill_grace
        if notice and self.pid is not None and self.cause is None:
            tell_job(self.pid, self.launch.user, f"{notice}; SIGTERM now, SIGKILL after {grace:g}s\n")
        self._terminate(state, reason, grace)

    def _check_cancel(self, signalled: bool) -> None:
        self._check_stop()
        data = None
        try:
            data = json.loads((self.dir / CANCEL).read_text())
        except (OSError, ValueError):
            pass
        if data is None and (not signalled or self.stop_seen):
            return
        grace = float(data.get("grace", self.launch.kill_grace)) if data else self.launch.kill_grace
        if self.cancel_grace is not None and grace >= self.cancel_grace:
            return
        self.cancel_grace = grace
        who = "on request" if data else "by a signal to its supervisor"
        self._terminate(
            FinalState.CANCELLED,
            f"the job was cancelled {who}",
            grace,
        )

    def _check_lease(self) -> None:
        """Fence the job if this member's lease from the scheduler ran out unrenewed."""
        lease = read_lease(self.dir.parent)
        if lease is None:
            self.lease_until = None
            return
        until, grace = lease
        left = until - lease_now()
        self.lease_until = time.monotonic() + left
        if left > 0 or self.terminated:
            return
        self._terminate(
            FinalState.NODE_FAIL,
            "fenced: this member could not renew its lease from the cluster's scheduler "
            "(cut off, or the scheduler is gone)",
            grace,
        )

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status

    def _watch_memory(self) -> None:
        ram = self.launch.ram or 0
        used = 0
        for pid in self._procs():
            try:
                used += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):
                pass
        if used > ram and self.cause is None:
            self._terminate(
                FinalState.OUT_OF_MEMORY,
                f"the memory watchdog stopped the job: its processes held {_size(used)}, "
                f"over its limit of {_size(ram)}",
                0.0,
            )

    # ----------------------------------------------------------------- main loop

    def run(self) -> int:
        """Run the job to its end and write ``result.json``; returns our exit status."""
        la = self.launch
        started = time.time()
        try:
            _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            # Like slurmstepd: a host-wide OOM should take a job's process, not the
            # small process that records how the job ended.
            _oom_score_adj(-1000)
            self._cgroups()
            self._check_cancel(False)
            self._check_lease()
            err_r = None if self.cause else self._spawn()
            self._loop(err_r, time.monotonic())
            self._drain()
            self._finish_leftovers()
            self.rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
            procs = [f"{d}/cgroup.procs" for d in self.cg.dirs.values()] if self.cg else []
            if la.container_argv and (err := remove_container(la, procs, self.mount_ns, self.net_ns)):
                log.warning("job %s: removing its container %s: %s", la.job_id, la.container_name, err)
        except Exception as exc:  # whatever went wrong, the job still gets an end
            log.exception("supervisor failed")
            self.start_error = self.start_error or f"the job's supervisor failed: {_describe(exc)}"
            try:
                self._finish_leftovers()
            except Exception:  # the result matters more than the traceback
                log.exception("cannot kill the job's processes")
        result = self._result(started)
        if self.cg is not None:
            self.cg.remove()
        # Not synced: like the replicated journal, a result survives a crash of any
        # process, not a power cut (after which the job is recorded NODE_FAIL).
        write_json(self.dir / RESULT, result.to_dict(), durable=False)
        _announce_end(self.dir.parent / ENDS, la.job_id)
        log.info("job %s ended: %s %s", la.job_id, result.state, result.reason)
        return 0

    def _loop(self, err_r: int | None, t0: float) -> None:
        la = self.launch
        limit_at = t0 + la.time_limit if la.time_limit else None
        # sbatch's --signal: a warning signal this long before the time limit.
        warn_at = limit_at - la.warn_before if limit_at is not None and la.warn_signal else None
        next_cancel = next_watch = t0
        err_buf = b""
        while self.pid is not None and self.status is None:
            now = time.monotonic()
            waits = [next_cancel + CANCEL_CHECK - now]
            if limit_at is not None and not self.terminated:
                waits.append(limit_at - now)
            if warn_at is not None:
                waits.append(warn_at - now)
            if self.kill_at is not None:
                waits.append(self.kill_at - now)
            if self.lease_until is not None and not self.terminated:
                waits.append(self.lease_until - now)
            if self.watchdog:
                waits.append(next_watch + WATCHDOG_INTERVAL - now)
            fds = [self.wake_r] + ([err_r] if err_r is not None else [])
            ready, _, _ = select.select(fds, [], [], max(0.0, min(waits)))
            signalled = False
            if self.wake_r in ready:
                try:
                    signalled = any(s != signal.SIGCHLD for s in os.read(self.wake_r, 512))
                except BlockingIOError:
                    pass
            if err_r is not None and err_r in ready:
                chunk = os.read(err_r, 4096)
                err_buf += chunk
                if not chunk:  # end of file: the job has exec'd, or died trying
                    os.close(err_r)
                    err_r = None
                    self.start_error = err_buf.decode(errors="replace")
            self._reap()
            now = time.monotonic()
            if signalled or now >= next_cancel + CANCEL_CHECK:
                next_cancel = now
                self._check_cancel(signalled)
                self._check_lease()
            elif self.lease_until is not None and now >= self.lease_until and not self.terminated:
                self._check_lease()  # read again: it may have been renewed
            if warn_at is not None and now >= warn_at:
                warn_at = None
                if not self.terminated:
                    if la.warn_batch_only and self.pid is not None:
                        os.kill(self.pid, la.warn_signal)  # our own child, not yet reaped
                    else:
                        self._signal_all(la.warn_signal)
            if limit_at is not None and now >= limit_at and not self.terminated:
                self._terminate(
                    FinalState.TIMEOUT,
                    f"the job ran past its time limit of {la.time_limit:g}s",
                    la.kill_grace,
                )
            if self.kill_at is not None and now >= self.kill_at:
                self._kill_all()
                self.kill_at = now + 0.5  # again, until the main process is gone
            if self.watchdog and now >= next_watch + WATCHDOG_INTERVAL:
                next_watch = now
                self._watch_memory()
        if err_r is not None:  # the child died before exec: collect its message
            while chunk := os.read(err_r, 4096):
                err_buf += chunk
            os.close(err_r)
            self.start_error = err_buf.decode(errors="replace")

    def _drain(self) -> None:
        """After SIGTERM, give the job's other processes their grace period to exit."""
        while self.kill_at is not None and time.monotonic() < self.kill_at:
            self._reap()
            if not self._procs():
                return
            self._check_cancel(False)  # a second cancel may shorten the grace
            time.sleep(0.05)

    def _finish_leftovers(self) -> None:
        """Kill every process of the job still alive, as Slurm does when a batch script ends."""
        deadline = time.monotonic() + REAP_TIMEOUT
        while time.monotonic() < deadline:
            self._reap()
            if not self._procs():
                return
            self._kill_all()
            time.sleep(0.02)
        log.warning("job %s: processes %s would not die", self.launch.job_id, sorted(self._procs()))

    def _max_rss(self, ru: resource.struct_rusage | None) -> int | None:
        """The job's peak memory, bytes: its cgroup's where it has one (only what the
        job's own processes used); else the largest process's (``ru_maxrss``, KiB on
        Linux), which counts what this supervisor held when it started the job."""
        peak = self.cg.memory_peak() if self.cg is not None else None
        if peak is not None:
            return peak
        return ru.ru_maxrss * 1024 if ru is not None and self.pid is not None else None

    def _result(self, started: float) -> JobResult:
        la = self.launch
        ru = self.rusage
        code = sig = None
        if self.status is not None and not self.start_error:
            if os.WIFEXITED(self.status):
                code = os.WEXITSTATUS(self.status)
            elif os.WIFSIGNALED(self.status):
                sig = os.WTERMSIG(self.status)
        ooms = self.cg.oom_kills() if self.cg is not None else None
        if self.cause is not None:
            state, reason = self.cause, self.cause_reason + self._how_stopped()
        elif self.start_error:
            state, reason = FinalState.FAILED, start_failure(la, self.start_error)
        elif ooms:
            state = FinalState.OUT_OF_MEMORY
            reason = (
                f"the kernel's OOM killer stopped {ooms} process{'es' if ooms > 1 else ''} "
                f"of the job at its memory limit of {_size(la.ram or 0)}"
            )
        elif code == 0:
            state, reason = FinalState.COMPLETED, ""
        elif code is not None:
            state, reason = FinalState.FAILED, f"the job exited with status {code}"
        else:
            name = signal.Signals(sig).name if sig else "?"
            state, reason = FinalState.FAILED, f"the job was killed by {name}"
        return JobResult(
            la.job_id,
            state,
            code,
            sig,
            reason,
            started,
            time.time(),
            la.term,
            la.node_rank,
            self.cg.memory_peak() if self.cg is not None else None,
            self.limits,
            attempt=la.attempt,
            cpu_user=round(ru.ru_utime, 3) if ru else None,
            cpu_system=round(ru.ru_stime, 3) if ru else None,
            max_rss=self._max_rss(ru),
        )


# --------------------------------------------------------------------- entry point


def _detach(job_dir: Path, reply: socket.socket | None = None) -> Callable[[], None]:
    """Leave whoever started us; returns, in the supervisor, what reports it ready.

    Run as ``python -m``, we fork: the starter exits 0 only once :func:`_ready`
    has run, so the daemon can trust ``running()`` (and send cancels) as soon as
    ``start()`` returns. Forked by the launcher (``reply`` is its caller's
    connection) we are already a process of our own, which init adopts if the
    launcher goes: the answer goes straight to the caller, and one fork is saved.
    """
    if reply is None:
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        if os.fork():
            os.close(ready_w)
            ok = os.read(ready_r, 16) == b"ok"
            _say(None, "" if ok else f"the supervisor did not start; see {job_dir / LOGFILE}")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if ok else 1)
        os.close(ready_r)

        def ready() -> None:
            os.write(ready_w, b"ok")
            os.close(ready_w)
    else:

        def ready() -> None:
            _say(reply, "")
            reply.close()  # nothing of the launcher stays with the supervisor

    os.setsid()
    os.chdir("/")
    logfd = os.open(job_dir / LOGFILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    nullfd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(nullfd, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(logfd)
    os.close(nullfd)
    return ready


def _say(reply: socket.socket | None, error: str) -> None:
    """Tell whoever started us how the start went: ``ok``, or why not."""
    if reply is None:
        if error:
            print(error, file=sys.stderr)
        return
    try:
        reply.sendall(error.encode() if error else b"ok")
    except OSError:
        pass  # the caller gave up; the pid file still says whether we run


def _ready(job_dir: Path, ready: Callable[[], None]) -> None:
    """Write the pid file, then let the starter return."""
    write_json(job_dir / PIDFILE, pid_record(os.getpid()), durable=False)
    ready()


def main(argv: list[str] | None = None, reply: socket.socket | None = None) -> int:
    """Entry point: supervise the job described by the spec file given as argument.

    The launcher calls it in a fork of itself with ``reply``, its caller's connection.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mtgpu.schedd.supervisor SPECFILE", file=sys.stderr)
        return 2
    spec_path = Path(args[0]).resolve()
    try:
        spec = json.loads(spec_path.read_text())
        launch = JobLaunch.from_dict(spec["launch"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _say(reply, f"cannot read the job spec {spec_path}: {exc}")
        return 2
    job_dir = spec_path.parent
    ready = _detach(job_dir, reply)
    # force: a fork of the launcher still has the launcher's handler.
    fmt = logging.Formatter(f"%(asctime)s supervisor[{os.getpid()}] %(levelname)s %(message)s")
    root = logging.getLogger()
    if reply is not None and root.handlers:
        # A fork of the launcher: its handler writes to our standard error, which is
        # the supervisor log now; only the name in each line changes.
        for h in root.handlers:
            h.setFormatter(fmt)
    else:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
        root.handlers[0].setFormatter(fmt)
    set_process_name(f"mtgpu-sup {launch.job_id}")
    sup = Supervisor(launch, spec, job_dir)
    # Handlers first: a cancel's SIGUSR1 may come as soon as the pid file exists,
    # and its default action would kill us.
    sup.install_signals()
    _ready(job_dir, ready)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
