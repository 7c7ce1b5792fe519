"""cgroup detection, GPU device rules, and real per-job cgroups on this kernel."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mtgpu.schedd import cgroups
from mtgpu.schedd.cgroups import CgroupSystem, JobCgroup, detect, device_deny_rules, gpu_majors, own_paths

SYSTEM = detect()


def test_detect_reads_writable_hierarchies(tmp_path: Path) -> None:
    for name in ("mem", "dev", "uni"):
        (tmp_path / name).mkdir()
    (tmp_path / "uni" / "cgroup.controllers").write_text("cpu memory pids\n")
    mounts = "\n".join(
        [
            f"cgroup {tmp_path}/mem cgroup rw,relatime,memory 0 0",
            f"cgroup {tmp_path}/dev cgroup rw,relatime,devices 0 0",
            f"cgroup {tmp_path}/nope cgroup rw,relatime,pids 0 0",  # not there: skipped
            f"cgroup {tmp_path}/mem cgroup rw,relatime,cpu,cpuacct 0 0",  # cpu: for sessions only
            f"cgroup2 {tmp_path}/uni cgroup2 rw,relatime 0 0",
            "proc /proc proc rw 0 0",
        ]
    )
    s = detect(mounts)
    assert dict(s.v1) == {"memory": f"{tmp_path}/mem", "devices": f"{tmp_path}/dev", "cpu": f"{tmp_path}/mem"}
    assert s.v2 == f"{tmp_path}/uni" and s.v2_controllers == {"cpu", "memory", "pids"}
    assert s.version == "v1"
    assert CgroupSystem(v2="/x").version == "v2" and CgroupSystem().version == "none"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/", {"": "/"}),
        (
            "12:pids:/a\n4:memory:/b/c\n1:name=systemd:/d\n0::/e",
            {"pids": "/a", "memory": "/b/c", "name=systemd": "/d", "": "/e"},
        ),
        ("3:cpu,cpuacct:/x", {"cpu": "/x", "cpuacct": "/x"}),
    ],
)
def test_own_paths(text: str, expected: dict) -> None:
    assert own_paths(text) == expected


def test_parents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "own_paths", lambda: {"memory": "/svc/x", "pids": "/", "": "/u"})
    s = CgroupSystem({"memory": "/cg/memory", "pids": "/cg/pids"}, "/cg/unified")
    assert cgroups.parents(s) == {"memory": "/cg/memory/svc/x", "pids": "/cg/pids"}
    assert cgroups.parents(s, "/mtgpu") == {"memory": "/cg/memory/mtgpu", "pids": "/cg/pids/mtgpu"}
    assert cgroups.parents(s, version="v2") == {"v2": "/cg/unified/mtgpu.jobs"}
    assert cgroups.parents(CgroupSystem()) == {}


PROC_DEVICES = """Character devices:
  1 mem
136 pts
195 nvidia-frontend
226 drm
234 kfd
237 nvidia-uvm
238 nvidia-caps
240 nvidia-nvswitch

