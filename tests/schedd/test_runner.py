"""Job execution on a real host: real tenants, real supervisors, real cgroups.

Every test starts real jobs through :class:`Runner` as a throwaway OS account made
with ``useradd``, and reads what the job saw from the files it wrote. They need
root; the cgroup checks also need the v1 controllers these machines mount.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from mtgpu_testing import REPO, python_env

from mtgpu.cluster.lease import now as lease_now
from mtgpu.errors import JobError
from mtgpu.proc import run
from mtgpu.schedd import launcher
from mtgpu.schedd.cgroups import detect
from mtgpu.schedd.runner import (
    CGROUPS,
    PIDFILE,
    FinalState,
    JobAlreadyStarted,
    JobLaunch,
    JobResult,
    JobUser,
    Runner,
    process_start,
    read_json,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: Tenants cannot run the interpreter under /root; the system one is theirs too.
PY = "/usr/bin/python3"
_ids = itertools.count(1)
V1 = detect().v1
needs_v1 = pytest.mark.skipif(
    not {"memory", "devices", "freezer"} <= set(V1),
    reason="needs the cgroup v1 memory, devices and freezer controllers",
)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mtgpu-runner-", dir="/tmp"))
    os.chmod(d, 0o755)  # tenants reach their homes and the stand-in devices below it
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _useradd(name: str, home: Path) -> None:
    # Another useradd or userdel may hold /etc/passwd's lock for a moment.
    for _ in range(20):
        r = run(
            [
                "useradd",
                "-m",
                "-d",
                str(home),
                "-s",
                "/bin/bash",
                "-K",
                "SUB_UID_COUNT=0",
                "-K",
                "SUB_GID_COUNT=0",
                "-c",
                "MTGPU runner test",
                name,
            ],
            check=False,
        )
        if r.returncode == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"useradd {name}: {r.stderr}")


@pytest.fixture(scope="module")
def tenant(base: Path) -> Iterator[JobUser]:
    """One throwaway tenant for the module, removed (with its processes) at the end."""
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd")
    name = f"mtr{os.getpid() % 100000}"
    _useradd(name, base / name)
    pw = pwd.getpwnam(name)
    yield JobUser(name, pw.pw_uid, pw.pw_gid, pw.pw_dir, "/bin/bash", (pw.pw_gid,))
    # Whatever a failed test left running as this tenant ends by pid.
    procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == pw.pw_uid]
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    run(["userdel", "-r", name], check=False)


@pytest.fixture
def make_runner(base: Path) -> Iterator[Callable[..., Runner]]:
    """A factory of runners, each with its own state directory; jobs left running
    by a failed test are cancelled at the end."""
    made: list[Runner] = []

    def make(**kw: object) -> Runner:
        r = Runner(base / f"state{next(_ids)}" / "jobs", **kw)  # type: ignore[arg-type]
        made.append(r)
        return r

    yield make
    for r in made:
        for job_id in r.running():
            r.cancel(job_id, grace=0)
            wait_result(r, job_id)


@pytest.fixture(params=["helper", "fork"])
def runner(make_runner: Callable[..., Runner], request: pytest.FixtureRequest) -> Runner:
    """Each test runs twice: jobs started by the C helper (jobinit.c, built with the
    host's compiler), and forked from the Python supervisor (no compiler)."""
    r = make_runner()
    if request.param == "fork":
        r.jobinit = None
    return r


@pytest.fixture
def launch(tenant: JobUser) -> Callable[..., JobLaunch]:
    def make(script: str, **kw: Any) -> JobLaunch:
        kw.setdefault("workdir", tenant.home)
        user = kw.pop("user", tenant)
        return JobLaunch(kw.pop("job_id", f"j{next(_ids)}"), user, textwrap.dedent(script), **kw)

    return make


def wait_result(runner: Runner, job_id: str, timeout: float = 30) -> JobResult:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = runner.result(job_id)
        if r is not None:
            return r
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end within {timeout}s")


def wait_file(path: Path, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def out(tenant: JobUser, job_id: str, stream: str = "stdout") -> str:
    return (Path(tenant.home) / ".mtgpu" / "jobs" / job_id / f"{stream}.log").read_text()


def dead(pid: int) -> bool:
    return process_start(pid) is None


# ------------------------------------------------------------------ environment


def test_env_shows_reserved_gpus_uid_and_pinned_cpus(runner: Runner, launch, tenant: JobUser) -> None:
    la = launch(
        """\
        id -u; id -g
        env | sort
        grep Cpus_allowed_list /proc/self/status
        cat /proc/self/cgroup
        cat /proc/self/oom_score_adj
        pwd; umask
        """,
        name="envjob",
        gpu_indices=(1, 3),
        cpus=(0,),
        ram=256 << 20,
        gpu_env={"CUDA_VISIBLE_DEVICES": "GPU-1111,GPU-3333"},
        env={"FOO": "bar", "SLURM_JOB_ID": "x"},
        nnodes=2,
        node_rank=1,
        nodelist=("gpu01", "gpu02"),
        node_name="gpu02",
        master_port=29999,
    )
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.COMPLETED and r.exit_code == 0, r
    lines = out(tenant, la.job_id).splitlines()
    assert lines[:2] == [str(tenant.uid), str(tenant.gid)]
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("/"))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1111,GPU-3333"
    assert env["HOME"] == tenant.home and env["USER"] == tenant.name and env["FOO"] == "bar"
    assert env["MTGPU_JOB_ID"] == env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == la.job_id
    assert env["MTGPU_NODE_RANK"] == env["SLURM_NODEID"] == env["SLURM_PROCID"] == "1"
    assert env["MTGPU_NNODES"] == env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["MTGPU_NODELIST"] == env["SLURM_JOB_NODELIST"] == "gpu01,gpu02"
    assert env["MASTER_ADDR"] == "gpu01" and env["MASTER_PORT"] == "29999"
    assert env["MTGPU_RDZV_ENDPOINT"] == "gpu01:29999"
    assert env["SLURM_GPUS_ON_NODE"] == "2" and env["SLURM_MEM_PER_NODE"] == "256"
    assert env["SLURM_JOB_USER"] == tenant.name and env["SLURM_JOB_NAME"] == "envjob"
    assert not any(k.startswith(("SSH_", "PYTEST", "VIRTUAL_ENV")) for k in env)
    assert "Cpus_allowed_list:\t0" in lines
    assert lines[-3:] == ["0", tenant.home, "0022"]  # not the supervisor's OOM protection
    if V1:
        assert "mtgpu_job_" + la.job_id in "\n".join(lines)
    assert r.limits["cpus"].startswith("affinity")


def test_the_submitting_shells_umask_and_limits_and_open_mode_append(
    runner: Runner, launch, tenant: JobUser
) -> None:
    """Both start paths: the umask, the limits (held within the hard limit here, which
    a tenant cannot raise), and --open-mode=append."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    target = Path(tenant.home) / "append.out"
    target.write_text("before\n")
    os.chown(target, tenant.uid, tenant.gid)
    la = launch(
        "umask; ulimit -Sn; ulimit -Hn; ulimit -Hc; touch made-by-job\n",
        stdout=str(target),
        umask=0o077,
        rlimits={"nofile": [100, 200], "core": [0, -1]},
        open_append=True,
    )
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.COMPLETED, r
    hard_core = resource.getrlimit(resource.RLIMIT_CORE)[1]
    shown_core = "unlimited" if hard_core == resource.RLIM_INFINITY else str(hard_core)
    assert target.read_text() == f"before\n0077\n100\n200\n{shown_core}\n"
    made = Path(tenant.home) / "made-by-job"
    assert oct(made.stat().st_mode & 0o777) == "0o600"
    made.unlink()
    # Asking for more than the member's hard limit gets the hard limit, no more.
    la = launch("ulimit -Hn\n", rlimits={"nofile": [-1, -1]})
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert out(tenant, la.job_id) == f"{shown}\n"


def test_a_warning_signal_comes_before_the_time_limit(runner: Runner, launch, tenant: JobUser) -> None:
    """sbatch's --signal=B:USR1@2 with a 3 s limit: the script's trap runs, then it ends
    by itself before the limit (COMPLETED, not TIMEOUT)."""
    la = launch(
        "trap 'echo warned; exit 0' USR1\nfor i in $(seq 100); do sleep 0.1; done\necho not-warned\n",
        time_limit=3,
        warn_signal=10,
        warn_before=2.0,
        warn_batch_only=True,
    )
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.COMPLETED, r
    assert out(tenant, la.job_id) == "warned\n"


def test_shebang_picks_the_interpreter(runner: Runner, launch, tenant: JobUser) -> None:
    la = launch("#!/usr/bin/python3\nimport os, sys\nprint(os.getuid(), sys.argv[0][:14])\n")
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    assert out(tenant, la.job_id) == f"{tenant.uid} /proc/self/fd/\n"


# ------------------------------------------------------------------ exit and restarts


def test_exit_code_recorded_across_a_new_runner(runner: Runner, launch, base: Path) -> None:
    la = launch("sleep 2; exit 3")
    runner.start(la)
    state_dir = runner.state_dir
    del runner  # the daemon goes away; the supervisor does not
    again = Runner(state_dir)
    assert la.job_id in again.running()
    assert again.result(la.job_id) is None
    deadline = time.monotonic() + 30
    results: list[JobResult] = []
    while not results and time.monotonic() < deadline:
        results = again.poll()
        time.sleep(0.2)
    assert [(r.job_id, r.state, r.exit_code) for r in results] == [(la.job_id, FinalState.FAILED, 3)]
    assert again.poll() == []
    again.ack(la.job_id)
    assert Runner(state_dir).poll() == []  # acknowledged: a later daemon does not report it
    assert again.running() == []
    again.remove(la.job_id)
    assert not again.job_dir(la.job_id).exists() and again.result(la.job_id) is None


def test_kill_9_of_the_daemon_keeps_the_job(base: Path, launch, tenant: JobUser) -> None:
    state = base / f"state{next(_ids)}" / "jobs"
    la = launch("sleep 2; exit 3")
    daemon = textwrap.dedent(f"""
        import json, sys, time
        from mtgpu.schedd.runner import JobLaunch, Runner
        Runner({str(state)!r}).start(JobLaunch.from_dict(json.loads(sys.stdin.readline())))
        print("started", flush=True)
        time.sleep(300)
        """)
    import json

    proc = subprocess.Popen(
        [sys.executable, "-c", daemon],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=python_env(),
        cwd=REPO,
    )
    try:
        proc.stdin.write(json.dumps(la.to_dict()) + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        assert proc.stdout.readline() == "started\n"  # type: ignore[union-attr]
    finally:
        proc.kill()  # kill -9 of the "daemon"
        proc.wait()
    restarted = Runner(state)
    assert restarted.running() == [la.job_id]
    r = wait_result(restarted, la.job_id)
    assert (r.state, r.exit_code, r.reason) == (FinalState.FAILED, 3, "the job exited with status 3")


def test_a_second_dispatch_is_refused(runner: Runner, launch) -> None:
    la = launch("true", term=4)
    runner.start(la)
    with pytest.raises(JobAlreadyStarted, match=r"already started on this host \(term 4\)"):
        runner.start(la)
    assert wait_result(runner, la.job_id).term == 4


def test_lost_supervisor_is_node_fail_and_job_is_killed(runner: Runner, launch, tenant: JobUser) -> None:
    marker = f"lost-{next(_ids)}.pid"  # each run its own: the tenant's home is shared
    la = launch(f"echo $$ > {marker}; sleep 300")
    runner.start(la)
    job_pid = int(wait_file(Path(tenant.home) / marker))
    sup = read_json(runner.job_dir(la.job_id) / PIDFILE)
    assert sup is not None
    os.kill(sup["pid"], signal.SIGKILL)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.NODE_FAIL and "stopped without recording" in r.reason
    if V1:
        assert "remaining processes were killed" in r.reason
        deadline = time.monotonic() + 5
        while not dead(job_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dead(job_pid)
    else:
        os.kill(job_pid, signal.SIGKILL)


# ------------------------------------------------------------------ stopping jobs


def escaping_job(marker: str, ignore_term: bool = False) -> str:
    """A job that leaves a double-forked child in a session of its own (its pid in
    ``marker``), and ignores SIGTERM if asked to."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    return (
        ("trap '' TERM\n" if ignore_term else "") + f"echo $$ > {marker}.main\n"
        f"{PY} -c '\nimport os, signal, time\n{ignore}\nif os.fork() == 0:\n    os.setsid()\n"
        f'    if os.fork() == 0:\n        open("{marker}", "w").write(f"{{os.getpid()}}\\n")\n'
        "        time.sleep(300)\n    os._exit(0)\nos.wait()\n'\n"
        "while true; do sleep 0.1; done\n"
    )


