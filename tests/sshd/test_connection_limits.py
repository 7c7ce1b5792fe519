"""One tenant cannot exhaust the daemon: connections, sessions, forwards and API-socket
connections are capped per user, refused past the cap with the limit named, while
another tenant still gets in; and a flood does not flood the log."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time

import asyncssh
import pytest
from figures import tally
from mtgpu_testing import wait_for
from security_testing import api_socket, call

pytestmark = pytest.mark.root

LISTENER = (
    'exec /usr/bin/python3 -c "import socket,time; s=socket.socket(); '
    "s.bind(('127.0.0.1',0)); s.listen(64); print(s.getsockname()[1], flush=True); "
    'time.sleep(120)"'
)


def _sleeps_of(uid: int) -> int:
    r = subprocess.run(
        ["pgrep", "-c", "-u", str(uid), "-x", "sleep"], check=False, capture_output=True, text=True
    )
    return int(r.stdout.strip() or 0)


def test_a_tenant_past_its_connection_limit_is_refused_while_another_logs_in(make_host):
    host = make_host({"SSH_MAX_CONNECTIONS_PER_USER": 3})
    hog, calm = host.add_user("hog"), host.add_user("calm")
    assert host.ssh("hog", hog, "true").returncode == 0
    uid = int(host.passwd("hog")[2])
    held = [
        subprocess.Popen(
            host.ssh_argv("hog", hog, "sleep 120"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    try:
        wait_for(lambda: _sleeps_of(uid) == 3, 60, "three held connections")
        r = host.ssh("hog", hog, "true")
        assert r.returncode == 255
        assert b"too many connections of hog" in r.stderr
        assert b"SSH_MAX_CONNECTIONS_PER_USER is 3" in r.stderr
        tally("attacks_refused")
        r = host.ssh("calm", calm, "id -un")
        assert r.returncode == 0 and r.stdout.strip() == b"calm", r.stderr
    finally:
        for p in held:
            p.kill()
            p.wait()
    # The counts are given back when the connections end.
    wait_for(lambda: host.ssh("hog", hog, "true").returncode == 0, 30, "hog to get in again")


async def _sessions_and_forwards(host, key):
    async with asyncssh.connect(
        host.address, host.port, username="hog", client_keys=[str(key)], known_hosts=None
    ) as conn:
        listener = await conn.create_process(LISTENER)
        port = int(await asyncio.wait_for(listener.stdout.readline(), 30))
        sleeper = await conn.create_process("sleep 120")
        with pytest.raises(asyncssh.ChannelOpenError, match="SSH_MAX_SESSIONS_PER_USER is 2"):
            await conn.create_process("true")
        sleeper.close()
        await sleeper.wait_closed()
        done = await asyncio.wait_for(conn.run("echo again"), 30)  # the count came back
        assert done.stdout == "again\n"
        forwards = [await conn.open_connection("127.0.0.1", port) for _ in range(2)]
        with pytest.raises(asyncssh.ChannelOpenError, match="SSH_MAX_FORWARDS_PER_USER is 2"):
            await conn.open_connection("127.0.0.1", port)
        forwards[0][1].close()
        await asyncio.sleep(0.5)
        again = await conn.open_connection("127.0.0.1", port)
        again[1].close()
        listener.close()


def test_sessions_and_forwards_per_user_are_capped(make_host):
    host = make_host({"SSH_MAX_SESSIONS_PER_USER": 2, "SSH_MAX_FORWARDS_PER_USER": 2})
    key = host.add_user("hog")
    asyncio.run(_sessions_and_forwards(host, key))
    tally("attacks_refused", 2)
    assert "SSH_MAX_SESSIONS_PER_USER" in host.log_path.read_text()


def test_an_api_connection_flood_is_refused_by_uid_and_the_log_stays_short(make_host):
    host = make_host({"API_MAX_CONNECTIONS_PER_USER": 5})
    hog, calm = host.add_user("hog"), host.add_user("calm")
    for name, key in (("hog", hog), ("calm", calm)):
        assert host.ssh(name, key, "true").returncode == 0
    hog_uid, calm_uid = int(host.passwd("hog")[2]), int(host.passwd("calm")[2])
    held = [api_socket(host.run_dir, hog_uid) for _ in range(5)]
    try:
        for s in held:
            assert call(s, "whoami")["ok"]
        with api_socket(host.run_dir, hog_uid) as s:
            a = call(s, "whoami")
        assert not a["ok"] and a["code"] == "too_many_connections", a
        assert "API_MAX_CONNECTIONS_PER_USER is 5" in a["error"]
        lines_before = host.log_path.read_text().count("\n")
        flood = 3000
        for _ in range(flood):
            try:
                api_socket(host.run_dir, hog_uid).close()
            except BlockingIOError:  # the listen backlog is full: the daemon is behind
                time.sleep(0.01)
        tally("attacks_refused", flood)
        with api_socket(host.run_dir, calm_uid) as s:
            assert call(s, "whoami")["result"]["name"] == "calm"
        # The daemon is still answering; the flood left a few lines, not thousands.
        wait_for(lambda: "more like this are counted" in host.log_path.read_text(), 30, "the summary line")
        grown = host.log_path.read_text().count("\n") - lines_before
        assert grown < 100, f"the log grew by {grown} lines for {flood} refused connections"
    finally:
        for s in held:
            s.close()
    wait_for(lambda: _whoami(host, hog_uid)["ok"], 10, "hog's API again")  # counts given back


def _whoami(host, uid: int) -> dict:
    with api_socket(host.run_dir, uid) as s:
        return call(s, "whoami")


def test_connections_past_the_per_source_limit_are_told_the_limit(make_host):
    host = make_host({"SSH_MAX_CONNECTIONS_PER_SOURCE": 3})
    key = host.add_user("near")
    time.sleep(1)  # let the daemon see the start-up probe's connection go
    held = [socket.create_connection(("127.0.0.1", host.port), timeout=10) for _ in range(3)]
    try:
        for s in held:
            assert s.recv(100).startswith(b"SSH-2.0-")
        r = host.ssh("near", key, "true")
        assert r.returncode == 255
        assert b"SSH_MAX_CONNECTIONS_PER_SOURCE is 3" in r.stderr, r.stderr
        tally("attacks_refused")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: host.ssh("near", key, "true").returncode == 0, 30, "logins to come back")
