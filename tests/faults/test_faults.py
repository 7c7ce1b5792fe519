"""Faults injected into a real mtgpu-server; each asserts that nothing acknowledged
is lost.

Covered elsewhere, and counted in docs/SECURITY.md:
- the scheduler of a three-member cluster killed during submissions, and a
  partitioned old leader that must not start jobs (tests/cluster/test_cluster.py);
- a whole cluster restarted at once (the same file).
"""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from figures import tally
from mtgpu_testing import Host
from security_testing import api_socket, call

pytestmark = pytest.mark.root

SHORT = "#!/bin/sh\n#MTGPU cpus=1\ntrue\n"
# Takes both CPUs: the first runs, the ones after it wait. Each test cancels its own.
HOLD = "#!/bin/sh\n#MTGPU cpus=2\nsleep 600\n"


def _user(h: Host, name: str) -> int:
    key = h.add_user(name)
    assert h.ssh(name, key, "true").returncode == 0
    return int(h.passwd(name)[2])


def _ids(h: Host) -> set[str]:
    with api_socket(h.run_dir, 0) as s:
        a = call(s, "job.list", {"all": True})
    assert a["ok"], a
    return {j["job_id"] for j in a["result"]}


def _wait_state(h: Host, uid: int, jid: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        try:
            with api_socket(h.run_dir, uid) as s:
                v = call(s, "job.show", {"job_id": jid})["result"]
            if v["state"] in states:
                return v
        except OSError:
            pass
        assert time.time() < deadline, f"job {jid} did not reach {states}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def host():
    """One host for the faults that restart it (SIMULATED_CPUS 2, limits off)."""
    h = Host({"SIMULATED_CPUS": 2, "USER_SUBMIT_RATE": None, "USER_MAX_QUEUED_JOBS": None})
    h.start()
    h.uid = _user(h, "fay")
    yield h
    h.stop(signal.SIGKILL)  # its jobs were cancelled; a kill -9 is what it is tested for
    h.cleanup()


def test_kill_9_during_submissions_loses_no_acknowledged_job(host):
    h = host
    acked: dict[str, str] = {}  # token -> job id
    sent: list[str] = []
    stop = threading.Event()

    def submit() -> None:
        while not stop.is_set():
            try:
                with api_socket(h.run_dir, h.uid) as s:
                    while not stop.is_set():
                        token = uuid.uuid4().hex
                        sent.append(token)
                        a = call(s, "job.submit", {"script": HOLD, "token": token})
                        if a.get("ok"):
                            acked[token] = a["result"]["job_id"]
            except (OSError, AssertionError, ValueError):
                time.sleep(0.05)  # the daemon is down: retry until stopped

    t = threading.Thread(target=submit)
    t.start()
    try:
        deadline = time.time() + 30
        while len(acked) < 30:
            assert time.time() < deadline
            time.sleep(0.01)
        h.stop(signal.SIGKILL)
        before_restart = dict(acked)
        h.start()
        deadline = time.time() + 30
        while len(acked) < len(before_restart) + 10:  # submissions resumed
            assert time.time() < deadline
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
    seen = _ids(h)
    assert set(acked.values()) <= seen, f"lost: {set(acked.values()) - seen}"
    # A token sent before the kill and retried now is answered with its first id.
    with api_socket(h.run_dir, h.uid) as s:
        for token in list(before_restart)[-5:]:
            a = call(s, "job.submit", {"script": HOLD, "token": token})
            assert a["result"]["job_id"] == before_restart[token] and a["result"]["duplicate"]
        call(s, "job.cancel", {"job_ids": sorted(seen)})
    tally("faults_survived")
    tally("acked_jobs_checked", len(acked))


def test_kill_9_during_a_running_job_keeps_the_job_and_its_result(host):
    h = host
    # Under TENANT_HOME_ROOT: each tenant has a /tmp of its own (PRIVATE_TMP).
    flag = h.homes / f".mtgpu-fault-{uuid.uuid4().hex}"
    script = f"#!/bin/sh\n#MTGPU cpus=1\necho started\nwhile [ ! -e {flag} ]; do sleep 0.1; done\nexit 7\n"
    with api_socket(h.run_dir, h.uid) as s:
        jid = call(s, "job.submit", {"script": script})["result"]["job_id"]
    _wait_state(h, h.uid, jid, ("RUNNING",))
    h.stop(signal.SIGKILL)
    try:
        flag.touch()  # the job ends while the daemon is down
        h.start()
        v = _wait_state(h, h.uid, jid, ("FAILED", "COMPLETED", "NODE_FAIL"))
    finally:
        flag.unlink(missing_ok=True)
    assert v["state"] == "FAILED" and v["exit_code"] == 7, (v["state"], v["reason"])
    assert Path(v["stdout"]).read_text().startswith("started")
    tally("faults_survived")
    tally("acked_jobs_checked")


def _journal_records(path: Path) -> tuple[bytes, int]:
    data = path.read_bytes()
    return data, struct.unpack_from("<I", data, 36)[0]


def test_a_torn_journal_tail_is_cut_and_every_committed_job_kept(host):
    """A record half-written at a power cut, after the last acknowledged one."""
    h = host
    with api_socket(h.run_dir, h.uid) as s:
        mine = [call(s, "job.submit", {"script": HOLD})["result"]["job_id"] for _ in range(5)]
    committed = _ids(h)
    h.stop()
    journal = h.state_dir / "raft.journal"
    data, last = _journal_records(journal)
    size = struct.unpack_from("<I", data, last - 4)[0]
    record = data[last - size - 8 : last]
    torn = bytearray(data[:last]) + record[: len(record) // 2]
    struct.pack_into("<I", torn, 36, last + len(record))  # the header already counts it
    journal.write_bytes(bytes(torn))
    h.start()
    assert _ids(h) == committed and set(mine) <= committed
    assert "state journal" in h.log() and "damaged" in h.log()
    saved = list(h.state_dir.glob("raft.journal.damaged-*"))
    assert saved and saved[0].read_bytes() == bytes(torn)
    with api_socket(h.run_dir, h.uid) as s:  # and it goes on taking jobs
        assert call(s, "job.submit", {"script": HOLD})["ok"]
        call(s, "job.cancel", {"job_ids": sorted(_ids(h))})
    for p in saved:
        p.unlink()
    tally("faults_survived")
    tally("acked_jobs_checked", len(mine))


def test_a_damaged_journal_record_is_detected_and_what_precedes_it_kept(host):
    h = host
    before = _ids(h)
    with api_socket(h.run_dir, h.uid) as s:
        late = call(s, "job.submit", {"script": HOLD})["result"]["job_id"]
    h.stop()
    journal = h.state_dir / "raft.journal"
    data, last = _journal_records(journal)
    size = struct.unpack_from("<I", data, last - 4)[0]
    start = last - size - 8
    bad = bytearray(data)
    for i in range(start + 4 + 16 + 2, start + 4 + 16 + 12):
        bad[i] ^= 0xFF  # inside the last record's pickle
    journal.write_bytes(bytes(bad))
    h.start()
    after = _ids(h)
    # Everything before the damaged record is there; the damage is named in the log.
    assert before <= after, before - after
    assert "cannot be decoded" in h.log() or "does not end" in h.log()
    assert late in after or "damaged" in h.log()
    with api_socket(h.run_dir, h.uid) as s:
        call(s, "job.cancel", {"job_ids": sorted(after)})
    for p in h.state_dir.glob("raft.journal.damaged-*"):
        p.unlink()
    tally("faults_survived")


def test_a_full_state_dir_refuses_changes_clearly_and_keeps_state(make_host):
    h = make_host(start=False, config={"SIMULATED_CPUS": 2})
    state = h.state_dir
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "mtgpu-fault-full", str(state)], check=True)
    # Under TENANT_HOME_ROOT: each tenant has a /tmp of its own (PRIVATE_TMP).
    flag = h.homes / f".mtgpu-fault-{uuid.uuid4().hex}"
    try:
        h.start()
        uid = _user(h, "flo")
        with api_socket(h.run_dir, uid) as s:
            running = call(
                s,
                "job.submit",
                {"script": f"#!/bin/sh\n#MTGPU cpus=2\nwhile [ ! -e {flag} ]; do sleep 0.1; done\n"},
            )
            kept = [running["result"]["job_id"]]
            kept += [call(s, "job.submit", {"script": HOLD})["result"]["job_id"] for _ in range(2)]
            _wait_state(h, uid, kept[0], ("RUNNING",))
            filler = state / "filler"
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=36"], capture_output=True)
            time.sleep(0.15)  # the daemon looks at the free space at most every 100 ms
            refused = [
                call(s, "job.submit", {"script": HOLD, "overrides": {"name": "x" * 200}}) for _ in range(20)
            ]
            assert h.proc.poll() is None, h.log()
            assert all(not a["ok"] for a in refused), refused[0]
            assert "STATE_DIR" in refused[0]["error"] and "free space" in refused[0]["error"]
            # What already happened is still recorded from the reserve: a job's end.
            flag.touch()
            assert _wait_state(h, uid, kept[0], ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
            filler.unlink()
            time.sleep(0.15)
            again = call(s, "job.submit", {"script": HOLD})
            assert again["ok"], again
            call(s, "job.cancel", {"job_ids": kept[1:] + [again["result"]["job_id"]]})
        h.restart()
        assert set(kept) | {again["result"]["job_id"]} <= _ids(h)
    finally:
        flag.unlink(missing_ok=True)
        h.stop()
        subprocess.run(["umount", "-l", str(state)])
    tally("faults_survived")
    tally("acked_jobs_checked", 4)


def test_a_member_whose_clock_jumps_an_hour_keeps_its_jobs(host):
    """The daemon restarted with its clock an hour ahead (faketime): the running job
    is re-adopted, not timed out (time limits run on the monotonic clock), and the
    queue is kept."""
    h = host
    with api_socket(h.run_dir, h.uid) as s:
        run = call(s, "job.submit", {"script": "#!/bin/sh\n#MTGPU cpus=2 time=30m\nsleep 300\n"})
        wait = call(s, "job.submit", {"script": HOLD})
    jid, pending = run["result"]["job_id"], wait["result"]["job_id"]
    _wait_state(h, h.uid, jid, ("RUNNING",))
    lib = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    h.stop()
    # libfaketime shifts the monotonic clock by the same constant (keeping it real
    # breaks Python's sleep); differences of it, which time limits use, are unchanged.
    h.env.update({"LD_PRELOAD": str(lib), "FAKETIME": "+1h"})
    try:
        h.start()
        stamp = h.log().strip().splitlines()[-1][:19]  # the daemon's idea of now
        ahead = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) - time.time()
        assert 3500 < ahead < 3700, stamp
        with api_socket(h.run_dir, 0) as s:
            shown = call(s, "job.show", {"job_id": jid})["result"]
            time.sleep(1.5)  # an agent round re-adopts the job, at the new time
            again = call(s, "job.show", {"job_id": jid})["result"]
            queued = call(s, "job.show", {"job_id": pending})["result"]
            call(s, "job.cancel", {"job_ids": [jid, pending]})
    finally:
        h.env.clear()
        h.restart()
    assert shown["state"] == again["state"] == "RUNNING", again
    assert queued["state"] == "PENDING"
    tally("faults_survived")
    tally("acked_jobs_checked", 2)


def test_partitions_are_covered_by_the_cluster_tests():
    """A partitioned old leader must not start jobs and the majority goes on: see
    tests/cluster/test_cluster.py::test_partitioned_old_leader_cannot_start_jobs and
    ::test_kill_scheduler_during_submissions_loses_no_acknowledged_job."""
    src = (Path(__file__).resolve().parent.parent / "cluster" / "test_cluster.py").read_text()
    for name in (
        "test_partitioned_old_leader_cannot_start_jobs",
        "test_kill_scheduler_during_submissions_loses_no_acknowledged_job",
        "test_whole_cluster_restart_keeps_the_queue",
    ):
        assert f"def {name}(" in src
    assert shutil.which("ip")
