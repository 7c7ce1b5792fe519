"""A hostile tenant against root's own work: links planted where root writes, PIDs
reused under root's signals, code planted where root's interpreters look, links
swapped under published datasets, rendezvous ports taken first."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
from figures import tally
from mtgpu_testing import Host, python_env
from security_testing import Tenant

pytestmark = pytest.mark.root


#: The host's RENDEZVOUS_PORTS: apart from where crc32(job id) put MASTER_PORT before.
PORTS = (40000 + 256 * (os.getpid() % 64), 40000 + 256 * (os.getpid() % 64) + 255)


@pytest.fixture(scope="module")
def host() -> Iterator[dict]:
    """A host that forwards agents, with a tenant ``mallory``."""
    h = Host(
        {"ALLOW_AGENT_FORWARDING": True, "SIMULATED_CPUS": 2, "RENDEZVOUS_PORTS": f"{PORTS[0]}-{PORTS[1]}"}
    )
    h.start()
    try:
        key = h.add_user("mallory", None)
        r = h.ssh("mallory", key, "true")
        assert r.returncode == 0, r.stderr
        pw = h.passwd("mallory")
        yield {"host": h, "mallory": Tenant("mallory", int(pw[2]), key, Path(pw[5]))}
    finally:
        h.cleanup()


# ------------------------------------------------------------- 1. links


def test_agent_socket_swapped_for_a_link_does_not_give_a_root_file_away(host, tmp_path):
    """With ALLOW_AGENT_FORWARDING, a tenant replaces its forwarded agent's socket by a
    link to a root file, then opens a second session on the same connection (which
    hands out the same socket again): the root file stays root's."""
    h, mal = host["host"], host["mallory"]
    victim = h.dir / "root-only.conf"
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    agent_sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if agent_sock.exists():
                break
            time.sleep(0.05)

        async def attack() -> tuple[str, str]:
            async with asyncssh.connect(
                h.address,
                h.port,
                username="mallory",
                client_keys=[str(mal.key)],
                known_hosts=None,
                agent_path=str(agent_sock),
                agent_forwarding=True,
            ) as conn:
                first = await conn.run(
                    f'echo "$SSH_AUTH_SOCK"; rm -f "$SSH_AUTH_SOCK" 2>&1; '
                    f'ln -s {victim} "$SSH_AUTH_SOCK" 2>&1; true',
                    timeout=30,
                )
                second = await conn.run(
                    'stat -c "%u %a" "$(dirname "$SSH_AUTH_SOCK")" "$SSH_AUTH_SOCK" 2>&1; true', timeout=30
                )
                return str(first.stdout), str(second.stdout)

        first, second = asyncio.run(attack())
    finally:
        agent.terminate()
        agent.wait()
    sock = first.splitlines()[0]
    assert sock, f"no agent was forwarded: {first!r}"
    st = victim.stat()
    tally("attacks_refused" if st.st_uid == 0 else "attacks_succeeded")
    assert (st.st_uid, st.st_gid) == (0, 0), f"the root file was given to mallory: {first} {second}"
    # The socket is the tenant's own, in a directory that stays root's.
    assert second.split() == ["0", "711", str(mal.uid), "600"], second


# ------------------------------------------------------------- 2. pidfds

_RECYCLE = textwrap.dedent("""
    import asyncio, os, signal, subprocess, sys, time
    from mtgpu.gateway.spawn import Spawned, signal_child, use_pidfd_reaping

    def recycle(pid):
        # Alone in this PID namespace: the next fork gets exactly ``pid``.
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
        assert victim.pid == pid, (victim.pid, pid)
        return victim

    async def main():
        proc = await asyncio.create_subprocess_exec("true", start_new_session=True)
        child = Spawned(proc)
        await proc.wait()               # the session's child ended and was reaped
        victim = recycle(proc.pid)      # another process got its PID (and group ID)
        signal_child(child, "KILL")     # the client's late signal request
        time.sleep(0.3)
        print("victim", "alive" if victim.poll() is None else "killed")
        victim.kill()
        victim.wait()

    use_pidfd_reaping()
    asyncio.run(main())
""")


