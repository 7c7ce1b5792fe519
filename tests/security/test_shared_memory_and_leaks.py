"""A hostile tenant against what tenants share: the host's memory, the list of GPU
jobs, and the disk the retention archive is written to.

- Sessions draw on one pool (``SESSIONS_MEMORY`` on ``mtgpu.slice``) that the
  scheduler never offers to jobs, so a tenant's sessions cannot push the host into
  its global OOM killer (which kills the largest process: another tenant's job).
- ``nodes`` names another tenant's job as "another tenant's job", as pending
  reasons do.
- A home of sparse giants (``truncate -s 15T``) is archived as what it holds on
  disk, and an archive that would not fit the archive directory's free space is
  refused before a byte is written.

Real daemons and real OpenSSH tenants; the retention clock is moved through
MTGPU_CLOCK_OFFSET_FILE.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import psutil
import pytest
from figures import tally
from mtgpu_testing import Host, wait_for
from retention_testing import clock_host, clock_mover
from security_testing import api_socket, call

from mtgpu.schedd import cgroups, fence

pytestmark = pytest.mark.root

SYSTEM = cgroups.detect()
POOL = 1 << 30
EACH = 4 << 30

needs_memory = pytest.mark.skipif(
    "memory" not in SYSTEM.v1 and "memory" not in SYSTEM.v2_controllers,
    reason="this kernel has no memory cgroup controller",
)


@pytest.fixture(scope="module")
def host():
    h = Host(
        {
            "SESSION_MEMORY": EACH,
            "SESSIONS_MEMORY": POOL,
            "PRIVATE_TMP_SIZE": "64M",
            "SIMULATED_CPUS": 4,
            "SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}],
        }
    )
    h.start()
    # Test daemons started from one cgroup share its mtgpu.slice (a host has one daemon):
    # this one gets a memory cgroup of its own, so its pool is its alone.
    own = None
    if "memory" in SYSTEM.v1:
        own = Path(SYSTEM.v1["memory"] + cgroups.own_paths()["memory"], f"mtgpu-test-pool-{os.getpid()}")
        own.mkdir()
        (own / "cgroup.procs").write_text(f"{h._server_pid()}\n")
    try:
        h.keys_of = {n: h.add_user(n) for n in ("alice", "mallory")}
        for n, k in h.keys_of.items():
            r = h.ssh(n, k, "true")
            assert r.returncode == 0, r.stderr
        yield h
    finally:
        h.cleanup()
        if own is not None:
            for d in sorted((p for p in own.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [own]:
                with contextlib.suppress(OSError):
                    d.rmdir()


def _slice_dirs(h: Host, uid: int) -> dict[str, str]:
    """The session cgroups of ``uid`` as the daemon of ``h`` makes them (its own cgroup)."""
    return fence.session_dirs(
        SYSTEM, uid, cgroups.own_paths(Path(f"/proc/{h._server_pid()}/cgroup").read_text())
    )


def uid_of(h: Host, user: str) -> int:
    return int(h.passwd(user)[2])


def _job(h: Host, uid: int, jid: str) -> dict:
    with api_socket(h.run_dir, uid) as s:
        return call(s, "job.show", {"job_id": jid})["result"]


# ---------------------------------------------------------------- memory


@needs_memory
def test_sessions_share_one_memory_pool_that_jobs_are_not_offered(host: Host) -> None:
    uid = uid_of(host, "mallory")
    dirs = _slice_dirs(host, uid)
    if "memory" in dirs:
        slice_limit = Path(dirs["memory"]).parent / "memory.limit_in_bytes"
        tenant_limit = Path(dirs["memory"], "memory.limit_in_bytes")
    else:
        slice_limit = Path(dirs["v2"]).parent / "memory.max"
        tenant_limit = Path(dirs["v2"], "memory.max")
    # The pool is set on mtgpu.slice, and one tenant's SESSION_MEMORY is capped at it.
    assert int(slice_limit.read_text()) == POOL
    assert int(tenant_limit.read_text()) == POOL
    # Mallory's sessions, allowed 4G alone, cannot take more than the pool: the kernel
    # ends the hog inside the slice, not some job on the host.
    hog = "python3 -c \"b = b'x' * (1536 << 20); print('survived')\""
    r = host.ssh("mallory", host.keys_of["mallory"], hog)
    assert b"survived" not in r.stdout and r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    tally("attacks_refused")
    # Jobs are offered the host's RAM less the pool (reserved job RAM + pool <= RAM).
    nodes = host.api("nodes")["result"]
    me = next(n for n in nodes if n["name"] == host.config["SERVER_NAME"])
    assert me["ram_total"] == psutil.virtual_memory().total - POOL, me
    # And a job asking for all of the host's RAM does not fit any more.
    with api_socket(host.run_dir, uid) as s:
        a = call(
            s,
            "job.submit",
            {"script": f"#!/bin/sh\n#MTGPU cpus=1 ram={(me['ram_total'] >> 20) + 64}M\ntrue\n"},
        )
    if a["ok"]:
        jid = a["result"]["job_id"]
        try:
            job = wait_for(
                lambda: (j := _job(host, uid, jid)) and j.get("reason") not in (None, "None") and j, 30
            )
            assert job["state"] == "PENDING", job
        finally:
            with api_socket(host.run_dir, uid) as s:
                call(s, "job.cancel", {"job_ids": [jid]})
    else:
        assert "RAM" in str(a["error"]), a


# ---------------------------------------------------------------- nodes


def test_nodes_names_another_tenants_gpu_job_only_as_another_tenants_job(host: Host) -> None:
    alice, mallory = uid_of(host, "alice"), uid_of(host, "mallory")
    with api_socket(host.run_dir, alice) as s:
        a = call(s, "job.submit", {"script": "#!/bin/sh\n#MTGPU gpus=1 cpus=1 ram=64M\nsleep 300\n"})
    assert a["ok"], a
    jid = a["result"]["job_id"]
    try:
        wait_for(lambda: _job(host, alice, jid)["state"] == "RUNNING", 60, "alice's GPU job to run")
        with api_socket(host.run_dir, mallory) as s:
            seen = call(s, "nodes")["result"]
        held = [j for n in seen for g in n.get("gpus", []) for j in g["jobs"]]
        assert held == ["another tenant's job"], seen
        tally("attacks_refused")
        # Its owner and the admins see the id.
        with api_socket(host.run_dir, alice) as s:
            own = call(s, "nodes")["result"]
        assert [j for n in own for g in n.get("gpus", []) for j in g["jobs"]] == [jid]
        every = host.api("nodes")["result"]
        assert [j for n in every for g in n.get("gpus", []) for j in g["jobs"]] == [jid]
    finally:
        with api_socket(host.run_dir, alice) as s:
            call(s, "job.cancel", {"job_ids": [jid]})


# ---------------------------------------------------------------- cgroups


def _job_cgroups(jid: str) -> list[Path]:
    """Every directory of job ``jid``'s cgroups, in every hierarchy (found as root)."""
    tops = [SYSTEM.v1[c] for c in ("pids", "memory", "cpu") if c in SYSTEM.v1]
    tops += [SYSTEM.v2] if SYSTEM.v2 and not SYSTEM.v1 else []
    return [p for t in tops for p in Path(t).rglob(f"{cgroups.JOB_PREFIX}{jid}_*") if p.is_dir()]


