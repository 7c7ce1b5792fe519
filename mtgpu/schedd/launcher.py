"""A fork server for job supervisors: one start costs a fork, not a Python start-up.

Starting ``python -m mtgpu.schedd.supervisor`` costs an interpreter start and its
imports (100-250 ms on a small host), which caps dispatch at a few jobs a second.
The launcher is one long-lived root process per runner state directory that has
the supervisor imported already and listens on ``STATE_DIR/jobs/.launcher.sock``
(mode 0600, in the runner's root-only directory; callers must be uid 0 too).

One start, over one connection::

    runner -> launcher   {"id": CODE_ID, "spec": PATH}\n
    launcher             forks a child for the request, which answers
    child -> runner      "+"               (taken)
    runner -> child      "go"              (from here on the start is the child's)
    child                runs supervisor.main(): setsid, log, pid file, as
                         ``python -m mtgpu.schedd.supervisor`` does after its fork
    child -> runner      "ok", or why the supervisor did not start

The child is the supervisor: its own session, nothing of the launcher kept, and
adopted by init if the launcher dies, so jobs outlive both the launcher and the
daemon. (It skips the supervisor's usual second fork: on a small VM a fork of a
Python process costs milliseconds, the largest part of a start.) Until "go"
nothing has started, so a caller that gets no "+" (launcher dead, hung,
exiting) may safely start a new launcher, or fall back to starting the
supervisor itself. A launcher serves only the code it was
started with (CODE_ID: the interpreter and the sources' mtimes); asked by other
code, it retires so that the caller starts a fresh one. It exits after
``IDLE_TIMEOUT`` seconds without a request, or when its socket is removed.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import hashlib
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from mtgpu.errors import CommandError, MtgpuError
from mtgpu.proc import python_argv, run
from mtgpu.schedd import supervisor
from mtgpu.schedd.runner import is_alive, pid_record, process_start, read_json, signal_record

log = logging.getLogger("mtgpu.schedd.launcher")

SOCKET, PIDLOCK, LOG = ".launcher.sock", ".launcher.pid", ".launcher.log"
#: A launcher with no request for this long exits; the next start spawns another.
IDLE_TIMEOUT = 600.0
#: How long a caller waits for a launcher to take its request before calling it hung.
ACCEPT_TIMEOUT = 5.0
#: How long a caller waits for the supervisor, as for ``python -m ...supervisor``.
REPLY_TIMEOUT = 60.0

#: How much nicer than the daemon supervisors run (their jobs run at the daemon's).
SUPERVISOR_NICE = 10

_spawning = threading.Lock()


class Unavailable(MtgpuError):
    """No launcher took the request; nothing was started."""


#: How long a computed code id is reused (a burst of starts asks many times a second).
CODE_ID_TTL = 1.0
_code_ids: dict[str, tuple[float, str]] = {}


def code_id(python: str) -> str:
    """Which code a launcher must run to serve a caller: interpreter and sources.

    Kept for at most ``CODE_ID_TTL`` seconds: a reinstall under a running daemon
    reaches the starts after that, as it does when every start execs the
    supervisor afresh.
    """
    now = time.monotonic()
    hit = _code_ids.get(python)
    if hit is not None and now - hit[0] < CODE_ID_TTL:
        return hit[1]
    here = Path(__file__).resolve().parent
    stamps = sorted((p.name, p.stat().st_mtime_ns) for p in here.glob("*.py"))
    ident = hashlib.sha256(json.dumps([python, str(here), stamps]).encode()).hexdigest()[:16]
    _code_ids[python] = (now, ident)
    return ident


# --------------------------------------------------------------------------- caller


def start(state_dir: Path, python: str, env: Mapping[str, str], spec: Path) -> None:
    """Start the supervisor of ``spec`` through the launcher of ``state_dir``.

    Spawns the launcher if it is missing, dead or stale, and kills it if hung.
    Raises :class:`Unavailable` when no launcher took the request (the caller may
    start the supervisor itself) and :class:`CommandError` if the supervisor did
    not start.
    """
    sock_path = state_dir / SOCKET
    if len(os.fsencode(sock_path)) >= 100:  # sun_path holds 108 bytes
        raise Unavailable(f"the socket path {sock_path} is too long")
    ident = code_id(python)
    request = json.dumps({"id": ident, "spec": str(spec)}).encode() + b"\n"
    for _ in range(3):
        conn = _connect(sock_path)
        if conn is None:
            with _spawning:  # one spawn for many threads starting at once
                conn = _connect(sock_path)
                if conn is None and _spawn(state_dir, python, env, ident):
                    conn = _connect(sock_path)
        if conn is None:
            continue
        with conn:
            try:
                conn.sendall(request)
                taken = conn.recv(16)
            except TimeoutError:
                _kill_hung(state_dir)
                continue
            except OSError:
                continue  # it exited under us: the next round spawns another
            if taken != b"+":
                continue  # b"stale" or closed: that launcher is retiring
            conn.sendall(b"go")
            reply = _read_reply(conn)
        if reply == b"ok" or (not reply and is_alive(read_json(spec.parent / supervisor.PIDFILE))):
            return
        raise CommandError(
            ["launcher", str(spec)],
            None,
            reply.decode(errors="replace") or "the launcher's starter gave no answer",
        )
    raise Unavailable(f"no launcher answered on {sock_path}")


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(ACCEPT_TIMEOUT)
    try:
        s.connect(str(path))
    except OSError:  # missing, or a stale socket whose launcher is gone
        s.close()
        return None
    return s


def _read_reply(conn: socket.socket) -> bytes:
    deadline, out = time.monotonic() + REPLY_TIMEOUT, b""
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(4096)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass  # an empty answer: the caller looks at the pid file instead
    return out


def _spawn(state_dir: Path, python: str, env: Mapping[str, str], ident: str) -> bool:
    try:
        run(
            python_argv(
                python,
                "mtgpu.schedd.launcher",
                "--serve",
                str(state_dir),
                "--id",
                ident,
                "--idle",
                str(IDLE_TIMEOUT),
            ),
            env=env,
            timeout=30,
            cwd="/",
        )
        return True
    except CommandError as exc:
        log.warning("cannot start the job launcher: %s", exc)
        return False


def _kill_hung(state_dir: Path) -> None:
    """Kill a launcher that took no request in time; its jobs do not depend on it."""
    record = read_json(state_dir / PIDLOCK)
    if not is_alive(record):
        return
    pid = int(record["pid"])  # type: ignore[index]
    log.warning("job launcher %d is not answering; killing it", pid)
    if not signal_record(record, signal.SIGKILL):
        return
    deadline = time.monotonic() + 5
    while process_start(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)


# --------------------------------------------------------------------------- launcher


def serve(state_dir: Path, ident: str, idle: float) -> int:
    """Become the launcher of ``state_dir``; returns 0 (in the starter) once it listens."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = os.open(state_dir / PIDLOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + 3  # a retiring launcher lets go within moments
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                return 0  # another launcher serves; a hung one is killed by its callers
            time.sleep(0.02)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    if os.fork():
        os.close(ready_w)
        return 0 if os.read(ready_r, 2) == b"ok" else 1
    # Our own session, re-parented to init: the daemon's end is not ours.
    os.setsid()
    os.chdir("/")
    logfd = os.open(state_dir / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    nullfd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(nullfd, 0)
    os.dup2(logfd, 1)  # also lets the spawner's run() see end-of-file on its pipes
    os.dup2(logfd, 2)
    os.close(logfd)
    os.close(nullfd)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"%(asctime)s launcher[{os.getpid()}] %(levelname)s %(message)s",
    )
    sock_path = state_dir / SOCKET
    # We hold the lock, so any socket there is a dead launcher's.
    sock_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    umask = os.umask(0o177)  # 0600 from the start: no moment when others may connect
    listener.bind(str(sock_path))
    os.umask(umask)
    listener.listen(128)
    inode = os.stat(sock_path).st_ino
    os.ftruncate(lock, 0)
    os.pwrite(lock, json.dumps(pid_record(os.getpid())).encode(), 0)
    os.write(ready_w, b"ok")
    os.close(ready_w)
    supervisor.set_process_name("mtgpu-launcher")
    log.info("serving %s (code %s)", sock_path, ident)
    # Supervisors (our forks) set jobs up and tear them down at a lower priority than
    # the daemon and the tenants' sessions, so a burst of job starts cannot slow
    # logins and submissions; each job itself runs at the daemon's priority again.
    base = os.getpriority(os.PRIO_PROCESS, 0)
    os.environ[supervisor.JOB_NICE_ENV] = str(base)
    os.setpriority(os.PRIO_PROCESS, 0, min(19, base + SUPERVISOR_NICE))
    # Out of the collector's sight, the objects we hold stay shared with our
    # children instead of being copied page by page when a collection touches them.
    gc.freeze()
    try:
        _loop(listener, sock_path, inode, ident, idle)
    except Exception:
        log.exception("launcher failed")
    _retire(listener, sock_path, inode)
    os._exit(0)


