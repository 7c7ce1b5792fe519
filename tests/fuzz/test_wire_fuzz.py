"""Malformed API messages (the Unix socket and the mtgpu-api subsystem), job files,
SSH session requests and SSH-level garbage against one real daemon: every message
gets a clear answer, garbage gets the connection closed, and the daemon never falls
over. Nothing without the cluster's key (a tenant, a stranger) reaches the peer
channels.

After the examples of every test the daemon is watched (:class:`Watch`): it is alive,
another tenant's login completes within LOGIN_BOUND (a liveness bound, not a speed
claim), nothing it logged is a traceback, and its RSS is within RSS_BOUND of its start.
The cheap checks (alive, log, RSS) run after every example, the login every
LOGIN_EVERY examples and at the end of each test.

CI runs a fixed-seed, short run; ``MTGPU_FUZZ_EXAMPLES=N`` gives every test N examples
for a long run (tests/README.md records one).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import asyncssh
import psutil
import pytest
from figures import highest, tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mtgpu_testing import Host
from security_testing import Tenant, Witness, api_socket

from mtgpu.config.units import MAX_SIZE
from mtgpu.schedd.jobfile import DIRECTIVES

pytestmark = pytest.mark.root

OPS = [
    "job.submit",
    "job.list",
    "job.show",
    "job.cancel",
    "nodes",
    "whoami",
    "version",
    "workspace.create",
    "workspace.list",
    "workspace.show",
    "workspace.rm",
    "workspace.policy",
    "user.add",
    "invite",
    "usage",
    "forward",
    "job.dispatch",
    "retention.member",
    "",
    "x" * 500,
]
JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=40),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
ARGS = st.dictionaries(
    st.sampled_from(
        [
            "script",
            "job_id",
            "job_ids",
            "all",
            "user",
            "workdir",
            "overrides",
            "token",
            "name",
            "image",
            "reason",
        ]
    ),
    JSON,
    max_size=4,
)
REQUESTS = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(OPS), "args": ARGS}, optional={"id": JSON}),
    st.fixed_dictionaries({"op": JSON}, optional={"args": JSON, "id": JSON}),
    JSON,
)


def fuzz(cases: int, scaled: bool = True) -> settings:
    """A fixed seed and ``cases`` examples; for a long run, MTGPU_FUZZ_EXAMPLES cases
    (not for a test whose one example is a batch: hypothesis takes minutes to draw a
    second batch of 150 requests)."""
    if scaled:
        cases = max(cases, int(os.environ.get("MTGPU_FUZZ_EXAMPLES", 0)))
    return settings(
        max_examples=cases,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


#: How much the daemon's RSS may grow over the whole run, from its start.
RSS_BOUND = 200 << 20
#: How long another tenant's login may take: generous, a liveness bound.
LOGIN_BOUND = 60
#: A login by the bystander every this many examples (and at the end of each test).
LOGIN_EVERY = 25
#: The module's watch, made with its daemon.
WATCH: Watch | None = None


class Watch:
    """What must hold of the daemon after each example."""

    def __init__(self, h: Host, bystander: str, key) -> None:
        self.h, self.bystander, self.key = h, bystander, key
        self.rss0 = psutil.Process(h._server_pid()).memory_info().rss
        self.examples = 0

    def check(self, *, login: bool = False) -> None:
        h = self.h
        assert h.proc.poll() is None, h.log()
        text = h.log_path.read_text(errors="replace")
        assert "Traceback" not in text, text[text.index("Traceback") - 300 :][:3000]
        grown = psutil.Process(h._server_pid()).memory_info().rss - self.rss0
        assert grown < RSS_BOUND, f"RSS grew by {grown >> 20} MiB"
        self.examples += 1
        if login or self.examples % LOGIN_EVERY == 0:
            r = h.ssh(self.bystander, self.key, "echo", "alive", timeout=LOGIN_BOUND)
            assert r.returncode == 0 and r.stdout.strip() == b"alive", r.stderr


@pytest.fixture(scope="module")
def target():
    h = Host({"SIMULATED_CPUS": 1, "USER_SUBMIT_RATE": 1000, "USER_SUBMIT_BURST": 1000})
    h.start()
    key = h.add_user("fuzzy")
    assert h.ssh("fuzzy", key, "true").returncode == 0
    other = h.add_user("bystander")
    assert h.ssh("bystander", other, "true").returncode == 0
    uid = int(h.passwd("fuzzy")[2])
    sock = api_socket(h.run_dir, uid)
    global WATCH
    WATCH = Watch(h, "bystander", other)
    # Another tenant logs in with OpenSSH one login after another for the whole run,
    # each within LOGIN_BOUND (its figures go to the closing report).
    bystander = Tenant("bystander", int(h.passwd("bystander")[2]), other, h.homes / "bystander")
    with Witness(h, bystander, bound=LOGIN_BOUND, label="the wire fuzzing"):
        yield h, key, uid, sock.makefile("rwb")
        WATCH.check(login=True)
    grown = psutil.Process(h._server_pid()).memory_info().rss - WATCH.rss0
    highest("fuzz_daemon_rss_growth_mib", grown >> 20)
    sock.close()
    with api_socket(h.run_dir, 0) as s:  # what the fuzzing submitted, if anything
        f = s.makefile("rwb")
        f.write(b'{"op": "job.list", "args": {"all": true}}\n')
        f.flush()
        ids = [j["job_id"] for j in json.loads(f.readline())["result"]]
        f.write(json.dumps({"op": "job.cancel", "args": {"job_ids": ids}}).encode() + b"\n")
        f.flush()
        f.readline()
    h.cleanup()


def _check(answer: dict) -> None:
    assert isinstance(answer, dict) and answer.get("ok") in (True, False), answer
    if not answer["ok"]:
        assert answer["code"] != "internal", answer  # a handler crashed on it
        assert answer["error"], answer


@fuzz(250)
@given(REQUESTS)
def test_api_messages_on_the_unix_socket(target, request):
    _, _, _, f = target
    tally("fuzz_cases")
    f.write(json.dumps(request).encode() + b"\n")
    f.flush()
    _check(json.loads(f.readline()))
    WATCH.check()


@fuzz(100)
@given(st.binary(min_size=1, max_size=300).filter(lambda b: b"\n" not in b))
def test_garbage_lines_on_the_unix_socket(target, raw):
    h, _, uid, _ = target
    tally("fuzz_cases")
    with api_socket(h.run_dir, uid) as s:  # a connection of its own: one case, one answer
        f = s.makefile("rwb")
        f.write(raw + b"\n" + b'{"op": "whoami", "id": "after"}\n')
        f.flush()
        if raw.strip():  # blank lines are skipped
            _check(json.loads(f.readline()))
        after = json.loads(f.readline())
    assert after["id"] == "after" and after["ok"], after
    WATCH.check()


def test_an_oversized_request_is_refused_and_the_daemon_goes_on(target):
    h, _, uid, _ = target
    with api_socket(h.run_dir, uid) as s:
        try:
            s.sendall(b'{"op": "job.submit", "args": {"script": "' + b"x" * (2 << 20) + b'"}}\n')
        except BrokenPipeError:
            pass  # the daemon stopped reading at 1 MiB; its answer is there to read
        answer = json.loads(s.makefile("rb").readline())
    assert not answer["ok"] and answer["code"] == "too_large", answer
    tally("fuzz_cases")
    assert h.proc.poll() is None


async def _subsystem(h, key, requests):
    async with asyncssh.connect(
        h.address, h.port, username="fuzzy", client_keys=[str(key)], known_hosts=None
    ) as conn:
        proc = await conn.create_process(subsystem="mtgpu-api", encoding=None)
        out = []
        for r in requests:
            proc.stdin.write(r + b"\n")
            out.append(await asyncio.wait_for(proc.stdout.readline(), 30))
        return out


@fuzz(1, scaled=False)
@given(
    st.lists(
        st.one_of(
            REQUESTS.map(lambda r: json.dumps(r).encode()),
            st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b and b.strip()),
        ),
        min_size=150,
        max_size=150,
    )
)
def test_api_messages_on_the_mtgpu_api_subsystem(target, batch):
    """One SSH session, a batch of requests and garbage lines on it."""
    h, key, _, _ = target
    answers = asyncio.run(_subsystem(h, key, batch))
    for line in answers:
        _check(json.loads(line))
    tally("fuzz_cases", len(batch))
    WATCH.check(login=True)


def _raw(h: Host, payload: bytes, banner: bool) -> bytes:
    with socket.create_connection((h.address, h.port), timeout=10) as s:
        got = s.recv(256)
        if banner:
            s.sendall(b"SSH-2.0-fuzz\r\n")
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the end of what the client says
            while s.recv(65536):  # the daemon closes its side (or times out the test)
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        return got


@fuzz(60)
@given(st.binary(max_size=2000), st.booleans())
def test_ssh_garbage_closes_the_connection_and_nothing_else(target, payload, banner):
    h, _, _, _ = target
    tally("fuzz_cases")
    assert _raw(h, payload, banner).startswith(b"SSH-2.0-")
    WATCH.check()


async def _peer_attempts(h, key, names):
    refused = 0
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    ca = asyncssh.generate_private_key("ssh-ed25519")
    for name in names:
        cert = ca.generate_user_certificate(stranger, name, principals=[name])
        for keys in ([str(key)], [stranger], [(stranger, cert)]):
            try:
                async with asyncssh.connect(
                    h.address, h.port, username=name, client_keys=keys, known_hosts=None
                ) as conn:
                    await conn.create_process(subsystem="mtgpu-raft")
            except (asyncssh.PermissionDenied, asyncssh.ChannelOpenError):
                refused += 1
    return refused


@fuzz(12)
@given(
    st.one_of(
        st.just("mtgpu-peer.testhost"),
        st.from_regex(r"mtgpu-peer\.[a-z0-9-]{1,12}", fullmatch=True),
        st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True),
    )
)
def test_nothing_without_the_cluster_key_reaches_a_peer_channel(target, name):
    """A tenant's key, a stranger's key, and a certificate from a stranger's CA, for a
    member's user name or any other: no mtgpu-raft channel opens."""
    h, key, _, _ = target
    assert asyncio.run(_peer_attempts(h, key, [name])) == 3
    tally("fuzz_cases", 3)
    tally("attacks_refused", 3)