def test_a_tenant_cannot_look_into_another_tenants_cgroups(host: Host) -> None:
    """``cgroup.procs`` lists the PIDs that hidepid hides, and the tree names every job:
    mallory, from her own session, can neither list mtgpu.slice nor read alice's
    session or job cgroups; alice still reads her own."""
    alice = uid_of(host, "alice")
    with api_socket(host.run_dir, alice) as s:
        a = call(s, "job.submit", {"script": "#!/bin/sh\n#MTGPU cpus=1 ram=64M\nsleep 300\n"})
    assert a["ok"], a
    jid = a["result"]["job_id"]
    try:
        wait_for(lambda: _job(host, alice, jid)["state"] == "RUNNING", 60, "alice's job to run")
        session = list(_slice_dirs(host, alice).values())
        jobs = _job_cgroups(jid)
        assert session and jobs, (session, jobs)
        slices = sorted({os.path.dirname(d) for d in session})
        for d in session + [str(j) for j in jobs]:
            st = os.stat(d)
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, alice, 0o750), d
        probes = [f"ls {d}" for d in slices] + [
            f"cat {d}/cgroup.procs" for d in session + [str(j) for j in jobs]
        ]
        script = "; ".join(f"if {p} >/dev/null 2>&1; then echo 'READ {p}'; fi" for p in probes)
        r = host.ssh("mallory", host.keys_of["mallory"], script + "; echo done")
        assert r.returncode == 0 and r.stdout.decode().split() == ["done"], (r.stdout, r.stderr)
        tally("attacks_refused", len(probes))
        # The owner reads her own: her session's and her job's processes.
        own = "; ".join(f"cat {d}/cgroup.procs >/dev/null" for d in session) + f"; cat {jobs[0]}/cgroup.procs"
        r = host.ssh("alice", host.keys_of["alice"], own)
        assert r.returncode == 0 and r.stdout.split(), (r.stdout, r.stderr)
    finally:
        with api_socket(host.run_dir, alice) as s:
            call(s, "job.cancel", {"job_ids": [jid]})


# ---------------------------------------------------------------- retention