@pytest.mark.parametrize("cgroup_root", ["auto", "none"])
def test_cancel_kills_a_double_forked_setsid_child(
    make_runner, launch, tenant: JobUser, cgroup_root: str
) -> None:
    runner = make_runner(cgroup_root=cgroup_root)
    marker = f"escapee-{next(_ids)}.pid"
    la = launch(escaping_job(marker))
    runner.start(la)
    escapee = int(wait_file(Path(tenant.home) / marker))
    main = int(wait_file(Path(tenant.home) / f"{marker}.main"))
    # Its own session, and its parent gone: neither the job's process group nor its
    # session nor its parent leads to it any more.
    assert os.getsid(escapee) != os.getsid(main)
    assert runner.cancel(la.job_id, grace=1)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.CANCELLED and "cancelled on request" in r.reason
    assert dead(escapee)
    assert not runner.cancel(la.job_id)  # already over


def test_cancel_sends_sigterm_then_sigkill_after_grace(runner: Runner, launch, tenant: JobUser) -> None:
    n = next(_ids)
    la = launch(f"""\
        trap 'echo got-term >> term-{n}.log' TERM
        echo ready > ready-{n}.txt
        while true; do sleep 0.1; done
        """)
    runner.start(la)
    wait_file(Path(tenant.home) / f"ready-{n}.txt")
    t0 = time.monotonic()
    runner.cancel(la.job_id, grace=1.5)
    r = wait_result(runner, la.job_id)
    took = time.monotonic() - t0
    assert r.state is FinalState.CANCELLED and r.signal == signal.SIGKILL
    assert "got-term" in (Path(tenant.home) / f"term-{n}.log").read_text()
    assert 1.0 < took < 10


