"""Every process a tenant starts through MTGPU is fenced: its session cgroup (limits,
no GPU device files) and its private /tmp, /var/tmp, /dev/shm and /proc.

A real daemon with two tenants, reached with the real OpenSSH client. Stand-in GPU
device files (NVIDIA's major 195, no driver behind them) show the devices cgroup at
work: the cgroup refuses an open with EPERM before any driver is asked, while an
allowed open reaches the kernel's lookup and fails there (ENXIO/ENODEV).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from mtgpu_testing import Host, wait_for

from mtgpu.schedd import cgroups, fence

pytestmark = pytest.mark.root

SYSTEM = cgroups.detect()
SESSION_PIDS = 60
SESSION_MEMORY = 512 << 20
PY = "/usr/bin/python3"

needs_devices = pytest.mark.skipif(
    "devices" not in SYSTEM.v1, reason="this kernel has no cgroup v1 devices controller"
)
needs_pids = pytest.mark.skipif(
    "pids" not in SYSTEM.v1 and "pids" not in SYSTEM.v2_controllers,
    reason="this kernel has no pids cgroup controller",
)

# Opens each stand-in device and prints its name and the errno name (or "opened").
OPEN_DEVICES = (
    f"{PY} -c 'import errno, os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    '        os.close(os.open(p, os.O_RDWR)); print(os.path.basename(p), "opened")\n'
    "    except OSError as e:\n"
    "        print(os.path.basename(p), errno.errorcode[e.errno])\n'"
)


@pytest.fixture(scope="module")
def devdir():
    """Stand-ins for /dev/nvidia0 and /dev/nvidia1, in a directory of our own under /dev
    (which every mount namespace shares)."""
    d = Path(f"/dev/mtgpu-t-{uuid.uuid4().hex[:8]}")
    d.mkdir(mode=0o755)
    try:
        for minor in (0, 1):
            os.mknod(d / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
            os.chmod(d / f"nvidia{minor}", 0o666)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def host(devdir):
    h = Host(
        {
            "SESSION_PIDS": SESSION_PIDS,
            "SESSION_MEMORY": SESSION_MEMORY,
            "SESSION_CPU_WEIGHT": 50,
            "PRIVATE_TMP_SIZE": "64M",
            "SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G", "device_dir": str(devdir)}],
        }
    )
    h.start()
    try:
        h.keys_of = {n: h.add_user(n) for n in ("ann", "bob")}
        for n, k in h.keys_of.items():
            r = h.ssh(n, k, "true")
            assert r.returncode == 0, r.stderr
        yield h
    finally:
        h.cleanup()


def sh(h: Host, user: str, cmd: str, **kw) -> subprocess.CompletedProcess[bytes]:
    return h.ssh(user, h.keys_of[user], cmd, **kw)


def uid_of(h: Host, user: str) -> int:
    return int(h.passwd(user)[2])


def submit(h: Host, user: str, script: str) -> str:
    r = sh(h, user, "mt-job submit --parsable -", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def finished(h: Host, user: str, jid: str) -> dict:
    import json

    def done():
        r = sh(h, user, f"mt-job show {jid} --json")
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        return j if j.get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

    return wait_for(done, 120, f"job {jid} to end")


def job_output(h: Host, user: str, job: dict) -> str:
    return sh(h, user, f"cat {job['stdout']}").stdout.decode()


# ------------------------------------------------------------------ session cgroup


def test_session_processes_are_in_the_tenant_cgroup(host: Host) -> None:
    uid = uid_of(host, "ann")
    want = f"/{fence.SLICE}/tenant-{uid}"
    r = sh(host, "ann", "cat /proc/self/cgroup")
    lines = {ln.split(":", 2)[1]: ln.split(":", 2)[2] for ln in r.stdout.decode().splitlines()}
    for ctrl in ("memory", "pids", "devices", "freezer"):
        if ctrl in SYSTEM.v1:
            assert lines[ctrl].endswith(want), (ctrl, lines)
    if "cpu" in SYSTEM.v1:
        assert lines["cpu"].endswith(want), lines
    dirs = fence.session_dirs(SYSTEM, uid)
    if "memory" in dirs:
        assert int(Path(dirs["memory"], "memory.limit_in_bytes").read_text()) == SESSION_MEMORY
    if "cpu" in dirs:
        assert Path(dirs["cpu"], "cpu.shares").read_text().strip() == str(50 * 1024 // 100)


def test_tmux_server_and_sftp_server_run_in_the_tenant_cgroup(host: Host) -> None:
    uid = uid_of(host, "ann")
    want = f"/{fence.SLICE}/tenant-{uid}"
    r = sh(
        host,
        "ann",
        "tmux -L mtgpu new -d -s fenced 'sleep 300' && "
        "tmux -L mtgpu display -p -t fenced '#{pid} #{pane_pid}'",
    )
    assert r.returncode == 0, r.stderr
    for pid in r.stdout.split():
        text = Path(f"/proc/{int(pid)}/cgroup").read_text()
        assert all(
            ln.endswith(want) for ln in text.splitlines() if ln.split(":")[1] in ("pids", "devices", "memory")
        ), text
    sftp = subprocess.Popen(
        host.ssh_argv("ann", host.keys_of["ann"], opts=["-s"]) + ["sftp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid = wait_for(
            lambda: subprocess.run(
                ["pgrep", "-u", str(uid), "-f", "sftp-server"], check=False, capture_output=True, text=True
            ).stdout.split(),
            30,
            "ann's sftp-server",
        )[0]
        text = Path(f"/proc/{int(pid)}/cgroup").read_text()
        assert any(ln.endswith(want) for ln in text.splitlines() if ":pids:" in ln), text
    finally:
        sftp.kill()
        sftp.wait()
    sh(host, "ann", "tmux -L mtgpu kill-session -t fenced")


def test_a_session_cannot_move_itself_out_of_its_cgroup(host: Host) -> None:
    """Hostile: the tenant writes its shell's pid into the root cgroup and the
    daemon's own; both are root's files."""
    own = cgroups.own_paths()
    targets = [f"{m}/cgroup.procs" for m in SYSTEM.v1.values()]
    targets += [os.path.normpath(f"{m}/{own.get(c, '/')}/cgroup.procs") for c, m in SYSTEM.v1.items()]
    r = sh(
        host,
        "ann",
        "for f in " + " ".join(targets) + "; do echo $$ > $f 2>/dev/null && "
        "echo MOVED $f; done; cat /proc/self/cgroup",
    )
    assert b"MOVED" not in r.stdout, r.stdout
    assert f"tenant-{uid_of(host, 'ann')}".encode() in r.stdout


@needs_devices
def test_a_session_gets_eperm_on_a_gpu_device_that_a_job_reserving_it_opens(host: Host, devdir: Path) -> None:
    nodes = f"{devdir}/nvidia0 {devdir}/nvidia1"
    r = sh(host, "ann", f"{OPEN_DEVICES} {nodes}")
    assert r.stdout.decode().split() == ["nvidia0", "EPERM", "nvidia1", "EPERM"], r
    jid = submit(host, "ann", f"#!/bin/sh\n#MTGPU gpus=rtx4090:1\n{OPEN_DEVICES} {nodes}\n")
    job = finished(host, "ann", jid)
    assert job["state"] == "COMPLETED", job
    got = dict(line.split() for line in job_output(host, "ann", job).splitlines())
    mine = f"nvidia{job['gpus'][0]['index'] if isinstance(job['gpus'][0], dict) else job['gpus'][0]}"
    other = ({"nvidia0", "nvidia1"} - {mine}).pop()
    # The reserved one reaches the kernel's lookup (no driver here); the other is walled off.
    assert got[mine] in (errno.errorcode[errno.ENXIO], errno.errorcode[errno.ENODEV]), got
    assert got[other] == "EPERM", got


@needs_devices
def test_a_job_cannot_get_gpus_or_escape_its_limits_through_the_tmux_server(host: Host, devdir: Path) -> None:
    """Hostile: a job asks the tenant's tmux server (started from a session) to run
    something; that runs in the session cgroup, never outside every cgroup."""
    uid = uid_of(host, "bob")
    r = sh(host, "bob", "tmux -L mtgpu new -d -s base 'sleep 300'")
    assert r.returncode == 0, r.stderr
    out = "$HOME/escaped.txt"
    jid = submit(
        host,
        "bob",
        "#!/bin/sh\n#MTGPU gpus=rtx4090:2\n"
        f'tmux -L mtgpu new -d -s escape "{OPEN_DEVICES} {devdir}/nvidia0 {devdir}/nvidia1 '
        f'> {out}; cat /proc/self/cgroup >> {out}"\nsleep 2\n',
    )
    assert finished(host, "bob", jid)["state"] == "COMPLETED"
    text = wait_for(
        lambda: (t := sh(host, "bob", f"cat {out}").stdout.decode()) and "pids" in t and t,
        30,
        "the command run through tmux",
    )
    assert "nvidia0 EPERM" in text and "nvidia1 EPERM" in text, text
    assert any(ln.endswith(f"/{fence.SLICE}/tenant-{uid}") for ln in text.splitlines() if ":pids:" in ln), (
        text
    )
    sh(host, "bob", "tmux -L mtgpu kill-server")


@needs_pids
def test_a_fork_loop_in_a_session_stops_at_session_pids(host: Host) -> None:
    """Hostile: a fork loop. It stops near SESSION_PIDS (the session's shell and the
    loop itself count too), and the children are cleaned up."""
    loop = (
        f"{PY} -c 'import os, time\n"
        "kids = []\n"
        "while len(kids) < 1000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print(len(kids))\n"
        "for k in kids: os.kill(k, 9)\n'"
    )
    r = sh(host, "ann", loop)
    forked = int(r.stdout.split()[-1])
    assert SESSION_PIDS - 10 < forked < SESSION_PIDS, (forked, r.stderr)


# -------------------------------------------------------------- private places


def test_two_tenants_have_their_own_tmp_var_tmp_and_dev_shm(host: Host) -> None:
    mark = f"mark-{uuid.uuid4().hex[:8]}"
    r = sh(host, "ann", f"for d in /tmp /var/tmp /dev/shm; do echo ann > $d/{mark}; done && echo ok")
    assert r.stdout.strip() == b"ok", r.stderr
    r = sh(
        host,
        "bob",
        f"for d in /tmp /var/tmp /dev/shm; do cat $d/{mark} 2>/dev/null; "
        f"echo bob > $d/{mark}; done; cat /tmp/{mark}",
    )
    assert r.stdout.decode().split() == ["bob"], r
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not Path(d, mark).exists()  # not the host's either
    r = sh(host, "ann", f"cat /tmp/{mark} /var/tmp/{mark} /dev/shm/{mark}")
    assert r.stdout.decode().split() == ["ann"] * 3


def test_a_file_in_tmp_survives_the_next_login_and_jobs_see_it(host: Host) -> None:
    mark = f"keep-{uuid.uuid4().hex[:8]}"
    assert sh(host, "ann", f"echo first > /tmp/{mark}").returncode == 0
    assert sh(host, "ann", f"cat /tmp/{mark}").stdout == b"first\n"
    jid = submit(host, "ann", f"#!/bin/sh\ncat /tmp/{mark}\necho from-job > /tmp/{mark}.job\n")
    job = finished(host, "ann", jid)
    assert job_output(host, "ann", job) == "first\n"
    assert sh(host, "ann", f"cat /tmp/{mark}.job").stdout == b"from-job\n"


def test_private_tmp_is_bounded_by_its_size(host: Host) -> None:
    """Hostile: filling /tmp stops at PRIVATE_TMP_SIZE instead of the host's memory."""
    r = sh(
        host,
        "bob",
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>&1; du -m /dev/shm/fill; rm -f /dev/shm/fill",
    )
    assert b"No space left on device" in r.stdout, r.stdout
    assert int(r.stdout.split()[-2]) <= 64


