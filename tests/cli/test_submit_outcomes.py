"""What `mt-job submit` (the Python client and the C fast path alike) does when a
submission's outcome is unknown or nothing was done: it sends it again with the same
key, and if it still cannot know, says "unknown" with its own exit status."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from mtgpu_testing import REPO

OK = {"ok": True, "result": {"job_id": "7", "tasks": 1, "warnings": []}}
DROP = None  # the connection closes with no answer (a daemon killed, a relay lost)
CUT_OFF = {
    "ok": False,
    "code": "no_leader",
    "error": "this member cannot reach its cluster's scheduler since 19:35:02 UTC; nothing "
    "was done here: retry in a few seconds, or from another member",
}
IN_DOUBT = {"ok": False, "code": "in_doubt", "error": "the submission was not committed within 30s"}
LIMITED = {"ok": False, "code": "rate_limited", "error": "too many submissions"}
REJECTED = {"ok": False, "code": "rejected", "error": "rejected: no member has 9 GPUs"}


def fake_daemon(path: Path, answer: Callable[[int], dict | None]) -> tuple[list[dict], Callable[[], None]]:
    """A socket answering request ``i`` with ``answer(i)`` (None: close unanswered)."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(8)
    seen: list[dict] = []
    done = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn, conn.makefile("rwb") as f:
                for line in f:
                    req = json.loads(line)
                    seen.append(req)
                    a = answer(len(seen) - 1)
                    if a is None:
                        break
                    f.write(json.dumps({"id": req["id"], **a}).encode() + b"\n")
                    f.flush()

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def stop() -> None:
        done.set()
        t.join(5)
        srv.close()

    return seen, stop


@pytest.fixture(scope="module")
def fast_client(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "tests/run.sh machines have a C compiler"
    exe = tmp_path_factory.mktemp("fast") / "mt-job-fast"
    subprocess.run([cc, "-O2", "-o", str(exe), str(REPO / "mtgpu" / "cli" / "fastjob.c")], check=True)
    return exe


@pytest.fixture(params=["python", "c"])
def mt_job(request, fast_client) -> list[str]:
    """The client under test, as the argv that starts it."""
    if request.param == "c":
        return [str(fast_client)]
    return [sys.executable, "-I", "-m", "mtgpu.cli.job"]


def submit(argv: list[str], sock: Path, retry: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*argv, "submit", "-"],
        input=b"#!/bin/bash\ntrue\n",
        capture_output=True,
        check=False,
        timeout=60,
        cwd="/",
        env={"MTGPU_API_SOCKET": str(sock), "PATH": "/usr/bin:/bin", "MTGPU_SUBMIT_RETRY": str(retry)},
    )


def against(
    argv: list[str], tmp_path: Path, answer: Callable[[int], dict | None], retry: float = 20.0
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """One ``submit`` by the client ``argv`` against a fake daemon answering ``answer``."""
    sock = tmp_path / "api.sock"
    seen, stop = fake_daemon(sock, answer)
    try:
        return submit(argv, sock, retry), seen
    finally:
        stop()


def keys(seen: list[dict]) -> set[str]:
    return {r["args"]["token"] for r in seen}


def test_a_dropped_submission_is_sent_again_with_its_key(tmp_path, mt_job):
    r, seen = against(mt_job, tmp_path, lambda i: [DROP, IN_DOUBT, OK][min(i, 2)])
    assert r.returncode == 0 and r.stdout == b"Submitted job 7\n", r
    assert len(seen) == 3 and len(keys(seen)) == 1  # one key: the daemon answers the first job
    assert len(next(iter(keys(seen)))) == 32
    assert r.stderr == b"", r.stderr  # resent within SUBMIT_NOTICE: not shown


def test_a_submission_never_answered_is_unknown_with_its_own_status(tmp_path, mt_job):
    r, seen = against(mt_job, tmp_path, lambda i: DROP if i == 0 else CUT_OFF, retry=2)
    # The first attempt may have been made; the later ones were refused unprocessed.
    assert r.returncode == 75, r
    assert b"unknown" in r.stderr and b"check `mt-job list`" in r.stderr, r.stderr
    assert len(seen) > 1 and len(keys(seen)) == 1


def test_a_cut_off_member_is_retried_then_named_as_not_submitted(tmp_path, mt_job):
    r, seen = against(mt_job, tmp_path, lambda i: CUT_OFF, retry=2)
    err = r.stderr.decode()
    assert r.returncode == 1, r
    # Given up within SUBMIT_NOTICE: the one line says why.
    assert "not submitted: " in err and "cannot reach its cluster's scheduler since 19:35:02 UTC" in err
    assert "unknown" not in err and "retrying" not in err
    assert len(seen) > 1 and len(keys(seen)) == 1


def test_a_limit_after_an_attempt_in_doubt_is_no_verdict(tmp_path, mt_job):
    # The first attempt may still be committed: the limit it meets on the retry (its
    # own job counted) does not end the submission as refused.
    r, seen = against(mt_job, tmp_path, lambda i: [IN_DOUBT, LIMITED, OK][min(i, 2)])
    assert r.returncode == 0, r
    assert len(seen) == 3 and len(keys(seen)) == 1


def test_a_refusal_is_final_at_once(tmp_path, mt_job):
    r, seen = against(mt_job, tmp_path, lambda i: REJECTED)
    assert r.returncode == 1 and b"no member has 9 GPUs" in r.stderr, r
    assert len(seen) == 1


def test_each_submission_has_a_key_of_its_own(tmp_path, mt_job):
    sock = tmp_path / "api.sock"
    seen, stop = fake_daemon(sock, lambda i: OK)
    try:
        assert submit(mt_job, sock).returncode == 0
        assert submit(mt_job, sock).returncode == 0
    finally:
        stop()
    assert len(keys(seen)) == 2
