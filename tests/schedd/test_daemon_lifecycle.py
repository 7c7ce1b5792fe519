"""A job's lifecycle through a real daemon with simulated GPUs: requeue, restarts of
the same job on the same host (attempts), cancel, and what each tool says."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mtgpu_testing import show_job, wait_job

# Every mt-job behaviour here is checked with both clients (Python, C fast path).
pytestmark = [pytest.mark.root, pytest.mark.mtjob_clients]

GPUS = {"SIMULATED_GPUS": [{"type": "rtx4090", "count": 1, "vram": "24G"}], "SIMULATED_CPUS": 4}
SLEEPER = (
    "#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=20M requeue=yes\necho attempt $MTGPU_RESTART_COUNT\nsleep 300\n"
)


def submit(host, key, script, user="rita"):
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, key, jid, user="rita"):
    return show_job(host, user, key, jid)


def wait(host, key, jid, pred, what, timeout=45, user="rita"):
    return wait_job(host, user, key, jid, pred, what, timeout)


def started(j):
    return j["state"] == "RUNNING" and j["start_time"] is not None


def test_requeued_job_started_again_on_the_same_host_ends_and_cancels(make_host):
    """drain --now requeues a RUNNING job; undrain starts it again on the same host.
    The second start (attempt 1) must be a job like any other: its cancel ends it and
    says so, its end is recorded and frees its GPU, and a cancelled job never runs
    again, whatever the earlier attempt's late report or a later drain does."""
    host = make_host(GPUS, name="solo")
    key = host.add_user("rita")
    jid = submit(host, key, SLEEPER)
    j = wait(host, key, jid, started, "its first start")
    assert j["attempt"] == 0

    r = host.admin("drain", "solo", "--now", "--reason", "firmware")
    assert jid in r.stdout
    j = wait(host, key, jid, lambda j: j["state"] == "PENDING", "its requeue")
    assert j["requeues"] == 1
    host.admin("undrain", "solo")
    j = wait(host, key, jid, started, "its second start")
    assert j["attempt"] == 1 and j["nodes"] == ["solo"]
    out = j["stdout"]
    wait(host, key, jid, lambda _j: "attempt 1" in Path(out).read_text(), "the second attempt's output")

    # The tenant's cancel ends attempt 1, and says which job it stopped.
    r = host.ssh("rita", key, "mt-job", "cancel", jid)
    assert r.returncode == 0, r.stderr
    assert jid in r.stdout.decode()
    j = wait(host, key, jid, lambda j: j["state"] == "CANCELLED", "CANCELLED", timeout=30)
    assert j["gpus"] == [] or all(g["node"] == "solo" for g in j["gpus"])
    # Its GPU is free again: nothing holds it.
    (node,) = json.loads(host.ssh("rita", key, "mt-job nodes --json").stdout)
    assert all(not g.get("jobs") for g in node["gpus"]), node

    # A second cancel says the job had ended, with a non-zero status; so does the admin's.
    r = host.ssh("rita", key, "mt-job", "cancel", jid)
    assert r.returncode != 0 and b"already ended" in r.stderr, r
    r = host.admin("cancel", jid, check=False)
    assert r.returncode != 0 and "already ended" in (r.stdout + r.stderr)

    # A later drain --now does not run the cancelled job again.
    host.admin("drain", "solo", "--now")
    host.admin("undrain", "solo")
    other = submit(host, key, "#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=20M\necho done\n")
    wait(host, key, other, lambda j: j["state"] == "COMPLETED", "the next job's end")
    j = show(host, key, jid)
    assert j["state"] == "CANCELLED" and j["attempt"] == 1


def test_second_attempt_end_is_recorded_and_frees_the_gpu(make_host):
    """Attempt 1 of a requeued job runs to its end on the same host: the end is
    recorded (the report of attempt 0 does not swallow it) and the GPU is free."""
    host = make_host(GPUS, name="solo")
    key = host.add_user("rita")
    jid = submit(host, key, SLEEPER.replace("sleep 300", "sleep $(( (1 - MTGPU_RESTART_COUNT) * 300 + 1 ))"))
    wait(host, key, jid, started, "its first start")
    host.admin("drain", "solo", "--now")
    wait(host, key, jid, lambda j: j["state"] == "PENDING", "its requeue")
    host.admin("undrain", "solo")
    j = wait(host, key, jid, lambda j: j["state"] == "COMPLETED", "the second attempt's end", timeout=60)
    assert j["attempt"] == 1 and j["exit_code"] == 0
    assert "attempt 1" in Path(j["stdout"]).read_text()
    # A new job gets the GPU.
    nxt = submit(host, key, "#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=20M\ntrue\n")
    wait(host, key, nxt, lambda j: j["state"] == "COMPLETED", "the next job's end")


def test_nodes_2_on_a_standalone_host_is_refused_as_impossible(make_host):
    host = make_host(GPUS, name="solo")
    key = host.add_user("rita")
    r = host.ssh(
        "rita", key, "mt-job", "submit", "--nodes=2", "-", input=b"#!/bin/bash\n#MTGPU cpus=1 ram=20M\ntrue\n"
    )
    assert r.returncode == 1
    assert b"nodes=2 needs 2 members, and this is a standalone host" in r.stderr, r.stderr


HOSTILE_CANCEL = """
import os
from mtgpu.api.client import ApiClient
from mtgpu.errors import ApiError
c = ApiClient(os.environ["MTGPU_API_SOCKET"])
for args in ({"job_ids": ["1"], "wait": 10 ** 9}, {"job_ids": ["1"], "wait": -1},
             {"job_ids": [str(i) for i in range(20000)]}, {"job_ids": ["1"]}):
    try:
        c.call("job.cancel", **args)
        print("accepted")
    except ApiError as e:
        print(e.code)
"""


def test_a_tenant_cannot_hold_the_daemon_with_cancel_waits_or_cancel_others(make_host):
    """A cancel waits 20 s at most, names 10,000 jobs at most, and reaches only the
    caller's own jobs."""
    host = make_host(GPUS, name="solo")
    key = host.add_user("rita")
    other = host.add_user("otis")
    jid = submit(host, key, SLEEPER)
    assert jid == "1"
    wait(host, key, jid, started, "its start")
    r = host.ssh("otis", other, f"{sys.executable} -I -", input=HOSTILE_CANCEL.encode())
    assert r.stdout.decode().split() == ["bad_request", "bad_request", "bad_request", "not_found"], r
    assert show(host, key, jid)["state"] == "RUNNING"
    host.ssh("rita", key, "mt-job", "cancel", jid)