def test_a_tenant_cannot_see_another_tenants_processes(host: Host) -> None:
    r = sh(
        host,
        "bob",
        "tmux -L mtgpu new -d -s secret 'sleep 301; echo secret-arg' && "
        "tmux -L mtgpu display -p -t secret '#{pane_pid}'",
    )
    assert r.returncode == 0, r.stderr
    pid = r.stdout.split()[-1].decode()
    try:
        listing = sh(host, "ann", "ls /proc").stdout.decode().split()
        assert pid not in listing and "1" not in listing
        r = sh(host, "ann", f"cat /proc/{pid}/cmdline")
        assert r.returncode != 0 and b"secret-arg" not in r.stdout
        assert b"sleep 301" not in sh(host, "ann", "ps -eo args").stdout
        # Each still sees its own processes.
        assert b"secret-arg" in sh(host, "bob", f"cat /proc/{pid}/cmdline").stdout
        assert sh(host, "ann", "test -r /proc/$$/cmdline && echo mine").stdout == b"mine\n"
    finally:
        sh(host, "bob", "tmux -L mtgpu kill-session -t secret")


def test_a_tenant_cannot_unmount_its_private_tmp(host: Host) -> None:
    """Hostile: only root could undo the namespace, and the tenant is not root there."""
    r = sh(host, "ann", "umount /tmp 2>&1; umount /proc 2>&1; echo done")
    assert r.stdout.strip().endswith(b"done")
    r2 = sh(host, "ann", "grep -c mtgpu-tmp /proc/self/mounts; grep -c hidepid /proc/self/mounts")
    assert [int(x) for x in r2.stdout.split()] >= [3, 1], r2.stdout