# --------------------------------------------------------------- job files, from the table

#: Values a hostile tenant tries in any directive: huge and foreign numbers, NaN,
#: long strings, host lists that expand to millions, control characters.
HOSTILE = st.one_of(
    st.sampled_from(
        [
            "9" * 400,
            "9" * 400 + "G",
            "9" * 30 + "s",
            "٣",
            "３G",
            "²G",
            "nan",
            "inf",
            "-1",
            "0",
            "1e9999",
            "a[0-9999999]",
            "a[0-999999999999]",
            "n[1-1024]",
            "x" * 5000,
            "%j" * 200,
            "\x00",
            "\udcfa",
            "0-9999999:1",
            "1-0",
            str(MAX_SIZE * 2),
            "nvidia:" + "9" * 20,
            "unlimited",
            "30m",
            "8",
            "20G",
        ]
    ),
    st.text(max_size=30),
    st.integers(-(2**80), 2**80).map(str),
)


@st.composite
def hostile_job_files(draw) -> str:
    keys = sorted(DIRECTIVES)
    lines = ["#!/bin/sh"]
    for _ in range(draw(st.integers(1, 5))):
        pairs = draw(st.lists(st.tuples(st.sampled_from(keys), HOSTILE), min_size=1, max_size=3))
        prefix = draw(st.sampled_from(["#MTGPU ", "#SBATCH --"]))
        lines.append(prefix + " ".join(f"{k}={v}" for k, v in pairs))
    if draw(st.booleans()):
        lines.append("#MTGPU name=" + "y" * draw(st.sampled_from([5000, 300_000])))
    return "\n".join(lines) + "\ntrue\n"


