"""A daemon whose socket answers before every operation is registered (a cluster
member forming, loading its state) says "starting", and the tools retry."""

from __future__ import annotations

import asyncio

from mtgpu_testing import fake_daemon

from mtgpu.api.client import ApiClient
from mtgpu.api.dispatcher import Caller, Dispatcher

ROOT = Caller("root", 0, True, "socket")


def test_an_operation_not_registered_yet_is_starting_then_unknown():
    d = Dispatcher(starting=True)
    r = asyncio.run(d.handle(ROOT, {"op": "job.submit", "args": {}, "id": 1}))
    assert not r["ok"] and r["code"] == "starting" and "retry" in r["error"]
    d.register("job.submit", lambda caller, args: {"job_id": "1"})
    d.started()
    assert asyncio.run(d.handle(ROOT, {"op": "job.submit", "args": {}, "id": 2}))["ok"]
    r = asyncio.run(d.handle(ROOT, {"op": "no.such", "args": {}, "id": 3}))
    assert r["code"] == "unknown_op"


STARTING = {"ok": False, "error": "the MTGPU daemon is starting; retry", "code": "starting"}


def test_the_client_retries_while_the_daemon_starts(tmp_path):
    t, seen = fake_daemon(tmp_path / "api.sock", [STARTING, STARTING, {"ok": True, "result": [1]}])
    assert ApiClient(str(tmp_path / "api.sock"), timeout=10).call("job.list") == [1]
    t.join(5)
    assert [r["op"] for r in seen] == ["job.list"] * 3


def test_the_fast_submit_retries_while_the_daemon_starts(tmp_path):
    import shutil
    import subprocess

    from mtgpu_testing import REPO

    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "tests/run.sh machines have a C compiler"
    exe = tmp_path / "mt-job-fast"
    subprocess.run([cc, "-O2", "-o", str(exe), str(REPO / "mtgpu" / "cli" / "fastjob.c")], check=True)
    sock = tmp_path / "api.sock"
    t, seen = fake_daemon(
        sock, [STARTING, {"ok": True, "result": {"job_id": "7", "tasks": 1, "warnings": []}}]
    )
    r = subprocess.run(
        [str(exe), "submit", "-"],
        input=b"#!/bin/bash\ntrue\n",
        capture_output=True,
        check=False,
        env={"MTGPU_API_SOCKET": str(sock), "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    t.join(5)
    assert r.returncode == 0 and r.stdout == b"Submitted job 7\n", r
    # The same submission (the same token) both times: a retry never makes a second job.
    assert len(seen) == 2 and seen[0]["args"]["token"] == seen[1]["args"]["token"]