RETENTION = {
    "TENANT_RETENTION_DAYS": 30,
    "TENANT_RETENTION_GRACE": "7d",
    "TENANT_RETENTION_HOME": "archive",
    "SIMULATED_CPUS": 4,
}


@pytest.fixture(scope="module")
def rhost():
    yield from clock_host(RETENTION)


@pytest.fixture
def clock(rhost):
    yield from clock_mover(rhost)


def retention(h: Host) -> dict:
    return {s["user"]: s for s in json.loads(h.admin("retention", "--json").stdout)["steps"]}


def keep_others_active(h: Host, *mine: str) -> None:
    for u in json.loads(h.admin("user", "list", "--json").stdout):
        if u["name"] not in mine:
            h.admin("retention", "--unlock", u["name"])


def lock_then_due(h: Host, clock, name: str, start: float) -> None:
    uid = int(h.passwd(name)[2])
    wait_for(
        lambda: (
            not [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        ),
        what=f"{name}'s logins to end",
    )
    clock(start + 31)
    keep_others_active(h, name)
    assert retention(h)[name]["done"] == "locked"
    clock(start + 39)
    keep_others_active(h, name)


def archives(h: Host, name: str) -> list[Path]:
    return sorted((h.state_dir / "retired-homes").glob(f"{name}-*"))


def test_a_home_of_sparse_giants_is_archived_as_what_it_holds(rhost: Host, clock) -> None:
    """Four 15 TiB files of a few KiB on disk: without the sparse format the archive
    would read 60 TiB of zeros into STATE_DIR."""
    key = rhost.add_user("sparse")
    r = rhost.ssh(
        "sparse",
        key,
        "truncate -s 15T ~/g1 ~/g2 ~/g3 ~/g4 && printf kept | dd of=$HOME/g1 bs=1 seek=1099511627776 "
        "conv=notrunc 2>/dev/null && echo plain > ~/plain && echo ok",
    )
    assert r.stdout.strip() == b"ok", r.stderr
    lock_then_due(rhost, clock, "sparse", 0)
    s = retention(rhost)["sparse"]
    assert s["done"] == "removed", s
    [archive] = archives(rhost, "sparse")
    assert archive.stat().st_size < 1 << 20, archive.stat()
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar}
        for n in ("g1", "g2", "g3", "g4"):
            assert members[f"sparse/{n}"].size == 15 << 40
        f = tar.extractfile("sparse/g1")
        f.seek(1 << 40)
        assert f.read(4) == b"kept"
        assert tar.extractfile("sparse/plain").read() == b"plain\n"
    tally("attacks_refused")


def test_an_archive_that_would_not_fit_is_refused_before_a_byte_is_written(rhost: Host, clock) -> None:
    key = rhost.add_user("filler")
    r = rhost.ssh("filler", key, "head -c 16M /dev/urandom > ~/noise && echo ok")
    assert r.stdout.strip() == b"ok", r.stderr
    home = rhost.homes / "filler"
    dest = rhost.state_dir / "retired-homes"
    dest.mkdir(mode=0o700, exist_ok=True)
    name = f"mtgpu-small-{uuid.uuid4().hex[:6]}"
    m = rhost.in_ns(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", name, str(dest)])
    assert m.returncode == 0, m.stderr
    try:
        lock_then_due(rhost, clock, "filler", 100)
        done = retention(rhost)["filler"]["done"]
        assert done.startswith("failed") and "free" in done and str(dest) in done, done
        # Nothing written, nothing removed: the home and the account stay for a later pass.
        assert rhost.in_ns(["ls", "-A", str(dest)]).stdout == ""
        assert (home / "noise").stat().st_size == 16 << 20
        assert rhost.passwd("filler") is not None
        log = [json.loads(x) for x in (rhost.state_dir / "retention.log").read_text().splitlines()]
        assert any(e["user"] == "filler" and e["action"] == "remove failed" for e in log)
        tally("attacks_refused")
    finally:
        rhost.in_ns(["umount", str(dest)])
    # With room again, the next pass (after its back-off) archives and removes it.
    clock(139 + 2 / 24)
    keep_others_active(rhost, "filler")
    s = retention(rhost)["filler"]
    assert s["done"] == "removed", s
    assert not home.exists() and len(archives(rhost, "filler")) == 1
    os.sync()


def test_archive_sizes_count_what_is_on_disk(tmp_path: Path) -> None:
    """The estimate the free-space check uses: bytes on disk, not apparent sizes."""
    from mtgpu.accounts import homeremove

    home = tmp_path / "t"
    home.mkdir()
    subprocess.run(["truncate", "-s", "15T", str(home / "giant")], check=True)
    (home / "small").write_bytes(b"x" * 10000)
    os.chown(home, 4242, 4242)
    with homeremove.Home(str(tmp_path), "t", 4242) as h:
        assert h.disk_usage() < 1 << 20