def _retire(listener: socket.socket, sock_path: Path, inode: int) -> None:
    try:
        if os.stat(sock_path).st_ino == inode:
            sock_path.unlink()
    except FileNotFoundError:
        pass
    listener.close()


def _loop(listener: socket.socket, sock_path: Path, inode: int, ident: str, idle: float) -> None:
    last = time.monotonic()
    while True:
        _reap()
        if not select.select([listener], [], [], 1.0)[0]:
            if time.monotonic() - last > idle:
                log.info("idle for %gs; exiting", idle)
                return
            try:
                if os.stat(sock_path).st_ino != inode:
                    return
            except FileNotFoundError:
                return  # our state directory was removed or replaced
            continue
        conn, _ = listener.accept()
        last = time.monotonic()
        with conn:  # our copy; the starter has its own
            _, uid, _ = struct.unpack(
                "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            )
            if uid != 0:
                log.warning("refused a connection from uid %d", uid)
                continue
            request = _read_request(conn)
            if request is None:
                continue
            if request.get("id") != ident:
                log.info("a caller runs other code (%s); retiring", request.get("id"))
                _retire(listener, sock_path, inode)  # first, so its next connect spawns anew
                try:
                    conn.sendall(b"stale")
                except OSError:
                    pass
                return
            if os.fork() == 0:
                _starter(conn, str(request.get("spec", "")))


def _read_request(conn: socket.socket) -> dict | None:
    conn.settimeout(2.0)  # callers are our own runners; a slow one must not stall others
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 8192:
            chunk = conn.recv(8192)
            if not chunk:
                return None
            data += chunk
        request = json.loads(data)
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _starter(conn: socket.socket, spec: str) -> NoReturn:
    """In a fork of the launcher: become the supervisor of ``spec``."""
    code = 1
    try:
        # The listener and the pid lock must not live on in a supervisor or a job:
        # a held lock would keep the next launcher out.
        fd = conn.fileno()
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 20)
        # A fresh interpreter's signal state, which the supervisor expects.
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        supervisor.default_signals()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        conn.settimeout(ACCEPT_TIMEOUT)
        conn.sendall(b"+")
        if conn.recv(2) == b"go":  # else the caller gave up and may start the job itself
            conn.settimeout(REPLY_TIMEOUT)
            # Returns in the supervisor when the job has ended, or here if the spec is bad.
            code = supervisor.main([spec], reply=conn)
    except BaseException as exc:  # never back into the launcher's loop
        log.exception("starting %s failed", spec)
        if conn.fileno() != -1:
            supervisor._say(conn, f"the launcher could not start the supervisor: {exc}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# --------------------------------------------------------------------------- benchmark


def bench(n: int) -> int:
    """Start ``n`` trivial jobs as a throwaway tenant, without then with the launcher."""
    import pwd
    import shutil
    import tempfile

    from mtgpu.schedd.runner import JobLaunch, JobUser, Runner

    base = Path(tempfile.mkdtemp(prefix="mtgpu-bench-", dir="/tmp"))
    os.chmod(base, 0o755)
    name = f"mtb{os.getpid() % 100000}"
    run(["useradd", "-m", "-d", str(base / name), "-s", "/bin/bash", "-c", "MTGPU bench", name])
    try:
        pw = pwd.getpwnam(name)
        user = JobUser(name, pw.pw_uid, pw.pw_gid, pw.pw_dir, "/bin/bash", (pw.pw_gid,))
        for mode in ("exec", "launcher"):
            r = Runner(base / mode / "jobs")
            r.use_launcher = mode == "launcher"
            t0 = time.monotonic()
            for i in range(n):
                r.start(JobLaunch(f"{mode}{i}", user, "true\n", workdir=pw.pw_dir))
            t1 = time.monotonic()
            while r.running() and time.monotonic() - t1 < 120:
                time.sleep(0.05)
            t2 = time.monotonic()
            print(
                f"{mode:8}: {n / (t1 - t0):6.1f} starts/s; all {n} ended after {t2 - t0:.2f}s "
                f"= {n / (t2 - t0):.1f} jobs/s",
                flush=True,
            )
    finally:
        run(["userdel", "-r", name], check=False)
        shutil.rmtree(base, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``--serve STATE_DIR --id CODE_ID`` (the runner's), or ``--bench N``."""
    p = argparse.ArgumentParser(prog="python -m mtgpu.schedd.launcher")
    p.add_argument("--serve", metavar="STATE_DIR")
    p.add_argument("--id", default="")
    p.add_argument("--idle", type=float, default=IDLE_TIMEOUT)
    p.add_argument("--bench", type=int, metavar="N")
    args = p.parse_args(argv)
    if args.bench:
        return bench(args.bench)
    if not args.serve:
        p.error("give --serve STATE_DIR or --bench N")
    return serve(Path(args.serve), args.id, args.idle)


if __name__ == "__main__":
    sys.exit(main())
