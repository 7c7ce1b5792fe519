"""The VRAM watchdog's decisions (a pure function, tables of cases) and how it finds
each process's job (cgroup, then ancestry), with made-up /proc trees."""

from __future__ import annotations

import pytest

from mtgpu.gpuinfo.types import GpuInfo, GpuProcess
from mtgpu.schedd.vramwatch import (
    JobProcesses,
    JobShare,
    VramWatch,
    ancestry_job,
    cgroup_job,
    job_use,
    judge,
)

G = 1 << 30


def card(index=0, total=24 * G, used=0, procs=()):
    return GpuInfo(
        index=index,
        brand="nvidia",
        type="rtx4090",
        name="x",
        uuid=f"GPU-{index}",
        vram_total=total,
        vram_used=used,
        util=0,
        processes=tuple(procs),
    )


def share(jid, mode="shared", vram=8 * G, gpus=(0,)):
    return JobShare(jid, 0, mode, vram, gpus)


def test_shared_job_over_its_vram_is_stopped_and_its_neighbour_is_not():
    stops = judge(
        {0: card(used=20 * G)},
        {("a", 0): int(12.5 * G), ("b", 0): 7 * G},
        [share("a"), share("b")],
        tolerance=5,
    )
    assert [(s.job_id, s.gpu, s.used, s.vram) for s in stops] == [("a", 0, int(12.5 * G), 8 * G)]
    assert stops[0].reason == "used 12.5G of GPU 0's memory, over its vram=8G"


@pytest.mark.parametrize(
    "used, stopped",
    [
        (8 * G, False),  # exactly its share
        (int(8 * G * 1.05), False),  # within the tolerance
        (int(8 * G * 1.05) + 1, True),  # one byte past it
    ],
)
def test_tolerance(used, stopped):
    stops = judge({0: card()}, {("a", 0): used}, [share("a")], tolerance=5)
    assert bool(stops) is stopped


def test_exclusive_jobs_have_no_limit():
    assert judge({0: card(used=24 * G)}, {("a", 0): 24 * G}, [share("a", "exclusive", 0)], 5) == []


def test_a_job_already_stopping_is_not_asked_again():
    assert judge({0: card()}, {("a", 0): 20 * G}, [share("a")], 5, stopping={"a"}) == []


def test_the_gpu_named_is_the_one_most_over():
    stops = judge({0: card(0), 1: card(1)}, {("a", 0): 9 * G, ("a", 1): 15 * G}, [share("a", gpus=(0, 1))], 5)
    assert [(s.gpu, s.used) for s in stops] == [(1, 15 * G)]


def test_overcommit_not_stopped_while_the_card_has_room():
    assert judge({0: card(used=16 * G)}, {("a", 0): 16 * G}, [share("a", "overcommit", 4 * G)], 5) == []


def test_overcommit_full_card_stops_largest_excess_first_until_it_has_room():
    jobs = [
        share("small", "overcommit", 4 * G),
        share("big", "overcommit", 2 * G),
        share("within", "overcommit", 8 * G),
        share("mid", "overcommit", 1 * G),
    ]
    use = {("small", 0): 6 * G, ("big", 0): 10 * G, ("within", 0): 5 * G, ("mid", 0): 3 * G}
    stops = judge({0: card(used=24 * G)}, use, jobs, 5)
    # big is 8G over; stopping it frees 10G, and 14G of 24G is under full (22.8G).
    assert [s.job_id for s in stops] == ["big"]
    assert stops[0].reason == "used 10G of GPU 0's memory, over its vram=2G, while GPU 0 was full"
    # With big already stopping and the card still full, the next largest excess goes.
    use2 = {**use, ("small", 0): 15 * G}
    stops = judge(
        {0: card(used=24 * G)},
        {k: v for k, v in use2.items() if k[0] != "big"},
        [j for j in jobs if j.job_id != "big"],
        5,
    )
    assert [s.job_id for s in stops] == ["small"]