def test_a_signal_request_after_the_child_was_reaped_reaches_no_other_process(tmp_path):
    """The gateway's child ends and is reaped; its PID goes to another process (made
    deterministic in a PID namespace of its own); the client's signal request then
    arrives: the other process lives."""
    script = tmp_path / "recycle.py"
    script.write_text(_RECYCLE)
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    tally("attacks_refused" if "victim alive" in r.stdout else "attacks_succeeded")
    assert "victim alive" in r.stdout, r.stdout + r.stderr


def test_supervisor_and_cgroup_kills_skip_a_pid_reused_after_listing():
    """A job's process list is read, one of its processes ends and its PID is taken by
    another process before the kill: that process is not signalled."""
    from mtgpu.fsafe import signal_members

    victim = subprocess.Popen(["sleep", "30"])
    member = subprocess.Popen(["sleep", "30"])
    try:
        lists = iter([{victim.pid, member.pid}, {member.pid}])  # victim: listed, then not
        n = signal_members(lambda: next(lists), 15)
        assert n == 1
        assert member.wait(10) == -15
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        for p in (victim, member):
            p.kill()
            p.wait()


def test_a_cancel_never_signals_a_process_that_took_the_supervisors_pid():
    """The supervisor's PID record names a process that is gone; the same PID now
    belongs to another process (its start time differs): cancel's SIGUSR1 does not
    reach it."""
    from mtgpu.schedd.runner import boot_id, process_start, signal_record

    other = subprocess.Popen(["sleep", "30"])
    try:
        stale = {"pid": other.pid, "start": (process_start(other.pid) or 0) - 1, "boot_id": boot_id()}
        assert signal_record(stale, 10) is False
        time.sleep(0.2)
        assert other.poll() is None
        live = {**stale, "start": process_start(other.pid)}
        assert signal_record(live, 15) is True
        assert other.wait(10) == -15
    finally:
        other.kill()
        other.wait()


# ------------------------------------------------- 4. isolated interpreters


def _wait_job(h: Host, uid: int, job_id: str, timeout: float = 120) -> dict:
    from security_testing import api_socket, call

    deadline = time.time() + timeout
    while True:
        with api_socket(h.run_dir, uid) as s:
            v = call(s, "job.show", {"job_id": job_id})["result"]
        if v["state"] not in ("PENDING", "RUNNING") or time.time() > deadline:
            return v
        time.sleep(0.3)


def test_code_planted_in_the_admins_directory_is_never_imported_by_root(tmp_path):
    """The admin runs `mtgpu-setup start` from a directory where a tenant planted
    json.py, signal.py and runpy.py (each would leave a mark, then break the import):
    neither the daemon nor its launcher, supervisors or measuring processes import
    them, and the daemon's log is root's alone."""
    from security_testing import api_socket, call

    h = Host({"SIMULATED_CPUS": 2, "USER_DISK_LIMIT": "100G"})
    plant = tmp_path / "plant"
    plant.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(plant, 0o777)
    marker = tmp_path / "imported"
    for mod in ("json", "signal", "runpy"):
        (plant / f"{mod}.py").write_text(
            f"open({str(marker)!r}, 'a').write('{mod}\\n')\nraise ImportError('planted {mod}')\n"
        )
    log = tmp_path / "start.log"
    setup = Path(sys.executable).parent / "mtgpu-setup"
    pid = None
    try:
        start = (
            f"mount --bind {h.etc} /etc && cd {plant} && exec {setup} start "
            f"--config {h.config_path} --log-file {log}"
        )
        r = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", start],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr + (log.read_text() if log.exists() else "")
        pid = int((h.run_dir / "mtgpu.pid").read_text())
        key = h.add_user("ivy", None)
        assert h.ssh("ivy", key, "true").returncode == 0
        uid = int(h.passwd("ivy")[2])
        with api_socket(h.run_dir, uid) as s:
            a = call(s, "job.submit", {"script": "#!/bin/sh\necho ran\n"})
        assert a["ok"], a
        v = _wait_job(h, uid, a["result"]["job_id"])
        assert v["state"] == "COMPLETED", v
    finally:
        if pid is not None:
            os.kill(pid, 15)
            for _ in range(150):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                time.sleep(0.1)
        h.cleanup()
    planted = marker.read_text() if marker.exists() else ""
    tally("attacks_refused" if not planted else "attacks_succeeded")
    assert planted == "", f"root imported the planted {planted.split()}"
    st = log.stat()
    assert st.st_uid == 0 and st.st_mode & 0o077 == 0, oct(st.st_mode)