Block devices:
236 nvidia-uvm
"""


@pytest.mark.parametrize(
    ("text", "majors"),
    [
        (PROC_DEVICES, {195, 226, 234, 237, 238, 240}),  # not the block 236
        ("Character devices:\n  1 mem\n", {195, 226}),  # the fixed ones are always counted
        ("", {195, 226}),
    ],
)
def test_gpu_majors(text: str, majors: set[int]) -> None:
    assert gpu_majors(text) == majors


@pytest.mark.parametrize(
    ("allowed", "majors", "expected"),
    [
        ([], [195, 226], ["c 195:* rwm", "c 226:* rwm"]),
        (
            [(195, 0), (195, 255), (237, 0), (237, 1)],
            [195, 237],
            [f"c 195:{m} rwm" for m in range(1, 255)] + [f"c 237:{m} rwm" for m in range(2, 256)],
        ),
        ([(500, 3)], [], [f"c 500:{m} rwm" for m in range(256) if m != 3]),  # allowed majors count too
        ([(195, 300)], [195], [f"c 195:{m} rwm" for m in range(300)]),  # large minors are covered
    ],
)
def test_device_deny_rules(allowed: list, majors: list, expected: list[str]) -> None:
    assert device_deny_rules(allowed, majors) == expected


# --------------------------------------------------------------------- on this kernel

needs_devices = pytest.mark.skipif(
    os.geteuid() != 0 or "devices" not in SYSTEM.v1, reason="needs root and the v1 devices controller"
)


@pytest.fixture
def standins() -> Iterator[Path]:
    """Character devices with NVIDIA's major and no driver behind them."""
    d = Path(tempfile.mkdtemp(prefix="mtgpu-dev-", dir="/tmp"))
    for minor in (0, 1, 2):
        os.mknod(d / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def _open_in(cg_dir: str, paths: list[Path]) -> list[str]:
    """errno names of opening ``paths`` from a process inside the devices cgroup ``cg_dir``."""
    code = (
        "import errno, os, sys\n"
        "open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
        "for p in sys.argv[2:]:\n"
        "    try:\n        os.open(p, os.O_RDWR); print('OK')\n"
        "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
    )
    r = subprocess.run(
        ["/usr/bin/python3", "-c", code, cg_dir, *map(str, paths)], capture_output=True, text=True, check=True
    )
    return r.stdout.split()


@pytest.mark.root
@needs_devices
def test_v1_devices_semantics_as_documented(standins: Path) -> None:
    path = f"{SYSTEM.v1['devices']}/mtgpu_test_{os.getpid()}"
    os.mkdir(path)
    try:
        nodes = [standins / "nvidia0", standins / "nvidia1"]
        # No driver: an allowed open is refused by the (missing) driver, not the cgroup.
        assert _open_in(path, nodes) == ["ENXIO", "ENXIO"]
        cgroups._write(f"{path}/devices.deny", "c 195:1 rwm")
        assert _open_in(path, nodes) == ["ENXIO", "EPERM"]
        assert Path(f"{path}/devices.list").read_text() == "a *:* rwm\n"  # exceptions are not shown
        cgroups._write(f"{path}/devices.deny", "c 195:* rwm")
        cgroups._write(f"{path}/devices.allow", "c 195:0 rwm")  # accepted, but changes nothing
        assert _open_in(path, nodes) == ["EPERM", "EPERM"]
        cgroups._write(f"{path}/devices.allow", "c 195:* rwm")  # only an exact match is removed
        assert _open_in(path, nodes) == ["ENXIO", "EPERM"]
    finally:
        os.rmdir(path)


@pytest.mark.root
@needs_devices
def test_job_cgroup_v1_lifecycle(standins: Path) -> None:
    parents = cgroups.parents(SYSTEM)
    name = f"mtgpu_job_test{os.getpid()}"
    allowed = [(195, 2)]
    cg, applied = JobCgroup.create(
        parents, name, ram=256 << 20, cpus=[0], pids_max=100, deny=device_deny_rules(allowed, [195])
    )
    try:
        assert set(cg.dirs) == set(parents) and cg.version == "v1"
        assert all(not v.startswith("unavailable") for v in applied.values()), applied
        if "memory" in cg.dirs:
            assert Path(cg.dirs["memory"], "memory.limit_in_bytes").read_text().strip() == str(256 << 20)
            assert cg.oom_kills() == 0
        if "pids" in cg.dirs:
            assert Path(cg.dirs["pids"], "pids.max").read_text().strip() == "100"
        nodes = [standins / "nvidia1", standins / "nvidia2"]
        assert _open_in(cg.dirs["devices"], nodes) == ["EPERM", "ENXIO"]
        procs = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
        for p in procs:
            cg.attach(p.pid)
        assert cg.procs() == {p.pid for p in procs}
        assert cg.signal_all(signal.SIGTERM) == 3
        assert [p.wait(5) for p in procs] == [-signal.SIGTERM] * 3
        assert cg.procs() == set()
    finally:
        for pid in cg.procs():
            os.kill(pid, signal.SIGKILL)
        cg.remove()
    assert not any(os.path.exists(d) for d in cg.dirs.values())


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM.v2 is None, reason="needs root and a cgroup v2 mount")
def test_job_cgroup_v2_tracks_and_kills() -> None:
    root = f"/mtgpu-test-{os.getpid()}"
    parents = cgroups.parents(SYSTEM, root, version="v2")
    cg, applied = JobCgroup.create(parents, "job1", ram=None, cpus=[], pids_max=None, deny=[])
    try:
        assert cg.version == "v2" and applied["devices"].startswith("cgroup v2 (BPF device program")
        procs = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
        for p in procs:
            cg.attach(p.pid)
        assert cg.procs() == {p.pid for p in procs}
        assert cg.signal_all(signal.SIGTERM) == 2  # through cgroup.freeze
        assert [p.wait(5) for p in procs] == [-signal.SIGTERM] * 2
        more = subprocess.Popen(["sleep", "300"])
        cg.attach(more.pid)
        cg.signal_all(signal.SIGKILL)  # through cgroup.kill
        assert more.wait(5) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while cg.procs() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cg.procs() == set()
    finally:
        cg.remove()
        try:
            os.rmdir(parents["v2"])
        except OSError as exc:
            assert exc.errno in (errno.ENOENT, errno.EBUSY)
    assert not os.path.exists(cg.dirs["v2"])