def test_overcommit_jobs_within_their_vram_are_never_stopped_even_on_a_full_card():
    jobs = [share("a", "overcommit", 12 * G), share("b", "overcommit", 12 * G)]
    assert judge({0: card(used=24 * G)}, {("a", 0): 12 * G, ("b", 0): 12 * G}, jobs, 5) == []


def _proc_tree(tmp_path, entries):
    """entries: pid -> (ppid, cgroup path)."""
    root = tmp_path / "proc"
    for pid, (ppid, cg) in entries.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (sh) S {ppid} {pid} {pid} 0 -1\n")
        (d / "cgroup").write_text(f"12:memory:{cg}\n11:devices:{cg}\n0::/\n")
    return str(root)


def test_process_to_job_by_cgroup_and_by_ancestry(tmp_path):
    root = _proc_tree(
        tmp_path,
        {
            100: (1, "/mtgpu.slice/mtgpu_job_7_abc"),  # the job's own cgroup
            101: (1, "/mtgpu.slice/mtgpu_job_7_abc/inner"),  # a child cgroup of it
            200: (1, "/"),  # an admin's process
            300: (1, "/"),
            301: (300, "/"),
            302: (301, "/"),  # no cgroup: supervisor 300's
        },
    )
    names = {"mtgpu_job_7_abc": "7"}
    assert cgroup_job(100, names, root) == "7" and cgroup_job(101, names, root) == "7"
    assert cgroup_job(200, names, root) is None and cgroup_job(999, names, root) is None
    assert ancestry_job(302, {300: "9"}, root) == "9" and ancestry_job(200, {300: "9"}, root) is None
    jp = JobProcesses(names, {300: "9"}, root)
    gpus = [
        card(
            0,
            procs=[
                GpuProcess(100, 0, 3 * G),
                GpuProcess(101, 0, 1 * G),
                GpuProcess(200, 0, 2 * G),
                GpuProcess(302, 0, 5 * G),
            ],
        )
    ]
    use, outside = job_use(gpus, jp.job_of)
    assert use == {("7", 0): 4 * G, ("9", 0): 5 * G}
    assert outside == {0: 2 * G}


def test_watch_stops_each_attempt_once_and_forgets_ended_jobs(tmp_path):
    root = _proc_tree(tmp_path, {100: (1, "/mtgpu_job_7_abc")})
    stopped = []
    shares = [share("7")]
    w = VramWatch(
        lambda: {"GPU-0": card(procs=[GpuProcess(100, 0, 20 * G)])},
        lambda: shares,
        lambda: JobProcesses({"mtgpu_job_7_abc": "7"}, {}, root),
        stopped.append,
    )
    assert [s.job_id for s in w.check()] == ["7"]
    assert w.check() == [] and len(stopped) == 1  # asked once


@pytest.mark.root
def test_the_stop_notice_is_written_with_the_tenants_rights_only(tmp_path):
    """A job that points its standard error at a file it may only read (root's) gets
    nothing written there; its own file gets the line."""
    import os
    import subprocess

    from mtgpu.schedd.jobenv import JobUser
    from mtgpu.schedd.supervisor import tell_job

    nobody = JobUser("nobody", 65534, 65534, "/nonexistent")
    roots = tmp_path / "roots"
    roots.write_text("root's\n")
    os.chmod(roots, 0o644)
    own = tmp_path / "own"
    own.write_text("")
    os.chown(own, 65534, 65534)
    for target, mode, expect in ((roots, os.O_RDONLY, False), (own, os.O_WRONLY, True)):
        fd = os.open(target, mode)
        p = subprocess.Popen(["sleep", "30"], stderr=fd, user=65534, group=65534, extra_groups=[])
        os.close(fd)
        try:
            assert tell_job(p.pid, nobody, "mtgpu: stopped\n") is expect
        finally:
            p.kill()
            p.wait()
    assert roots.read_text() == "root's\n"
    assert own.read_text() == "mtgpu: stopped\n"


def test_doctests():
    import doctest

    import mtgpu.schedd.jobenv
    import mtgpu.schedd.vramwatch

    for module in (mtgpu.schedd.vramwatch, mtgpu.schedd.jobenv):
        failed, tried = doctest.testmod(module)
        assert failed == 0 and tried > 0
