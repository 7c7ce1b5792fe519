"""The cgroup v2 GPU wall: the BPF device program, loaded by this kernel and run by it
at real ``open()`` calls of device nodes made with ``mknod``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu.schedd import bpfdev, cgroups

pytestmark = pytest.mark.root

PROBE = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print("ok")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""


def _v2_root() -> str:
    system = cgroups.detect()
    if not system.v2:
        pytest.skip("no cgroup v2 hierarchy mounted")  # every supported host has one
    return system.v2


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, str]:
    made = {}
    for name, (major, minor) in {"nv0": (195, 0), "nv1": (195, 1), "drm0": (226, 0), "null": (1, 3)}.items():
        path = tmp_path / name
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        made[name] = str(path)
    return made


def _open_in(cgroup: str | None, paths: list[str]) -> list[str]:
    def enter() -> None:
        if cgroup is not None:
            Path(cgroup, "cgroup.procs").write_text(f"{os.getpid()}\n")

    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, *paths],
        capture_output=True,
        text=True,
        preexec_fn=enter,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_walled_cgroup_opens_only_the_gpu_it_holds(nodes: dict[str, str]) -> None:
    root = _v2_root()
    cg = f"{root}/mtgpu-test-bpf-{os.getpid()}"
    os.mkdir(cg)
    try:
        bpfdev.attach(cg, allowed=[(195, 1)], majors=[195, 226])
        order = [nodes["nv0"], nodes["nv1"], nodes["drm0"], nodes["null"]]
        inside = _open_in(cg, order)
        # Refused before any driver is asked; the held GPU and /dev/null reach theirs
        # (no NVIDIA driver here: ENXIO or ENODEV, never EPERM).
        assert inside[0] == "EPERM" and inside[2] == "EPERM", inside
        assert inside[1] in ("ENXIO", "ENODEV", "ok"), inside
        assert inside[3] == "ok", inside
        # Outside the cgroup nothing changed.
        outside = _open_in(None, order)
        assert "EPERM" not in outside, outside
    finally:
        os.rmdir(cg)


def test_a_session_wall_holds_no_gpu_and_a_child_cgroup_cannot_undo_it(nodes: dict[str, str]) -> None:
    """A program on a parent holds for its children, whatever they attach."""
    root = _v2_root()
    cg = f"{root}/mtgpu-test-bpf-{os.getpid()}"
    child = f"{cg}/inner"
    os.mkdir(cg)
    os.mkdir(child)
    try:
        bpfdev.attach(cg, allowed=[], majors=[195, 226])
        bpfdev.attach(child, allowed=[(195, 0), (195, 1)], majors=[])
        assert _open_in(child, [nodes["nv0"], nodes["nv1"], nodes["null"]]) == ["EPERM", "EPERM", "ok"]
    finally:
        os.rmdir(child)
        os.rmdir(cg)


def test_the_program_refuses_and_allows_as_assembled() -> None:
    prog = bpfdev.assemble([(195, 3)], [195, 226, 195])
    assert len(prog) % 8 == 0
    # 5 header instructions, 3 per allowed device, 1 per major (deduplicated), 4 to end.
    assert len(prog) // 8 == 5 + 3 + 2 + 4
    fd = bpfdev.load(prog)  # the kernel's verifier accepts it
    os.close(fd)


def test_a_job_cgroup_on_v2_is_walled_before_the_job_enters(nodes: dict[str, str]) -> None:
    parent = f"{_v2_root()}/mtgpu-test-bpfjobs-{os.getpid()}"
    cg, applied = cgroups.JobCgroup.create(
        {"v2": parent},
        "mtgpu_job_1_x",
        ram=None,
        cpus=[],
        pids_max=None,
        deny=[],
        gpus=([(195, 1)], {195, 226}),
    )
    try:
        assert applied["devices"].startswith("cgroup v2 (BPF device program"), applied
        assert _open_in(cg.dirs["v2"], [nodes["nv0"], nodes["drm0"], nodes["null"]]) == [
            "EPERM",
            "EPERM",
            "ok",
        ]
        assert bpfdev.unavailable() is None
    finally:
        cg.remove()
        os.rmdir(parent)