def test_time_limit_ends_the_job_with_timeout(runner: Runner, launch) -> None:
    la = launch("sleep 60", time_limit=2, kill_grace=1)
    t0 = time.monotonic()
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.TIMEOUT and "time limit of 2s" in r.reason
    assert r.signal == signal.SIGTERM
    assert 1.5 < time.monotonic() - t0 < 15
    # It ended on the SIGTERM: the reason does not claim a SIGKILL that was never sent.
    assert "and they ended within its 1s grace" in r.reason and "SIGKILL" not in r.reason


def test_a_job_that_ignores_sigterm_at_its_time_limit_is_said_to_get_sigkill(runner: Runner, launch) -> None:
    la = launch("trap '' TERM; sleep 60", time_limit=1, kill_grace=1)
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.TIMEOUT and r.signal == signal.SIGKILL
    assert r.reason.endswith("then SIGKILL after 1s to those still running"), r.reason
    assert r.cpu_user is not None and r.cpu_system is not None and r.max_rss


# ------------------------------------------------------------------ limits


@needs_v1
def test_job_over_its_ram_is_out_of_memory_and_others_live(runner: Runner, launch, tenant: JobUser) -> None:
    bystander = subprocess.Popen(["sleep", "300"], user=tenant.uid, group=tenant.gid, start_new_session=True)
    try:
        la = launch(
            f"""\
            {PY} -c 'x = b"x" * (512 << 20)'
            echo "python ended with $?"
            """,
            ram=64 << 20,
        )
        runner.start(la)
        r = wait_result(runner, la.job_id)
        assert r.state is FinalState.OUT_OF_MEMORY, r
        assert "OOM killer" in r.reason and "64M" in r.reason
        assert r.limits["memory"].startswith("cgroup v1")
        assert "python ended with 137" in out(tenant, la.job_id)
        assert bystander.poll() is None  # the tenant's other process lives on
    finally:
        bystander.kill()
        bystander.wait()


