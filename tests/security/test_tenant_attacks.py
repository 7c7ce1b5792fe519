"""A tenant with a valid account attacks another tenant, the daemon and the host.

Each attack is made at the lowest layer it reaches (raw API lines on the Unix socket
and the mtgpu-api subsystem, raw SSH requests, plain shell commands as the tenant)
and must be refused without harm: the victim's files, jobs and processes are
checked afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import asyncssh
import pytest
from figures import tally
from mtgpu_testing import wait_for
from security_testing import api_socket, call

pytestmark = pytest.mark.root

SLEEPER = "#!/bin/sh\n#MTGPU cpus=1 name=victim\nsleep 300\n"


def _wait(pred, timeout=30, what="condition"):
    return wait_for(pred, timeout, what, interval=0.1)


def _job(host, tenant, jid):
    with api_socket(host.run_dir, tenant.uid) as s:
        return call(s, "job.show", {"job_id": jid})["result"]


@pytest.fixture(scope="module")
def victim(arena):
    """Alice's private things: a file, podman storage, a tmux server, a running job
    and its log."""
    h, alice = arena["host"], arena["alice"]
    r = h.ssh(
        "alice",
        alice.key,
        "echo s3cret > ~/secret.txt && "
        "mkdir -p ~/.local/share/containers/storage && echo layer > "
        "~/.local/share/containers/storage/layer && tmux -L mtgpu new -d sleep 300 && "
        "echo ok",
    )
    assert r.stdout.strip() == b"ok", r.stderr
    with api_socket(h.run_dir, alice.uid) as s:
        a = call(s, "job.submit", {"script": "#!/bin/sh\n#MTGPU cpus=1\necho the-log; sleep 300\n"})
    assert a["ok"], a
    jid = a["result"]["job_id"]
    _wait(lambda: _job(h, alice, jid)["state"] == "RUNNING", what="alice's job to run")
    job = _job(h, alice, jid)
    _wait(
        lambda: Path(job["stdout"]).exists() and b"the-log" in Path(job["stdout"]).read_bytes(),
        what="the job's log",
    )
    pid = _wait(
        lambda: h.ssh("alice", alice.key, "pgrep -u alice -x sleep -n").stdout.strip(),
        what="alice's processes",
    )
    return {"job_id": jid, "job": job, "pid": int(pid.split()[-1])}


def _intact(h, alice, victim):
    assert (alice.home / "secret.txt").read_text() == "s3cret\n"
    assert _job(h, alice, victim["job_id"])["state"] == "RUNNING"
    os.kill(victim["pid"], 0)  # still alive


# ----------------------------------------------------------- files and processes


def test_another_tenants_files_processes_and_tmux_are_out_of_reach(arena, victim):
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    home = alice.home
    probes = {
        "read home file": f"cat {home}/secret.txt",
        "list home": f"ls {home}",
        "read job log": f"cat {victim['job']['stdout']}",
        "read podman storage": f"cat {home}/.local/share/containers/storage/layer",
        "tmux socket": f"tmux -S {h.run_dir}/tmux/tmux-{alice.uid}/mtgpu list-sessions",
        "tmux socket dir": f"ls {h.run_dir}/tmux/tmux-{alice.uid}",
        "write home": f"touch {home}/pwned",
        "process environ": f"cat /proc/{victim['pid']}/environ",
        "process cwd": f"ls /proc/{victim['pid']}/cwd/",
        "process memory": f"head -c1 /proc/{victim['pid']}/mem",
        "SIGTERM": f"kill -TERM {victim['pid']}",
        "SIGKILL": f"kill -KILL {victim['pid']}",
        "SIGSTOP": f"kill -STOP {victim['pid']}",
        "job state dir": f"ls {h.state_dir}/jobs/{victim['job_id']}",
        "state journal": f"head -c1 {h.state_dir}/raft.journal",
        "host key": f"head -c1 {h.state_dir}/ssh_host_ed25519_key",
        "shadow": "head -c1 /etc/shadow",
    }
    script = "".join(
        f"if {cmd} >/dev/null 2>&1; then echo 'LEAK {name}'; else echo 'DENIED {name}'; fi\n"
        for name, cmd in probes.items()
    )
    r = h.ssh("mallory", mal.key, "sh", input=script.encode())
    out = r.stdout.decode()
    assert "LEAK" not in out, out
    assert out.count("DENIED") == len(probes), out + r.stderr.decode()
    tally("attacks_refused", len(probes))
    assert not (home / "pwned").exists()
    _intact(h, alice, victim)


# ------------------------------------------------------------ the API, raw


def test_forged_caller_on_the_unix_socket_is_ignored(arena, victim):
    """SO_PEERCRED names the caller; whatever the request claims is not believed."""
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    forged = {
        "caller": {"name": "alice", "uid": alice.uid, "admin": True},
        "uid": alice.uid,
        "user": "alice",
        "as": "alice",
        "via": "peer",
    }
    jid = victim["job_id"]
    with api_socket(h.run_dir, mal.uid) as s:
        who = call(s, "whoami", {"user": "alice", "uid": alice.uid}, **forged)
        assert who["ok"] and who["result"]["name"] == "mallory", who
        attempts = [
            call(s, "job.cancel", {"job_ids": [jid], "user": "alice"}, **forged),
            call(s, "job.cancel", {"job_ids": [int(jid), f"{jid}_0", f" {jid}"]}, **forged),
            call(s, "job.show", {"job_id": jid}, **forged),
        ]
        listing = call(s, "job.list", {"all": True, "user": "alice"}, **forged)
    for a in attempts:
        assert not a["ok"] and a["code"] == "not_found", a
    assert listing["ok"] and listing["result"] == [], listing
    tally("attacks_refused", len(attempts) + 2)
    _intact(h, alice, victim)


def test_admin_and_peer_verbs_are_refused_to_a_tenant(arena, victim):
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    with api_socket(h.run_dir, 0) as s:
        every = set(call(s, "no.such.op")["error"].split("known: ")[1].split(", "))
    with api_socket(h.run_dir, mal.uid) as s:
        tenant_ops = set(call(s, "no.such.op")["error"].split("known: ")[1].split(", "))
        admin_ops = sorted(every - tenant_ops)
        assert {"user.add", "user.remove", "invite", "node.drain", "audit", "logs"} <= set(admin_ops)
        args = {
            "name": "mallory",
            "key": "ssh-ed25519 AAAA",
            "admin": True,
            "node": "testhost",
            "job_ids": [victim["job_id"]],
            "dry_run": False,
        }
        answers = [call(s, op, args) for op in admin_ops]
        # Verbs only other members may use: not served to a tenant at all.
        peer = [
            call(
                s,
                op,
                {
                    "op": "job.cancel",
                    "caller": {"name": "alice", "uid": alice.uid, "admin": True},
                    "args": {"job_ids": [victim["job_id"]]},
                },
            )
            for op in ("forward", "job.dispatch", "retention.member")
        ]
    for op, a in zip(admin_ops, answers):
        assert not a["ok"] and a["code"] == "forbidden", (op, a)
    for a in peer:
        assert not a["ok"] and a["code"] in ("forbidden", "unknown_op"), a
    tally("attacks_refused", len(answers) + len(peer))
    assert h.passwd("mallory") is not None
    _intact(h, alice, victim)


def test_system_accounts_and_nobody_are_refused(arena):
    """``nobody`` is shared by unprivileged daemons: it must not submit jobs."""
    h = arena["host"]
    for uid in (65534, 1, 999):
        with api_socket(h.run_dir, uid) as s:
            a = call(s, "job.submit", {"script": "#!/bin/sh\ntrue\n"})
        assert not a["ok"] and a["code"] == "unknown_user", (uid, a)
        tally("attacks_refused")


async def _subsystem_requests(h, tenant, requests):
    async with asyncssh.connect(
        h.address, h.port, username=tenant.name, client_keys=[str(tenant.key)], known_hosts=None
    ) as conn:
        proc = await conn.create_process(subsystem="mtgpu-api", encoding=None)
        out = []
        for r in requests:
            proc.stdin.write((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n")
            out.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)))
        proc.stdin.write_eof()
        return out


def test_the_mtgpu_api_subsystem_answers_as_the_ssh_login(arena, victim):
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    forged = {"caller": {"name": "alice", "uid": alice.uid, "admin": True}, "via": "peer"}
    answers = asyncio.run(
        _subsystem_requests(
            h,
            mal,
            [
                {"op": "whoami", **forged},
                {"op": "job.cancel", "args": {"job_ids": [victim["job_id"]]}, **forged},
                {"op": "job.show", "args": {"job_id": victim["job_id"]}, **forged},
                {"op": "user.add", "args": {"name": "eve", "key": "x", "admin": True}, **forged},
                {
                    "op": "forward",
                    "args": {
                        "op": "job.cancel",
                        "caller": forged["caller"],
                        "args": {"job_ids": [victim["job_id"]]},
                    },
                },
            ],
        )
    )
    assert answers[0]["result"]["name"] == "mallory"
    assert [a["code"] for a in answers[1:]] == ["not_found", "not_found", "forbidden", answers[4]["code"]]
    assert answers[4]["code"] in ("forbidden", "unknown_op")
    assert not any(a["ok"] for a in answers[1:])
    tally("attacks_refused", 4)
    _intact(h, alice, victim)


# ------------------------------------------------------------- raw SSH requests


async def _raw_ssh(h, mal, alice, victim):
    """Every refused request, as (what, refused?)."""
    results = []
    async with asyncssh.connect(
        h.address, h.port, username=mal.name, client_keys=[str(mal.key)], known_hosts=None
    ) as conn:
        for sub in ("mtgpu-peer", "mtgpu-raft", "mtgpu-image"):
            try:
                proc = await conn.create_process(subsystem=sub, encoding=None)
                proc.stdin.write(b'{"op": "job.cancel", "args": {"job_ids": ["1"]}}\n')
                got = await asyncio.wait_for(proc.stdout.read(100), 10)
                results.append((f"subsystem {sub}", not got))
            except asyncssh.ChannelOpenError:
                results.append((f"subsystem {sub}", True))
        for dest in (
            "10.213.0.1",
            "192.0.2.1",
            "127.1",
            "0.0.0.0",
            "::ffff:127.0.0.1",
            "169.254.169.254",
            "example.com",
            h.address + ".evil",
        ):
            try:
                r, w = await conn.open_connection(dest, 22)
                w.close()
                results.append((f"forward to {dest}", False))
            except asyncssh.ChannelOpenError:
                results.append((f"forward to {dest}", True))
        for bind, port in (
            ("127.0.0.1", 80),
            ("127.0.0.1", 22),
            ("0.0.0.0", 0),
            ("", 443),
            ("10.213.0.1", 0),
        ):
            try:
                listener = await conn.forward_remote_port(bind, port, "127.0.0.1", 9)
                listener.close()
                results.append((f"remote forward {bind}:{port}", False))
            except asyncssh.ChannelListenError:
                results.append((f"remote forward {bind}:{port}", True))
        link = mal.home / "alice-tmux"
        for path in (
            f"{h.run_dir}/tmux/tmux-{alice.uid}/mtgpu",
            str(h.run_dir / "api.sock"),
            str(link),
            f"{alice.home}/secret.txt",
        ):
            try:
                r, w = await conn.open_unix_connection(path)
                w.close()
                results.append((f"unix forward to {path}", False))
            except asyncssh.ChannelOpenError:
                results.append((f"unix forward to {path}", True))
        try:
            listener = await conn.forward_remote_path(str(mal.home / "l.sock"), "/tmp/x")
            listener.close()
            results.append(("remote unix forward", False))
        except asyncssh.ChannelListenError:
            results.append(("remote unix forward", True))
        r = await conn.run(
            'echo "[$LD_PRELOAD][$LD_LIBRARY_PATH][$PYTHONPATH]"',
            env={"LD_PRELOAD": "/tmp/evil.so", "LD_LIBRARY_PATH": "/tmp", "PYTHONPATH": "/tmp"},
        )
        results.append(("environment injection", r.stdout.strip() == "[][][]"))
    # A member's user name, with a tenant's key: only a cluster certificate may use it.
    try:
        async with asyncssh.connect(
            h.address, h.port, username="mtgpu-peer.testhost", client_keys=[str(mal.key)], known_hosts=None
        ) as conn:
            results.append(("log in as a member", False))
    except asyncssh.PermissionDenied:
        results.append(("log in as a member", True))
    return results


def test_raw_ssh_requests_beyond_the_tenants_rights_are_refused(arena, victim):
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    link = mal.home / "alice-tmux"
    r = h.ssh("mallory", mal.key, f"ln -sf {h.run_dir}/tmux/tmux-{alice.uid}/mtgpu {link}")
    assert r.returncode == 0
    results = asyncio.run(_raw_ssh(h, mal, alice, victim))
    allowed = [what for what, refused in results if not refused]
    assert not allowed, allowed
    tally("attacks_refused", len(results))
    _intact(h, alice, victim)


async def _unix_refusals(h, mal, paths):
    reasons = []
    async with asyncssh.connect(
        h.address, h.port, username=mal.name, client_keys=[str(mal.key)], known_hosts=None
    ) as conn:
        for path in paths:
            try:
                r, w = await conn.open_unix_connection(path)
                w.close()
                reasons.append(None)
            except asyncssh.ChannelOpenError as exc:
                reasons.append(exc.reason.replace(path, "PATH"))
    return reasons


def test_unix_forwarding_does_not_tell_what_exists_in_another_home(arena, victim):
    """The daemon resolves the path as root: its refusal must be the same for a file
    that exists in a home the tenant cannot read and for one that does not."""
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    reasons = asyncio.run(
        _unix_refusals(
            h, mal, [f"{alice.home}/secret.txt", f"{alice.home}/no-such-file", f"{alice.home}/.local/share"]
        )
    )
    assert None not in reasons and len(set(reasons)) == 1, reasons
    tally("attacks_refused", 3)