# ------------------------------------------------------ 5. dataset sources


def _published(h: Host) -> dict:
    return {d["name"]: d for d in h.api("published")["result"]["datasets"]}


def _mounted_at(h: Host, path: str) -> str:
    r = h.in_ns(["findmnt", "-n", "-o", "SOURCE,FSROOT", "--mountpoint", path])
    return r.stdout.strip()


def test_a_dataset_through_a_tenants_directory_is_refused_and_a_swapped_link_is_not_followed(host):
    """One dataset lives in a directory mallory owns, another behind a link in it; a
    third is root's. Mallory swaps both for links to /etc and the admin reloads: the
    first two are refused (naming the key and the component), nothing of /etc is
    bound under /datasets, and the root-owned one is published."""
    h, mal = host["host"], host["mallory"]
    base = h.dir / "data"
    base.mkdir(mode=0o755)
    theirs = base / "mallorys"
    theirs.mkdir(mode=0o755)
    (theirs / "set1").mkdir()
    (theirs / "real2").mkdir()
    (theirs / "set2").symlink_to(theirs / "real2")
    for p in (theirs, theirs / "set1", theirs / "real2"):
        os.chown(p, mal.uid, mal.uid)
    os.lchown(theirs / "set2", mal.uid, mal.uid)
    ours = base / "ours"
    ours.mkdir(mode=0o755)
    (ours / "file").write_text("root's dataset\n")
    h.config["DATASETS_DIRECTORIES"] = [str(theirs / "set1"), str(theirs / "set2"), str(ours)]
    h.write_config()
    os.kill(h._server_pid(), signal.SIGHUP)

    def settled() -> dict:
        deadline = time.time() + 30
        while time.time() < deadline:
            p = _published(h)
            if {"set1", "set2", "ours"} <= set(p):
                return p
            time.sleep(0.2)
        raise AssertionError(f"the reload did not happen: {_published(h)}")

    p = settled()
    assert p["ours"]["ok"], p["ours"]
    for name in ("set1", "set2"):
        assert not p[name]["ok"], p[name]
        assert "DATASETS_DIRECTORIES" in p[name]["problem"], p[name]
        assert f"{theirs} is owned by UID {mal.uid}" in p[name]["problem"], p[name]
    # The swap: both become links to /etc, then the admin reloads.
    r = h.ssh(
        "mallory",
        mal.key,
        f"rm -rf {theirs}/set1 {theirs}/set2 && ln -s /etc {theirs}/set1 "
        f"&& ln -s /etc {theirs}/set2 && echo swapped",
    )
    assert r.stdout.strip() == b"swapped", r.stderr
    before = h.log_path.read_text(errors="replace").count("not published: dataset set1")
    os.kill(h._server_pid(), signal.SIGHUP)
    deadline = time.time() + 30
    while (
        h.log_path.read_text(errors="replace").count("not published: dataset set1") == before
        and time.time() < deadline
    ):
        time.sleep(0.2)
    p = settled()
    tally("attacks_refused" if not (p["set1"]["ok"] or p["set2"]["ok"]) else "attacks_succeeded")
    assert not p["set1"]["ok"] and not p["set2"]["ok"]
    for name in ("set1", "set2"):
        assert _mounted_at(h, f"/datasets/{name}") == ""
    assert "/etc" not in _mounted_at(h, "/datasets/ours")
    r = h.ssh("mallory", mal.key, "cat /datasets/ours/file")
    assert r.stdout == b"root's dataset\n", r.stderr