# --------------------------------------------------------- interactive allocations

PROBE = f"""echo CVD=$CUDA_VISIBLE_DEVICES JOB=$MTGPU_JOB_ID
{OPEN_DEVICES} "$@"
grep :devices: /proc/self/cgroup
mt-job list --json | {PY} -c 'import json, os, sys
print("LISTED", [j["state"] for j in json.load(sys.stdin) if j["job_id"] == os.environ["MTGPU_JOB_ID"]])'
"""


@needs_devices
def test_an_allocation_gives_its_shell_exactly_its_gpus_and_ends_with_it(host: Host, devdir: Path) -> None:
    assert sh(host, "ann", "cat > probe.sh", input=PROBE.encode()).returncode == 0
    r = sh(
        host,
        "ann",
        f"mt-job alloc --gres gpu:rtx4090:1 -t 10m -J probe -- sh probe.sh {devdir}/nvidia0 {devdir}/nvidia1",
        timeout=180,
    )
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr)
    first = dict(kv.split("=", 1) for kv in out.splitlines()[0].split())
    jid, mine = first["JOB"], f"nvidia{first['CVD']}"
    other = ({"nvidia0", "nvidia1"} - {mine}).pop()
    got = dict(ln.split() for ln in out.splitlines()[1:3])
    assert got[mine] in ("ENXIO", "ENODEV") and got[other] == "EPERM", out
    assert f"mtgpu_job_{jid}_" in out.splitlines()[3], out  # the allocation's own cgroup
    assert "LISTED ['RUNNING']" in out, out
    assert b"granted job allocation" in r.stderr and b"relinquishing" in r.stderr
    job = finished(host, "ann", jid)
    assert job["state"] == "COMPLETED" and job["name"] == "probe", job  # left with exit 0


