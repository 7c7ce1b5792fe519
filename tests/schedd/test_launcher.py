"""The launcher, the fork server that starts supervisors: real jobs as a throwaway tenant.

Jobs must outlive the launcher, a dead, hung, stale or idle launcher must be
replaced without the caller noticing, and nothing of the launcher may reach a job.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mtgpu.proc import run
from mtgpu.schedd import launcher
from mtgpu.schedd.runner import PIDFILE, FinalState, JobLaunch, JobResult, JobUser, Runner, read_json

pytestmark = [pytest.mark.root, pytest.mark.slow]
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mtgpu-launcher-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)  # launchers notice their socket is gone and exit


@pytest.fixture(scope="module")
def tenant(base: Path) -> Iterator[JobUser]:
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd")
    name = f"mtl{os.getpid() % 100000}"
    run(["useradd", "-m", "-d", str(base / name), "-s", "/bin/bash", "-c", "MTGPU launcher test", name])
    pw = pwd.getpwnam(name)
    yield JobUser(name, pw.pw_uid, pw.pw_gid, pw.pw_dir, "/bin/bash", (pw.pw_gid,))
    run(["pkill", "-KILL", "-u", name], check=False)
    run(["userdel", "-r", name], check=False)


def state(base: Path) -> Path:
    return base / f"state{next(_ids)}" / "jobs"


def job(tenant: JobUser, script: str) -> JobLaunch:
    return JobLaunch(f"j{next(_ids)}", tenant, script, workdir=tenant.home)


def wait_result(runner: Runner, job_id: str, timeout: float = 30) -> JobResult:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (r := runner.result(job_id)) is not None:
            return r
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end within {timeout}s")


def launcher_pid(runner: Runner) -> int:
    return int(read_json(runner.state_dir / launcher.PIDLOCK)["pid"])


def gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def out(tenant: JobUser, job_id: str) -> str:
    return (Path(tenant.home) / ".mtgpu" / "jobs" / job_id / "stdout.log").read_text()


def test_kill_9_of_the_launcher_keeps_the_job(base: Path, tenant: JobUser) -> None:
    runner = Runner(state(base))
    la = job(tenant, "sleep 2; exit 3")
    runner.start(la)
    first = launcher_pid(runner)
    os.kill(first, signal.SIGKILL)
    assert gone(first)
    assert (runner.state_dir / launcher.SOCKET).exists()  # stale now
    again = Runner(runner.state_dir)
    assert again.running() == [la.job_id]
    r = wait_result(again, la.job_id)
    assert (r.state, r.exit_code) == (FinalState.FAILED, 3), r
    # The next start replaces the dead launcher behind its stale socket.
    la2 = job(tenant, "true")
    again.start(la2)
    assert wait_result(again, la2.job_id).state is FinalState.COMPLETED
    assert launcher_pid(again) != first


def test_concurrent_starts_share_one_launcher(base: Path, tenant: JobUser) -> None:
    runner = Runner(state(base))
    jobs = [job(tenant, "echo hi") for _ in range(12)]
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(runner.start, jobs))
    assert all(wait_result(runner, la.job_id).state is FinalState.COMPLETED for la in jobs)
    serving = [
        p
        for p in os.listdir("/proc")
        if p.isdigit()
        and _cmdline(int(p)).endswith(
            f"--serve\0{runner.state_dir}\0--id\0{launcher.code_id(runner.python)}\0--idle\0"
            f"{launcher.IDLE_TIMEOUT}\0"
        )
    ]
    assert serving == [str(launcher_pid(runner))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_nothing_of_the_launcher_reaches_supervisors_or_jobs(base: Path, tenant: JobUser) -> None:
    script = "ls /proc/self/fd; grep -E '^Sig(Blk|Ign|Cgt)' /proc/self/status; sleep 1\n"
    seen = {}
    for use in (False, True):
        runner = Runner(state(base))
        runner.use_launcher = use
        la = job(tenant, script)
        runner.start(la)
        sup = read_json(runner.job_dir(la.job_id) / PIDFILE)["pid"]
        fds = []
        for fd in os.listdir(f"/proc/{sup}/fd"):
            try:
                fds.append(os.readlink(f"/proc/{sup}/fd/{fd}"))
            except FileNotFoundError:
                pass  # closed meanwhile: the supervisor is starting the job

        assert not [f for f in fds if "socket:" in f or ".launcher" in f], fds
        assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
        seen[use] = out(tenant, la.job_id)
    assert seen[True] == seen[False]  # the same fds and signal state as without it


def test_a_hung_launcher_is_replaced(base: Path, tenant: JobUser, monkeypatch) -> None:
    monkeypatch.setattr(launcher, "ACCEPT_TIMEOUT", 1.0)
    runner = Runner(state(base))
    runner.start(job(tenant, "true"))
    hung = launcher_pid(runner)
    os.kill(hung, signal.SIGSTOP)
    la = job(tenant, "true")
    runner.start(la)
    assert gone(hung)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED


def test_only_root_may_talk_to_it(base: Path, tenant: JobUser) -> None:
    runner = Runner(state(base))
    runner.start(job(tenant, "true"))
    sock = runner.state_dir / launcher.SOCKET
    assert sock.stat().st_mode & 0o777 == 0o600 and runner.state_dir.stat().st_mode & 0o777 == 0o700
    # Open the way in on purpose: the peer check must still refuse the tenant.
    os.chmod(runner.state_dir, 0o711)
    os.chmod(sock, 0o666)
    code = (
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(sock)!r})\n"
        "try: s.sendall(b'{}\\n'); print(repr(s.recv(16)))\n"
        "except OSError: print(repr(b''))  # refused before we could even ask"
    )
    r = subprocess.run(
        ["/usr/bin/python3", "-c", code],
        user=tenant.uid,
        capture_output=True,
        text=True,
        timeout=10,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.stdout == "b''\n", r.stderr
    os.chmod(runner.state_dir, 0o700)
    with socket.socket(socket.AF_UNIX) as s:  # and root still may
        s.connect(str(sock))


def test_idle_stale_and_missing_launchers(base: Path, tenant: JobUser, monkeypatch) -> None:
    runner = Runner(state(base))
    runner.start(job(tenant, "true"))
    old = launcher_pid(runner)
    # Code that changed under a running launcher gets a fresh one.
    monkeypatch.setattr(launcher, "code_id", lambda python: "other code")
    la = job(tenant, "true")
    runner.start(la)
    assert gone(old) and launcher_pid(runner) != old
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    # An idle launcher exits and takes its socket along.
    monkeypatch.setattr(launcher, "IDLE_TIMEOUT", 0.5)
    runner = Runner(state(base))
    runner.start(job(tenant, "true"))
    assert gone(launcher_pid(runner), timeout=10)
    assert not (runner.state_dir / launcher.SOCKET).exists()
    # With no launcher to be had, start() execs the supervisor as it always did.
    monkeypatch.setattr(launcher, "_spawn", lambda *a: False)
    la = job(tenant, "true")
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
