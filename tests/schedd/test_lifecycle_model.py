"""A model-based test of the job lifecycle against a real standalone daemon with
simulated GPUs and real supervisors.

Hypothesis drives the operations tenants and admins have (submit one job or an
array, cancel as the owner or as an admin, drain with and without --now, undrain, a
requeue by drain --now and undrain, a restart of the daemon, kill -9 of a job's
supervisor, jobs that run past their time limit) and after every step checks, against
the daemon and the processes on the host:

- every RUNNING job has a live supervisor of its current attempt, and every live
  supervisor belongs to a RUNNING job (within SETTLE seconds: a start or a stop takes
  a moment);
- no GPU is reserved by two RUNNING jobs (every job here holds its GPU whole);
- `mt-job cancel` of a job that has not ended ends it within CANCEL_BOUND seconds and
  says so (the id, exit 0); of an ended job it says so and exits non-zero;
- a job seen in a final state never changes again (it never runs again), attempts
  never go back, and states move only along the graph in docs/manual.md
  ("Job states");
- `mt-job list --all --json` and `mtgpu-admin jobs --all --json` agree.

The CI run is short and fixed (derandomized, bounded examples). The long run:
``MTGPU_LIFECYCLE_EXAMPLES=40 MTGPU_LIFECYCLE_STEPS=30 tests/run.sh
tests/schedd/test_lifecycle_model.py`` (tests/README.md records what it ran).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from mtgpu.jobstate import FINAL_STATES
from mtgpu.schedd.runner import PIDFILE, RESULT, SPEC, is_alive, read_json

# Every mt-job behaviour here is checked with both clients (Python, C fast path).
pytestmark = [pytest.mark.root, pytest.mark.mtjob_clients]

FINAL = FINAL_STATES
#: How long the daemon and the supervisors may take to agree after a step.
SETTLE = 30.0
#: How long a cancelled running job may take to end (SIGTERM, then SIGKILL after 10 s).
CANCEL_BOUND = 30.0
EXAMPLES = int(os.environ.get("MTGPU_LIFECYCLE_EXAMPLES", "2"))
STEPS = int(os.environ.get("MTGPU_LIFECYCLE_STEPS", "10"))
LONG = "MTGPU_LIFECYCLE_EXAMPLES" in os.environ

BODIES = {
    "short": "sleep 1",
    "long": "sleep 300",
    # Past its time limit: SIGTERM at 2 s, TIMEOUT.
    "limited": "sleep 300",
}


def job_file(gpus: int, requeue: bool, length: str, array: bool) -> bytes:
    d = [
        f"gpus={gpus}" if gpus else "",
        "cpus=1 ram=20M",
        "requeue=yes" if requeue else "",
        "time=2s" if length == "limited" else "",
        "array=0-2" if array else "",
    ]
    return f"#!/bin/bash\n#MTGPU {' '.join(x for x in d if x)}\n{BODIES[length]}\n".encode()


class Lifecycle(RuleBasedStateMachine):
    host = None  # set by the test
    key: Path
    stats: ClassVar[dict[str, int]] = {"steps": 0, "examples": 0}

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, dict] = {}
        Lifecycle.stats["examples"] += 1

    # ----------------------------------------------------------------- helpers

    def api_jobs(self) -> dict[str, dict]:
        r = self.host.api("job.list", all=True, timeout=30)
        assert r["ok"], r
        return {j["job_id"]: j for j in r["result"]}

    def supervisors(self) -> dict[str, int]:
        """Job id -> attempt, for each job directory whose supervisor is alive."""
        out = {}
        jobs_dir = self.host.state_dir / "jobs"
        try:
            entries = [e for e in os.scandir(jobs_dir) if e.is_dir() and not e.name.startswith(".")]
        except FileNotFoundError:
            return out
        for e in entries:
            d = Path(e.path)
            if (d / RESULT).exists() or not is_alive(read_json(d / PIDFILE)):
                continue
            spec = read_json(d / SPEC) or {}
            out[e.name] = int(spec.get("launch", {}).get("attempt") or 0)
        return out

    def observe(self, jobs: dict[str, dict]) -> None:
        """Each job's state may only move along the documented graph."""
        for jid, j in jobs.items():
            prev = self.seen.get(jid)
            now = (j["state"], j["attempt"], j["end_time"])
            if prev is not None:
                p = (prev["state"], prev["attempt"], prev["end_time"])
                if p[0] in FINAL:
                    assert now == p, f"job {jid} changed after it ended: {p} -> {now}"
                assert now[1] >= p[1], f"job {jid}'s attempt went back: {p} -> {now}"
                if p[0] == "RUNNING" and now[0] == "PENDING":
                    assert now[1] > p[1], f"job {jid} back to PENDING without a requeue: {p} -> {now}"
            self.seen[jid] = j

    def cancel_checked(self, jid: str, as_admin: bool) -> None:
        before = self.api_jobs().get(jid)
        if as_admin:
            r = self.host.admin("cancel", jid, check=False)
            rc, out, err = r.returncode, r.stdout, r.stderr
        else:
            r = self.host.ssh("mona", self.key, "mt-job", "cancel", jid)
            rc, out, err = r.returncode, r.stdout.decode(), r.stderr.decode()
        if before is not None and before["state"] in FINAL:
            assert rc != 0 and "already ended" in err, (jid, rc, out, err)
            return
        if rc != 0:
            # It ended on its own between the look and the cancel: it says so.
            assert "already ended" in err, (jid, rc, out, err)
            assert self.api_jobs()[jid]["state"] in FINAL
            return
        assert jid in out, (jid, out, err)
        deadline = time.time() + CANCEL_BOUND
        while (state := self.api_jobs()[jid]["state"]) not in FINAL:
            assert time.time() < deadline, f"job {jid} still {state} {CANCEL_BOUND} s after its cancel"
            time.sleep(0.3)

    # ------------------------------------------------------------------- rules

    @initialize()
    def clean_slate(self) -> None:
        self.host.admin("undrain", "solo", check=False)
        active = [jid for jid, j in self.api_jobs().items() if j["state"] not in FINAL]
        if active:
            self.host.admin("cancel", *active, check=False)
        self.seen = self.api_jobs()

    @rule(
        target=jobs,
        gpus=st.sampled_from([0, 1]),
        requeue=st.booleans(),
        length=st.sampled_from(sorted(BODIES)),
    )
    def submit(self, gpus: int, requeue: bool, length: str) -> str:
        r = self.host.ssh(
            "mona",
            self.key,
            "mt-job",
            "submit",
            "--parsable",
            "-",
            input=job_file(gpus, requeue, length, False),
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.decode().strip()

    @rule(target=jobs, requeue=st.booleans())
    def submit_array(self, requeue: bool):
        r = self.host.ssh(
            "mona", self.key, "mt-job", "submit", "--parsable", "-", input=job_file(0, requeue, "short", True)
        )
        assert r.returncode == 0, r.stderr
        aid = r.stdout.decode().strip()
        return multiple(*(f"{aid}_{i}" for i in range(3)))

    @rule(jid=jobs)
    def cancel_own(self, jid: str) -> None:
        self.cancel_checked(jid, as_admin=False)

    @rule(jid=jobs)
    def cancel_admin(self, jid: str) -> None:
        self.cancel_checked(jid, as_admin=True)

    @rule(now=st.booleans())
    def drain(self, now: bool) -> None:
        self.host.admin("drain", "solo", *(["--now"] if now else []))

    @rule()
    def undrain(self) -> None:
        self.host.admin("undrain", "solo")

    @rule()
    def requeue_in_place(self) -> None:
        """The sequence that once made ghost jobs: requeue, and start again here."""
        self.host.admin("drain", "solo", "--now")
        self.host.admin("undrain", "solo")

    @rule()
    def restart_daemon(self) -> None:
        self.host.restart()

    @rule(jid=jobs)
    def kill_supervisor(self, jid: str) -> None:
        rec = read_json(self.host.state_dir / "jobs" / jid / PIDFILE)
        if rec and is_alive(rec):
            os.kill(int(rec["pid"]), signal.SIGKILL)

    # -------------------------------------------------------------- invariants

    @invariant()
    def daemon_and_processes_agree(self) -> None:
        Lifecycle.stats["steps"] += 1
        deadline = time.time() + SETTLE
        while True:
            jobs = self.api_jobs()
            self.observe(jobs)
            running = {jid: j["attempt"] for jid, j in jobs.items() if j["state"] == "RUNNING"}
            live = self.supervisors()
            held: dict[tuple[str, int], list[str]] = {}
            for jid, j in jobs.items():
                if j["state"] == "RUNNING":
                    for g in j["gpus"]:
                        held.setdefault((g["node"], g["index"]), []).append(jid)
            twice = {g: ids for g, ids in held.items() if len(ids) > 1}
            assert not twice, f"GPUs reserved by two running jobs: {twice}"
            if running == live:
                break
            assert time.time() < deadline, (
                f"after {SETTLE} s: running jobs (attempt) {running}, live supervisors (attempt) {live}"
            )
            time.sleep(0.3)

    @invariant()
    def the_tools_agree(self) -> None:
        def listed() -> dict[str, tuple[str, int]]:
            r = self.host.ssh("mona", self.key, "mt-job", "list", "--all", "--json")
            assert r.returncode == 0, r.stderr
            return {j["job_id"]: (j["state"], j["attempt"]) for j in json.loads(r.stdout)}

        for _ in range(5):
            first = listed()
            admin = {
                j["job_id"]: (j["state"], j["attempt"])
                for j in json.loads(self.host.admin("jobs", "--all", "--json").stdout)
            }
            if first == listed():  # nothing moved meanwhile: the admin's view is comparable
                assert admin == first, (admin, first)
                return
            time.sleep(0.5)

    def teardown(self) -> None:
        if self.host is None:
            return
        self.host.admin("undrain", "solo", check=False)
        active = [jid for jid, j in self.api_jobs().items() if j["state"] not in FINAL]
        if active:
            self.host.admin("cancel", *active, check=False)


@pytest.mark.timeout(0 if LONG else 300)  # the long run takes as long as it takes
def test_job_lifecycle_model(make_host):
    host = make_host(
        {"SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}], "SIMULATED_CPUS": 4}, name="solo"
    )
    Lifecycle.host = host
    Lifecycle.key = host.add_user("mona")
    Lifecycle.stats = {"steps": 0, "examples": 0}
    try:
        run_state_machine_as_test(
            Lifecycle,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                derandomize=not LONG,
                print_blob=True,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        Lifecycle.host = None
        print(
            f"lifecycle model: {Lifecycle.stats['examples']} examples, "
            f"{Lifecycle.stats['steps']} steps checked"
        )