def test_an_allocation_ends_at_its_time_limit(host: Host) -> None:
    r = sh(
        host, "bob", "mt-job alloc -t 0:00:05 -- sh -c 'echo JOB=$MTGPU_JOB_ID; exec sleep 300'", timeout=240
    )
    jid = r.stdout.decode().split("JOB=")[1].split()[0]
    assert finished(host, "bob", jid)["state"] == "TIMEOUT"
    assert not subprocess.run(
        ["pgrep", "-u", str(uid_of(host, "bob")), "-f", "sleep 300"], check=False, capture_output=True
    ).stdout  # the shell went with it


def test_a_tenant_cannot_adopt_into_anothers_job_or_adopt_anothers_process(host: Host) -> None:
    """Hostile: job.adopt with another tenant's job, another tenant's process, and a
    root process (the daemon)."""
    from security_testing import api_socket, call

    jid = submit(host, "ann", "#!/bin/sh\nsleep 120\n")
    wait_for(
        lambda: sh(host, "ann", f"mt-job show {jid} --json").stdout.count(b'"RUNNING"'),
        60,
        "ann's job to run",
    )
    bob_pid = int(sh(host, "bob", "sleep 60 >/dev/null 2>&1 & echo $!").stdout)
    ann, bob = uid_of(host, "ann"), uid_of(host, "bob")
    try:
        with api_socket(host.run_dir, bob) as s:
            r = call(s, "job.adopt", {"job_id": jid, "pid": bob_pid})
            assert not r["ok"] and r["code"] == "not_found", r
        with api_socket(host.run_dir, ann) as s:
            for pid in (bob_pid, host._server_pid(), 1):
                r = call(s, "job.adopt", {"job_id": jid, "pid": pid})
                assert not r["ok"] and r["code"] == "forbidden", r
        for pid in (bob_pid, host._server_pid()):
            assert "mtgpu_job_" not in Path(f"/proc/{pid}/cgroup").read_text()
    finally:
        sh(host, "ann", f"mt-job cancel {jid}")


@needs_devices
def test_a_single_person_host_gives_sessions_the_gpus_no_job_holds(devdir: Path) -> None:
    """SESSION_GPUS: free. A job's GPU is walled off from sessions while it runs and
    given back after; the other GPU stays open to sessions throughout."""
    h = Host(
        {
            "SESSION_GPUS": "free",
            "SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G", "device_dir": str(devdir)}],
        }
    )
    h.start()
    try:
        h.keys_of = {"solo": h.add_user("solo")}
        nodes = f"{devdir}/nvidia0 {devdir}/nvidia1"

        def opens() -> dict[str, str]:
            return dict(
                ln.split() for ln in sh(h, "solo", f"{OPEN_DEVICES} {nodes}").stdout.decode().splitlines()
            )

        assert set(opens().values()) <= {"ENXIO", "ENODEV"}  # no job: both reach the kernel
        jid = submit(h, "solo", "#!/bin/sh\n#MTGPU gpus=rtx4090:1\nsleep 300\n")
        import json

        job = wait_for(
            lambda: (
                (j := json.loads(sh(h, "solo", f"mt-job show {jid} --json").stdout))["state"] == "RUNNING"
                and j
            ),
            60,
            "the job to run",
        )
        held = f"nvidia{job['gpus'][0]['index']}"
        free = ({"nvidia0", "nvidia1"} - {held}).pop()
        got = wait_for(lambda: (o := opens())[held] == "EPERM" and o, 30, "the held GPU walled off")
        assert got[free] in ("ENXIO", "ENODEV"), got
        sh(h, "solo", f"mt-job cancel {jid}")
        wait_for(lambda: set(opens().values()) <= {"ENXIO", "ENODEV"}, 60, "the GPU given back")
    finally:
        h.cleanup()