# --------------------------------------------------- 6. rendezvous ports

_BIND_ALL_BUT = """
import socket, sys, time
first, last, spare = map(int, sys.argv[1:4])
held = []
for p in range(first, last + 1):
    if p != spare:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            s.listen()
            held.append(s)
        except OSError:
            pass
print(len(held), flush=True)
time.sleep(120)
"""


def test_rendezvous_ports_are_drawn_from_the_range_and_a_tenants_port_is_skipped(host):
    """Mallory listens on every port of RENDEZVOUS_PORTS but one; the jobs started
    meanwhile get that one port, which is neither taken nor the old crc32 formula's."""
    import zlib

    from security_testing import api_socket, call

    h, mal = host["host"], host["mallory"]
    spare = PORTS[0] + 1 + os.getpid() % 250
    binder = subprocess.Popen(
        h.ssh_argv(
            "mallory",
            mal.key,
            "/usr/bin/python3",
            "-c",
            f"'{_BIND_ALL_BUT}'",
            str(PORTS[0]),
            str(PORTS[1]),
            str(spare),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        held = int(binder.stdout.readline() or 0)
        assert held > 200, binder.stderr.read() if binder.poll() is not None else held
        got = {}
        with api_socket(h.run_dir, mal.uid) as s:
            for _ in range(2):
                a = call(s, "job.submit", {"script": "#!/bin/sh\necho $MASTER_PORT $MTGPU_RDZV_ENDPOINT\n"})
                assert a["ok"], a
                got[a["result"]["job_id"]] = None
        for jid in got:
            v = _wait_job(h, mal.uid, jid)
            assert v["state"] == "COMPLETED", v
            got[jid] = Path(v["stdout"]).read_text().split()
    finally:
        binder.kill()
        binder.wait()
    for jid, (port, endpoint) in got.items():
        tally("attacks_refused" if int(port) == spare else "attacks_succeeded")
        assert int(port) == spare, (jid, port, spare)
        assert endpoint == f"127.0.0.1:{spare}"
        assert int(port) != 29500 + zlib.crc32(jid.encode()) % 10000


# ------------------------------------------------- terminals of admins


def test_control_characters_a_tenant_chose_never_reach_an_admins_terminal(host):
    """A job named with terminal escapes (retitle, clear the screen, rewrite the line)
    and an output path with them: `mtgpu-admin jobs` and `mt-job show` print them
    escaped, never raw; --json keeps the name exact."""
    from security_testing import api_socket, call

    h, mal = host["host"], host["mallory"]
    evil = "x\x1b]0;owned\x07\x1b[2J\x08\x08hidden\u202e"
    script = f"#!/bin/sh\n#MTGPU name={evil}\n#MTGPU output=/nonexistent/\x1b[31mred\nexit 0\n"
    with api_socket(h.run_dir, mal.uid) as s:
        a = call(s, "job.submit", {"script": script})
    assert a["ok"], a
    jid = a["result"]["job_id"]
    v = _wait_job(h, mal.uid, jid)
    assert v["name"] == evil
    outputs = [h.admin("jobs").stdout]
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.cli.job", "--config", str(h.config_path), "show", jid],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
        check=False,
    )
    outputs += [r.stdout, r.stderr]
    shown = "".join(outputs)
    assert "owned" in shown, shown  # the name is there...
    bad = [c for c in shown if c in "\x1b\x07\x08\u202e"]
    tally("attacks_refused" if not bad else "attacks_succeeded")
    assert not bad, repr(shown)  # ...but no escape reaches the terminal raw
    assert "\\x1b]0;owned\\x07" in shown
    j = subprocess.run(
        [sys.executable, "-m", "mtgpu.cli.job", "--config", str(h.config_path), "show", jid, "--json"],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
        check=False,
    )
    import json

    assert json.loads(j.stdout)["name"] == evil