@fuzz(120)
@given(hostile_job_files(), st.dictionaries(st.sampled_from(sorted(DIRECTIVES)), HOSTILE, max_size=2))
def test_hostile_job_files_through_the_daemon(target, script, overrides):
    """Job files built from the directive table with hostile values: each submission is
    answered (accepted, or refused with a message that is not an internal error)."""
    _, _, _, f = target
    tally("fuzz_cases")
    f.write(
        json.dumps({"op": "job.submit", "args": {"script": script, "overrides": overrides}}).encode() + b"\n"
    )
    f.flush()
    answer = json.loads(f.readline())
    _check(answer)
    if not answer["ok"]:
        assert len(answer["error"]) < 2000, answer["error"][:300]
    else:
        f.write(
            json.dumps({"op": "job.cancel", "args": {"job_ids": [answer["result"]["job_id"]]}}).encode()
            + b"\n"
        )
        f.flush()
        f.readline()
    WATCH.check()


# ------------------------------------------------------------------- SSH session requests

SESSION = st.fixed_dictionaries(
    {
        "command": st.one_of(
            st.none(), st.text(max_size=40), st.just("echo " + "x" * (200 << 10)), st.just("true\0false")
        ),
        "env": st.dictionaries(
            st.one_of(
                st.sampled_from(["LANG", "LC_ALL", "LC_X", "A=B", "TERM"]), st.text(min_size=1, max_size=10)
            ),
            st.one_of(st.text(max_size=20), st.just("v\0"), st.just("z" * (200 << 10))),
            max_size=3,
        ),
        "term": st.one_of(st.none(), st.sampled_from(["xterm", "xterm\0", "\x1b[31m", "x" * 300])),
        "size": st.tuples(
            st.sampled_from([0, 80, 65535, 65536, 100000, 2**32 - 1]), st.sampled_from([0, 24, 65535, 70000])
        ),
        "resize": st.one_of(st.none(), st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))),
        "signal": st.one_of(st.none(), st.sampled_from(["INT", "TERM", "KILL", "NOSUCH"])),
        "subsystem": st.sampled_from([None, None, "mtgpu-api", "sftp", "nosuch"]),
    }
)


