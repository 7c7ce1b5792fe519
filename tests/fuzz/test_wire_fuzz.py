"""Malformed API messages (the Unix socket and the mtgpu-api subsystem) and SSH-level
garbage against one real daemon: every message gets a clear answer, garbage gets
the connection closed, and the daemon never falls over. Nothing without the
cluster's key (a tenant, a stranger) reaches the peer channels."""

from __future__ import annotations

import asyncio
import json
import socket

import asyncssh
import pytest
from figures import tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mtgpu_testing import Host
from security_testing import api_socket

pytestmark = pytest.mark.root

OPS = ["job.submit", "job.list", "job.show", "job.cancel", "nodes", "whoami", "version",
       "workspace.create", "workspace.list", "workspace.show", "workspace.rm", "workspace.policy",
       "user.add", "invite", "usage", "forward", "job.dispatch", "retention.member", "", "x" * 500]
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
              st.text(max_size=40)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)
ARGS = st.dictionaries(st.sampled_from(["script", "job_id", "job_ids", "all", "user", "workdir",
                                        "overrides", "token", "name", "image", "reason"]),
                       JSON, max_size=4)
REQUESTS = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(OPS), "args": ARGS}, optional={"id": JSON}),
    st.fixed_dictionaries({"op": JSON}, optional={"args": JSON, "id": JSON}),
    JSON)


def fuzz(cases: int) -> settings:
    return settings(max_examples=cases, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def target():
    h = Host({"SIMULATED_CPUS": 1, "USER_SUBMIT_RATE": 1000, "USER_SUBMIT_BURST": 1000})
    h.start()
    key = h.add_user("fuzzy")
    assert h.ssh("fuzzy", key, "true").returncode == 0
    uid = int(h.passwd("fuzzy")[2])
    sock = api_socket(h.run_dir, uid)
    yield h, key, uid, sock.makefile("rwb")
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
    h, _, _, f = target
    tally("fuzz_cases")
    f.write(json.dumps(request).encode() + b"\n")
    f.flush()
    _check(json.loads(f.readline()))


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
    async with asyncssh.connect(h.address, h.port, username="fuzzy", client_keys=[str(key)],
                                known_hosts=None) as conn:
        proc = await conn.create_process(subsystem="mtgpu-api", encoding=None)
        out = []
        for r in requests:
            proc.stdin.write(r + b"\n")
            out.append(await asyncio.wait_for(proc.stdout.readline(), 30))
        return out


@fuzz(1)
@given(st.lists(st.one_of(REQUESTS.map(lambda r: json.dumps(r).encode()),
                          st.binary(min_size=1, max_size=200).filter(
                              lambda b: b"\n" not in b and b.strip())),
                min_size=150, max_size=150))
def test_api_messages_on_the_mtgpu_api_subsystem(target, batch):
    """One SSH session, a batch of requests and garbage lines on it."""
    h, key, _, _ = target
    answers = asyncio.run(_subsystem(h, key, batch))
    for line in answers:
        _check(json.loads(line))
    tally("fuzz_cases", len(batch))


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
    assert h.proc.poll() is None


async def _peer_attempts(h, key, names):
    refused = 0
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    ca = asyncssh.generate_private_key("ssh-ed25519")
    for name in names:
        cert = ca.generate_user_certificate(stranger, name, principals=[name])
        for keys in ([str(key)], [stranger], [(stranger, cert)]):
            try:
                async with asyncssh.connect(h.address, h.port, username=name, client_keys=keys,
                                            known_hosts=None) as conn:
                    await conn.create_process(subsystem="mtgpu-raft")
            except (asyncssh.PermissionDenied, asyncssh.ChannelOpenError):
                refused += 1
    return refused


@fuzz(12)
@given(st.one_of(st.just("mtgpu-peer.testhost"),
                 st.from_regex(r"mtgpu-peer\.[a-z0-9-]{1,12}", fullmatch=True),
                 st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)))
def test_nothing_without_the_cluster_key_reaches_a_peer_channel(target, name):
    """A tenant's key, a stranger's key, and a certificate from a stranger's CA, for a
    member's user name or any other: no mtgpu-raft channel opens."""
    h, key, _, _ = target
    assert asyncio.run(_peer_attempts(h, key, [name])) == 3
    tally("fuzz_cases", 3)
    tally("attacks_refused", 3)
