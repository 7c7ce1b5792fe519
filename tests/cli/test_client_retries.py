"""Both mt-job clients (the Python one and the C fast path, mtgpu/cli/fastjob.c) retry
a submission through an election the same way, deciding on codes, never on words:
against a stand-in daemon that answers each request with the next scripted answer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mtgpu_testing import CLOSE, REPO, fake_daemon, python_env

from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES

OK = {"ok": True, "result": {"job_id": "7", "tasks": 1, "warnings": []}}


def _refusal(code: str, error: str = "refused", **extra: object) -> dict:
    return {"ok": False, "error": error, "code": code, **extra}


def run_client(mtjob_argv: list[str], sock: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*mtjob_argv, *args],
        input=b"#!/bin/bash\ntrue\n",
        capture_output=True,
        check=False,
        env={**python_env(), "MTGPU_API_SOCKET": str(sock), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


@pytest.fixture(scope="module")
def c_client(tmp_path_factory) -> Path:
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "tests/run.sh machines have a C compiler"
    exe = tmp_path_factory.mktemp("fastjob") / "mt-job-fast"
    subprocess.run([cc, "-O2", "-o", str(exe), str(REPO / "mtgpu" / "cli" / "fastjob.c")], check=True)
    return exe


@pytest.fixture(params=["python", "c"])
def client_argv(request, c_client) -> list[str]:
    """The argv of one mt-job client: the Python one or the C fast path."""
    return [sys.executable, "-m", "mtgpu.cli.job"] if request.param == "python" else [str(c_client)]


def test_a_submission_is_retried_through_an_election_with_one_token(tmp_path, client_argv):
    sock = tmp_path / "api.sock"
    script = [
        _refusal("starting", "the daemon is starting"),
        _refusal("no_leader", "no scheduler is elected right now", retryable=True),
        _refusal("busy", "the command queue is full"),  # retryable by its code alone
        _refusal("leader_changed", "the leader changed before the command committed"),
        _refusal("unreachable", "member b did not answer job.submit within 30s"),
        CLOSE,  # a lost answer: the daemon closed the connection
        _refusal("minority", "this member is on the minority side", retryable=True),
        OK,
    ]
    t, seen = fake_daemon(sock, script)
    r = run_client(client_argv, sock, "submit", "--parsable", "-")
    t.join(10)
    assert r.returncode == 0 and r.stdout == b"7\n", r
    assert len(seen) == 8, seen
    assert len({req["args"]["token"] for req in seen}) == 1  # never a second job
    # Over within SUBMIT_NOTICE (7 resends, half a second apart): not shown to the tenant.
    assert r.stderr == b"", r.stderr


def test_a_submission_retried_longer_than_a_failover_says_so(tmp_path, client_argv):
    from mtgpu.cli.job import SUBMIT_NOTICE

    sock = tmp_path / "api.sock"
    waits = int(SUBMIT_NOTICE / 0.5) + 4
    script = [_refusal("no_leader", "no scheduler is elected right now", retryable=True)] * waits + [OK]
    t, seen = fake_daemon(sock, script)
    r = run_client(client_argv, sock, "submit", "--parsable", "-")
    t.join(10)
    assert r.returncode == 0 and r.stdout == b"7\n", r
    assert r.stderr.decode() == "mt-job: no scheduler is elected right now; retrying\n", r.stderr


def test_a_daemon_loading_its_state_is_waited_for_silently(tmp_path, client_argv):
    # A member just restarted (after a failover, say) answers "starting" for a few
    # seconds: neither client tells the tenant, as neither does for its other requests.
    sock = tmp_path / "api.sock"
    _, seen = fake_daemon(sock, [_refusal("starting", "the daemon is starting"), OK])
    r = run_client(client_argv, sock, "submit", "--parsable", "-")
    assert r.returncode == 0 and r.stdout == b"7\n", r
    assert r.stderr == b"", r.stderr
    assert len(seen) == 2


@pytest.mark.parametrize(
    "answer",
    [
        _refusal("rate_limited", "too many submissions: wait 1s and retry"),  # "retry" is only a word
        _refusal("error", "the state change was not committed; retry"),
        _refusal("no_leader", "no scheduler, and this answer says not to", retryable=False),
        _refusal("rejected", "line 2: gpus=x is not a GPU request"),
        _refusal("internal", "internal error (id 7f3a09c2): the administrator can find it in the server log"),
    ],
)
def test_a_refusal_that_is_not_retryable_is_shown_at_once(tmp_path, client_argv, answer):
    sock = tmp_path / "api.sock"
    _, seen = fake_daemon(sock, [answer, OK])
    r = run_client(client_argv, sock, "submit", "-")
    assert r.returncode == 1, r
    assert r.stderr.decode().strip() == f"mt-job: {answer['error']}", r.stderr
    assert len(seen) == 1


def test_the_c_client_knows_the_same_codes_as_the_python_one():
    src = (REPO / "mtgpu" / "cli" / "fastjob.c").read_text()

    def codes(name: str) -> set[str]:
        m = re.search(r"static const char \*const " + name + r"\[\] = \{(.*?)\};", src, re.DOTALL)
        assert m, name
        return set(re.findall(r'"([a-z_]+)"', m.group(1)))

    assert codes("RETRYABLE_CODES") == RETRYABLE_CODES
    assert codes("RESEND_CODES") == RESEND_CODES
    from mtgpu.api.client import ApiClient
    from mtgpu.cli.job import SUBMIT_NOTICE, SUBMIT_RETRY

    assert f"#define SUBMIT_RETRY_S {SUBMIT_RETRY:g} " in src
    assert f"#define SUBMIT_NOTICE_S {SUBMIT_NOTICE:g} " in src
    assert f"#define STARTING_RETRY_S {ApiClient.STARTING_RETRY:g} " in src