def test_memory_watchdog_without_a_cgroup(make_runner, launch) -> None:
    runner = make_runner(memory="watchdog")
    la = launch(f"{PY} -c 'import time; x = b\"x\" * (256 << 20); time.sleep(60)'", ram=64 << 20)
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.OUT_OF_MEMORY
    assert "memory watchdog" in r.reason and r.limits["memory"].startswith("watchdog")


@needs_v1
def test_unreserved_gpu_device_is_eperm(runner: Runner, launch, base: Path) -> None:
    dev = base / f"dev{next(_ids)}"
    dev.mkdir(mode=0o755)
    os.chmod(dev, 0o755)
    for minor in (0, 1):  # stand-ins for /dev/nvidia0 (reserved) and /dev/nvidia1
        os.mknod(dev / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
        os.chmod(dev / f"nvidia{minor}", 0o666)
    la = launch(
        f"""\
        {PY} -c '
        import errno, os
        for n in ("nvidia0", "nvidia1"):
            try:
                os.open("{dev}/" + n, os.O_RDWR)
                print(n, "opened")
            except OSError as e:
                print(n, errno.errorcode[e.errno])
        '
        """,
        device_nodes=(str(dev / "nvidia0"),),
        gpu_indices=(0,),
        gpu_env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    # No driver behind 195:0, so the allowed open reaches the kernel's lookup and
    # fails there; the cgroup refuses 195:1 before that.
    lines = dict(line.split() for line in out(la.user, la.job_id).splitlines())
    assert lines["nvidia0"] in (errno.errorcode[errno.ENXIO], errno.errorcode[errno.ENODEV])
    assert lines["nvidia1"] == "EPERM"


@needs_v1
def test_pids_and_cpuset_limits_are_in_the_cgroup(runner: Runner, launch) -> None:
    la = launch(
        """\
        p=$(grep :pids: /proc/self/cgroup | cut -d: -f3)
        cat /sys/fs/cgroup/pids$p/pids.max
        c=$(grep :cpuset: /proc/self/cgroup | cut -d: -f3)
        cat /sys/fs/cgroup/cpuset$c/cpuset.cpus
        """,
        pids_max=64,
        cpus=(1,),
    )
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    assert out(la.user, la.job_id).split() == ["64", "1"]
    dirs = read_json(runner.job_dir(la.job_id) / CGROUPS)
    assert dirs and not any(Path(d).exists() for d in dirs.values())  # removed at the end


# ------------------------------------------------------------------ files and failures


def test_output_and_error_substitutions(runner: Runner, launch, tenant: JobUser) -> None:
    outdir = Path(tenant.home) / "logs"
    outdir.mkdir(exist_ok=True)
    os.chown(outdir, tenant.uid, tenant.gid)
    la = launch(
        "echo to-out; echo to-err >&2",
        job_id=f"{next(_ids)}_4",
        name="train",
        array_task_id=4,
        array_job_id="77",
        stdout="logs/%x-%A_%a-%j-%u.out",
        stderr="~/logs/%x-%%.err",
    )
    runner.start(la)
    assert wait_result(runner, la.job_id).state is FinalState.COMPLETED
    o = outdir / f"train-77_4-{la.job_id}-{tenant.name}.out"
    assert o.read_text() == "to-out\n" and o.stat().st_uid == tenant.uid
    assert (outdir / "train-%.err").read_text() == "to-err\n"

    both = launch("echo one; echo two >&2", stdout="logs/both-%j.log")
    runner.start(both)
    wait_result(runner, both.job_id)
    assert (outdir / f"both-{both.job_id}.log").read_text() == "one\ntwo\n"


def test_missing_workdir_fails_with_reason(runner: Runner, launch) -> None:
    la = launch("echo never", workdir="/nonexistent/work")
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.FAILED and r.exit_code is None
    assert r.reason == (
        "the job could not start: entering the working directory /nonexistent/work: No such file or directory"
    )  # the path named once


def test_missing_workdir_on_a_member_names_it_and_says_what_to_do(runner: Runner, launch) -> None:
    runner.workdir_help = lambda workdir: f"copy {workdir} to c2"
    try:
        la = launch("echo never", workdir="/nonexistent/work", node_name="c2")
        runner.start(la)
        r = wait_result(runner, la.job_id)
    finally:
        runner.workdir_help = None
    assert r.state is FinalState.FAILED
    assert r.reason == (
        "the job could not start on c2: entering the working directory "
        "/nonexistent/work: No such file or directory; "
        "copy /nonexistent/work to c2"
    )


def test_output_where_the_tenant_cannot_write_is_refused(runner: Runner, launch) -> None:
    evil = Path(f"/etc/mtgpu-evil-{next(_ids)}")
    la = launch("echo pwned", stdout=str(evil))
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.FAILED
    assert r.reason == f"the job could not start: opening the output file {evil}: Permission denied"
    assert not evil.exists()


def test_unknown_jobs_and_root_jobs(runner: Runner, launch, tenant: JobUser) -> None:
    with pytest.raises(JobError, match="never run as root"):
        runner.start(launch("id", user=JobUser("root", 0, 0, "/root")))
    assert runner.result("nope") is None
    assert not runner.cancel("nope")
    assert runner.running() == [] and runner.poll() == []


FAKE_PODMAN = r"""#!/bin/sh
# Stands in for podman: `run` records what it was given and runs the command after the
# image with the script the options mount; `rm` records the removal.
if [ "$1" = rm ]; then echo "$@" >> "$HOME/podman-rm.txt"; exit 0; fi
env > "$HOME/podman-env.txt"
printf '%s\n' "$@" > "$HOME/podman-args.new"
mv "$HOME/podman-args.new" "$HOME/podman-args.txt"  # whole, after the environment
shift
for a in "$@"; do
  case "$a" in --volume=*:/.mtgpu-job:ro) s=${a#--volume=}; script=${s%%:*};; esac
done
while [ "$1" != img:1 ]; do shift; done
shift
interp=$1
exec "$interp" "$script"
"""


def test_a_container_job_gets_its_variables_by_name_and_its_container_removed(
    make_runner: Callable[..., Runner], launch, tenant: JobUser, base: Path
) -> None:
    fake = base / "fake-podman"
    fake.write_text(FAKE_PODMAN)
    fake.chmod(0o755)
    runtime = base / f"run-{tenant.uid}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.chown(runtime, tenant.uid, tenant.gid)
    r = make_runner()
    for body, cancel in (("echo from-the-container $MTGPU_JOB_ID", False), ("sleep 30", True)):
        jid = f"c{next(_ids)}"
        la = launch(
            body,
            job_id=jid,
            container="img:1",
            container_argv=(str(fake), "run", "--rm", f"--name=mtgpu-job-{jid}", "img:1"),
            container_name=f"mtgpu-job-{jid}",
            container_script=f"{runtime}/jobs/{jid}.sh",
            container_env={"XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin"},
        )
        r.start(la)
        if cancel:
            wait_for_file(Path(tenant.home) / "podman-args.txt", jid)
            r.cancel(jid, grace=1)
        res = wait_result(r, jid)
        home = Path(tenant.home)
        args = (home / "podman-args.txt").read_text().splitlines()
        assert "--env=MTGPU_JOB_ID" in args and "--env=PATH" not in args  # names, not values
        assert f"--volume={runtime}/jobs/{jid}.sh:/.mtgpu-job:ro" in args
        assert args[-2:] == ["/bin/sh", "/.mtgpu-job"]  # no #! line: /bin/sh
        env = (home / "podman-env.txt").read_text().splitlines()
        assert f"MTGPU_JOB_ID={jid}" in env and f"XDG_RUNTIME_DIR={runtime}" in env
        assert f"rm --force --ignore --time 0 mtgpu-job-{jid}" in (home / "podman-rm.txt").read_text()
        assert not Path(f"{runtime}/jobs/{jid}.sh").exists()  # the script goes too
        if cancel:
            assert res.state is FinalState.CANCELLED
        else:
            assert res.state is FinalState.COMPLETED
            assert (
                home / ".mtgpu" / "jobs" / jid / "stdout.log"
            ).read_text() == f"from-the-container {jid}\n"


def wait_for_file(path: Path, text: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{path} never mentioned {text}"
        time.sleep(0.05)


def test_the_helper_is_built_once_and_used(make_runner: Callable[..., Runner], launch) -> None:
    assert shutil.which("cc") or shutil.which("gcc"), "tests/run.sh machines have a C compiler"
    r = make_runner()
    la = launch("echo via-helper")
    r.start(la)
    assert wait_result(r, la.job_id).state is FinalState.COMPLETED
    spec = json.loads((r.job_dir(la.job_id) / "spec.json").read_text())
    helper = Path(spec["jobinit"])
    assert helper.parent == r.state_dir and os.access(helper, os.X_OK)
    assert oct(helper.stat().st_mode & 0o777) == "0o700"  # root's alone, in a root-only directory
    la2 = launch("true")
    r.start(la2)
    wait_result(r, la2.job_id)
    assert [p.name for p in r.state_dir.glob(".jobinit-*")] == [helper.name]


def test_supervisors_run_nicer_than_their_jobs(runner: Runner, launch, tenant: JobUser) -> None:
    n = next(_ids)
    la = launch(f"cut -d' ' -f19 /proc/self/stat > nice-{n}.txt; sleep 30")
    runner.start(la)
    job_nice = int(wait_file(Path(tenant.home) / f"nice-{n}.txt"))
    sup = read_json(runner.job_dir(la.job_id) / PIDFILE)["pid"]
    sup_nice = int(Path(f"/proc/{sup}/stat").read_text().rsplit(")", 1)[1].split()[16])
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert job_nice == mine  # the job runs at its daemon's priority...
    assert sup_nice == min(19, mine + launcher.SUPERVISOR_NICE)  # ...its supervisor lower
    runner.cancel(la.job_id, grace=0)
    wait_result(runner, la.job_id)


def test_supervisors_announce_each_end_after_writing_the_result(make_runner, launch) -> None:
    r = make_runner()
    ends = r.listen_ends()
    assert ends is not None and oct((r.state_dir / ".ends.sock").stat().st_mode & 0o777) == "0o600"
    ends.settimeout(15)
    la = launch("true")
    r.start(la)
    assert ends.recv(256).decode() == la.job_id
    assert r.result(la.job_id) is not None  # already on disk when the notice came
    assert [x.job_id for x in r.poll({la.job_id})] == [la.job_id]
    ends.close()


_PRELOAD = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    FILE *f = fopen(MARKER, "a");
    if (f) { fprintf(f, "%d\n", (int)geteuid()); fclose(f); }
}
"""


def test_the_start_helper_never_runs_as_root_with_the_jobs_loader_variables(
    make_runner: Callable[..., Runner], launch, base: Path, tenant: JobUser
) -> None:
    """A job's environment carries LD_PRELOAD: the library is loaded by the job (as the
    tenant), never by the job-start helper while it is still root."""
    marker = base / "preload-marker"
    marker.write_text("")
    os.chmod(marker, 0o666)
    src = base / "preload.c"
    src.write_text(_PRELOAD)
    lib = base / "preload.so"
    run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(src)])
    os.chmod(lib, 0o755)
    r = make_runner()
    la = launch("true\n", env={"LD_PRELOAD": str(lib)})
    r.start(la)
    assert wait_result(r, la.job_id).state is FinalState.COMPLETED
    spec = json.loads((r.job_dir(la.job_id) / "spec.json").read_text())
    assert spec["jobinit"], "the C helper started this job"
    loaded_by = set(marker.read_text().split())
    assert "0" not in loaded_by, "the helper loaded the job's LD_PRELOAD as root"
    assert loaded_by == {str(tenant.uid)}, loaded_by  # the job still gets its variables


def test_the_start_helper_refuses_loader_and_python_variables_of_its_own(
    make_runner: Callable[..., Runner],
) -> None:
    r = make_runner()
    helper = r.build_jobinit()
    assert helper
    for var in ("LD_BIND_NOW=1", "PYTHONPATH=/tmp"):
        name, value = var.split("=")
        p = subprocess.run(
            [helper, "x", "0", "u", "1", *["0"] * 8, "--", "true"],
            env={name: value},
            capture_output=True,
            text=True,
            check=False,
        )
        assert p.returncode == 127
        assert f"refusing to start with {name} in the environment" in p.stdout


def poll_until(runner: Runner, job_id: str, timeout: float = 30) -> JobResult:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in runner.poll():
            if r.job_id == job_id:
                return r
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} was not reported within {timeout}s")


def test_each_attempt_of_a_requeued_job_is_reported_and_cancelled_on_its_own(runner: Runner, launch) -> None:
    """A requeued job started again here (same id, same term, the next attempt): one
    runner reports both ends, and a stop meant for the earlier attempt (or its ack)
    never reaches the later one."""
    first = launch("echo first $MTGPU_RESTART_COUNT\n", term=3, attempt=0)
    runner.start(first)
    r0 = poll_until(runner, first.job_id)
    assert (r0.attempt, r0.state) == (0, FinalState.COMPLETED)
    runner.ack(first.job_id, 0)
    second = replace(first, script="echo second $MTGPU_RESTART_COUNT; sleep 60\n", attempt=1)
    runner.start(second)
    assert runner.launch_run(first.job_id) == (3, 1)
    assert runner.cancel(first.job_id, grace=0, attempt=0) is False  # attempt 0 is over
    assert first.job_id in runner.running()
    assert runner.cancel(first.job_id, grace=0, attempt=1) is True
    r1 = poll_until(runner, first.job_id)
    assert (r1.attempt, r1.state) == (1, FinalState.CANCELLED)
    acked = runner.job_dir(first.job_id) / "acked"
    runner.ack(first.job_id, 0)  # a late ack of attempt 0 does not mark attempt 1's end
    assert not acked.exists()
    runner.ack(first.job_id, 1)
    assert acked.exists()


# ------------------------------------------------------------------ leases (fencing)


def _lease(runner: Runner, seconds: float, grace: float) -> Any:
    from mtgpu.cluster.lease import MemberLease

    lease = MemberLease(runner.state_dir, grace)
    lease.granted(lease_now(), seconds)
    return lease


class Renewing:
    """Renews ``lease`` every 0.3 s, as a member's reports do, until the block ends."""

    def __init__(self, lease: Any, seconds: float) -> None:
        import threading

        self.lease, self.seconds = lease, seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.3):
            self.lease.granted(lease_now(), self.seconds)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("cgroup_root", ["auto", "none"])