async def _session(h, key, req) -> None:
    async with asyncssh.connect(
        h.address, h.port, username="fuzzy", client_keys=[str(key)], known_hosts=None
    ) as conn:
        kw = {"env": req["env"], "encoding": None}
        if req["subsystem"]:
            kw["subsystem"] = req["subsystem"]
        elif req["command"] is not None:
            kw["command"] = req["command"]
        if req["term"] is not None:
            kw.update(term_type=req["term"], term_size=req["size"], request_pty="force")
        try:
            proc = await asyncio.wait_for(conn.create_process(**kw), 30)
        except (asyncssh.ChannelOpenError, asyncssh.Error):
            return
        if req["resize"]:
            proc.change_terminal_size(*req["resize"])
        if req["signal"]:
            proc.send_signal(req["signal"])
        proc.stdin.write_eof()
        try:
            await asyncio.wait_for(proc.wait_closed(), 10)
        except TimeoutError:
            proc.close()
        # The connection itself survives whatever the channel did.
        r = await asyncio.wait_for(conn.run("echo ok"), 30)
        assert r.stdout.strip() == "ok", r


@fuzz(40)
@given(SESSION)
def test_ssh_session_requests_fail_that_request_only(target, req):
    h, key, _, _ = target
    tally("fuzz_cases")
    asyncio.run(_session(h, key, req))
    WATCH.check()
