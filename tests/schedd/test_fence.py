"""The tenant fence's parts: where session cgroups go, what a kernel lacks, the argv
that starts a fenced program, the configuration keys, and which namespaces it adopts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from mtgpu.config import Options, load_text
from mtgpu.errors import ConfigError
from mtgpu.install.setup import isolation_lines
from mtgpu.schedd.cgroups import CgroupSystem
from mtgpu.schedd.fence import SessionLimits, TenantFence, memory_limit, session_dirs


def test_session_cgroups_nest_under_the_daemon_on_v1_and_at_the_top_on_v2() -> None:
    hybrid = CgroupSystem({"memory": "/cg/memory", "pids": "/cg/pids", "cpuset": "/cg/cpuset"}, "/cg/unified")
    dirs = session_dirs(hybrid, 20001, {"memory": "/svc", "pids": "/", "": "/svc"})
    assert dirs == {
        "memory": "/cg/memory/svc/mtgpu.slice/tenant-20001",
        "pids": "/cg/pids/mtgpu.slice/tenant-20001",
        "v2": "/cg/unified/svc/mtgpu.slice/tenant-20001",
    }  # no cpuset for sessions
    v2 = CgroupSystem({}, "/sys/fs/cgroup", frozenset({"memory", "pids", "cpu"}))
    assert session_dirs(v2, 7, {"": "/system.slice/mtgpu.service"}) == {
        "v2": "/sys/fs/cgroup/mtgpu.slice/tenant-7"
    }


def test_a_kernel_without_controllers_is_named_in_every_line() -> None:
    lacking = TenantFence(CgroupSystem(), SessionLimits(), "/nonexistent", tmp_size=None).lacking()
    text = "\n".join(lacking)
    for word in ("memory", "pids", "cpu", "devices"):
        assert f"no {word}" in text or f"v1 {word}" in text, text
    assert "SESSION_PIDS is not enforced" in text
    full = CgroupSystem({c: f"/cg/{c}" for c in ("memory", "pids", "cpu", "devices", "freezer")})
    fence = TenantFence(full, SessionLimits(), "/nonexistent", tmp_size=None)
    fence.tools = {
        "setpriv": "/usr/bin/setpriv",
        "nsenter": "/usr/bin/nsenter",
        "unshare": "/usr/bin/unshare",
    }
    assert fence.lacking() == []


def test_the_fenced_argv_joins_the_cgroups_then_becomes_the_tenant(monkeypatch) -> None:
    fence = TenantFence(CgroupSystem(), SessionLimits(), "/nonexistent", tmp_size=None)
    fence.tools = {"setpriv": "/usr/bin/setpriv", "nsenter": None, "unshare": None}
    monkeypatch.setattr(fence, "session_cgroup", lambda uid, gid: [f"/cg/pids/t-{uid}/cgroup.procs"])
    argv = fence.prefix(20001, 20001, [20001, 27], "/home/ann")
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[3:6] == ["mtgpu-session", "/cg/pids/t-20001/cgroup.procs", "--"]
    assert argv[6:] == ["/usr/bin/setpriv", "--reuid=20001", "--regid=20001", "--groups=20001,27", "--"]
    monkeypatch.setattr(fence, "namespace", lambda uid: "/run/mtgpu/tenants/20001.mnt")
    fence.tools["nsenter"] = "/usr/bin/nsenter"
    argv = fence.prefix(20001, 20001, [], "/home/ann")
    assert argv[6:10] == ["/usr/bin/nsenter", "--mount=/run/mtgpu/tenants/20001.mnt", "--wd=/home/ann", "--"]
    assert "--clear-groups" in argv


def test_session_keys_are_validated() -> None:
    o = load_text(
        "SESSION_MEMORY: 25%\nSESSION_PIDS: 512\nSESSION_CPU_WEIGHT: 200\n"
        "PRIVATE_TMP: false\nPRIVATE_TMP_SIZE: 1G\n"
    )
    assert (o.session_memory, o.session_pids, o.session_cpu_weight, o.private_tmp, o.private_tmp_size) == (
        "25%",
        512,
        200,
        False,
        1 << 30,
    )
    assert memory_limit(o.session_memory, 4 << 30) == 1 << 30
    assert load_text("SESSION_MEMORY: 8G\n").session_memory == 8 << 30
    assert load_text("SESSION_GPUS: free\n").session_gpus == "free"
    for bad, key in (
        ("SESSION_MEMORY: 150%", "SESSION_MEMORY"),
        ("SESSION_MEMORY: lots", "SESSION_MEMORY"),
        ("SESSION_PIDS: 0", "SESSION_PIDS"),
        ("SESSION_CPU_WEIGHT: 0", "SESSION_CPU_WEIGHT"),
        ("PRIVATE_TMP: maybe", "PRIVATE_TMP"),
        ("SESSION_GPUS: all", "SESSION_GPUS"),
    ):
        with pytest.raises(ConfigError) as exc:
            load_text(bad + "\n")
        assert key in str(exc.value)


def test_setup_status_says_how_sessions_are_fenced() -> None:
    lines = isolation_lines(Options())
    assert lines[0] == "isolation:" and "mtgpu.slice/tenant-UID" in lines[1]


@pytest.mark.parametrize(
    "argv, gpus, time, cpus, mem, command",
    [
        (["alloc", "--gpus", "rtx4090:1", "--time", "2h"], "rtx4090:1", "2h", None, None, []),
        (
            [
                "alloc",
                "--gres",
                "gpu:rtx4090:2",
                "-t",
                "30",
                "-c",
                "8",
                "--mem",
                "64G",
                "--",
                "nvidia-smi",
                "-L",
            ],
            "rtx4090:2",
            "30",
            "8",
            "64G",
            ["nvidia-smi", "-L"],
        ),
        (["alloc", "-G", "2", "--cpus-per-task", "4"], "2", "1h", "4", None, []),
    ],
)
def test_alloc_takes_salloc_shaped_options(argv, gpus, time, cpus, mem, command) -> None:
    from mtgpu.cli.job import alloc_args, build_parser

    a = alloc_args(build_parser().parse_args(argv))
    assert (a.gpus, a.time, a.cpus, a.mem, a.command) == (gpus, time, cpus, mem, command)


@pytest.mark.root
def test_a_namespace_that_hides_this_daemons_directories_is_not_adopted(tmp_path) -> None:
    # Another daemon's tenant namespace (daemons on one host share the session cgroup)
    # or one made before RUN_DIR moved: its private /tmp lacks this daemon's directories.
    own = tempfile.mkdtemp(prefix="mtgpu-fence-keep-", dir="/tmp")
    fence = TenantFence(
        CgroupSystem(), SessionLimits(), "/nonexistent", tmp_size=1 << 20, keep=[own, str(tmp_path), "/usr"]
    )
    other = subprocess.Popen(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs mtgpu-test /tmp && echo ready && exec sleep 60",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"ready\n"
        assert fence._keeps_ours(os.getpid())  # this namespace shows them
        assert not fence._keeps_ours(other.pid)
    finally:
        other.kill()
        other.wait()
        os.rmdir(own)


@pytest.mark.root
def test_a_daemon_adopts_only_a_namespace_it_made_itself(tmp_path) -> None:
    # Two daemons on one host: their tenant is in one session cgroup, so the second
    # daemon sees the first one's tenant namespace there. Adopting it put the second
    # daemon's jobs in the first one's /tmp and homes; it makes its own instead. The
    # first daemon, restarted without its binding, still finds its own again.
    from mtgpu_testing import run_share

    from mtgpu.schedd import cgroups

    uid = 54400 + run_share()[0]

    def fence(name: str) -> TenantFence:
        return TenantFence(
            cgroups.detect(), SessionLimits(), str(tmp_path / name / "tenants"), tmp_size=16 << 20
        )

    a, b = fence("a"), fence("b")
    if not (a.tools["unshare"] and a.tools["nsenter"] and a.tools["setpriv"]):
        pytest.fail("util-linux's unshare, nsenter and setpriv are needed")
    sleeper = None
    try:
        path_a = a.namespace(uid)
        assert path_a == f"{a.ns_dir}/{uid}.mnt"
        ns_a = os.stat(path_a).st_ino
        sleeper = subprocess.Popen([*a.prefix(uid, uid, [], "/"), "sleep", "60"])
        deadline = time.monotonic() + 30
        while not (
            Path(f"/proc/{sleeper.pid}/comm").read_text() == "sleep\n"
            and os.stat(f"/proc/{sleeper.pid}/ns/mnt").st_ino == ns_a
        ):
            assert time.monotonic() < deadline and sleeper.poll() is None, (
                "the tenant's process never started"
            )
            time.sleep(0.05)
        assert sleeper.pid in a._procs_now(uid) and sleeper.pid in b._procs_now(uid)

        path_b = b.namespace(uid)
        assert path_b == f"{b.ns_dir}/{uid}.mnt"
        assert os.stat(path_b).st_ino != ns_a  # its own, not the other daemon's

        subprocess.run(["umount", path_a], check=True)  # a restart that lost the binding
        restarted = fence("a")
        again = restarted.namespace(uid)
        assert again is not None and os.stat(again).st_ino == ns_a
        restarted.remove_namespace(uid)
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        a.remove(uid)
        b.remove_namespace(uid)
        for d in (a.ns_dir, b.ns_dir):
            subprocess.run(["umount", "-l", d], capture_output=True, check=False)