def test_a_job_whose_members_lease_runs_out_is_fenced_even_if_it_ignores_sigterm(
    make_runner, launch, tenant: JobUser, cgroup_root: str
) -> None:
    # A hostile job: it ignores SIGTERM and leaves a double-forked child in a session
    # of its own, hoping to outlive its member's lease.
    runner = make_runner(cgroup_root=cgroup_root)
    marker = f"fenced-{next(_ids)}.pid"
    la = launch(escaping_job(marker, ignore_term=True))
    lease = _lease(runner, 1.5, 1.0)
    with Renewing(lease, 1.5):
        runner.start(la)
        escapee = int(wait_file(Path(tenant.home) / marker))
        assert runner.result(la.job_id) is None  # runs while the lease holds
    r = wait_result(runner, la.job_id, timeout=30)
    assert r.state is FinalState.NODE_FAIL and r.reason.startswith("fenced: "), r
    assert "SIGKILL after 1s" in r.reason
    assert dead(escapee)
    assert lease_now() >= lease.until  # not before the lease ran out


def test_a_renewed_lease_keeps_the_job_and_one_not_renewed_fences_it(
    runner: Runner, launch, tenant: JobUser
) -> None:
    n = next(_ids)
    la = launch(f"echo up > up-{n}.txt\nwhile true; do sleep 0.1; done\n")
    with Renewing(_lease(runner, 1.5, 0.5), 1.5):
        runner.start(la)
        wait_file(Path(tenant.home) / f"up-{n}.txt")
        time.sleep(4)  # well past the first lease
        assert runner.result(la.job_id) is None
    r = wait_result(runner, la.job_id, timeout=20)
    assert r.state is FinalState.NODE_FAIL and r.reason.startswith("fenced: ")


def test_a_job_is_not_started_on_a_lease_that_ran_out_or_comes_from_another_boot(
    runner: Runner, launch, tenant: JobUser
) -> None:
    from mtgpu.cluster.lease import LEASE_FILE

    n = next(_ids)
    runner.state_dir.mkdir(parents=True, exist_ok=True)
    # A lease far in the future, but written before a reboot: it means nothing now.
    (runner.state_dir / LEASE_FILE).write_text(
        json.dumps({"until": lease_now() + 3600, "grace": 1, "boot": "another-boot"})
    )
    la = launch(f"echo ran > ran-{n}.txt\nsleep 60\n")
    runner.start(la)
    r = wait_result(runner, la.job_id)
    assert r.state is FinalState.NODE_FAIL and r.reason.startswith("fenced: ")
    assert not (Path(tenant.home) / f"ran-{n}.txt").exists()
