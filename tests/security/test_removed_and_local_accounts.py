"""A removed tenant keeps nothing; local accounts get in only as LOCAL_ACCOUNTS says.

Real daemons, real accounts in the host's own /etc, the real OpenSSH client. The
removed tenant plants keys in its ``~/.ssh/authorized_keys`` and leaves processes and
jobs behind before it is removed, as an ex-employee who expects to come back would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import asyncssh
import psutil
import pytest
from figures import tally
from mtgpu_testing import wait_for
from security_testing import api_socket, call

pytestmark = pytest.mark.root

SLEEPER = "#!/bin/sh\n#MTGPU cpus=1 name=stay\nsleep 600\n"


def _procs_of(uid: int) -> list[int]:
    return [
        p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] is not None and uid in p.info["uids"]
    ]


def _shadow(host, name: str) -> list[str]:
    for line in (host.etc / "shadow").read_text().splitlines():
        if line.split(":")[0] == name:
            return line.split(":")
    raise AssertionError(f"{name} has no shadow entry")


def test_removed_tenant_is_locked_out_with_its_processes_and_jobs_ended(make_host):
    host = make_host({"SIMULATED_CPUS": 4})
    key = host.add_user("leaver")
    planted = host.key("leaver-planted")
    pub = Path(str(planted) + ".pub").read_text()
    # The tenant plants a key of its own, starts a tmux server and a detached
    # process, and leaves a running job and a pending one.
    r = host.ssh(
        "leaver",
        key,
        "mkdir -p ~/.ssh && chmod 700 ~/.ssh && "
        f"echo '{pub.strip()}' >> ~/.ssh/authorized_keys && "
        "tmux -L stay new -d sleep 600 && (setsid sleep 600 >/dev/null 2>&1 &) && "
        "echo ok",
    )
    assert r.stdout.strip() == b"ok", r.stderr
    uid = int(host.passwd("leaver")[2])
    with api_socket(host.run_dir, uid) as s:
        running = call(s, "job.submit", {"script": SLEEPER})["result"]["job_id"]
        pending = call(s, "job.submit", {"script": SLEEPER.replace("cpus=1", "cpus=4")})
    pending = pending["result"]["job_id"]
    wait_for(
        lambda: host.api("job.show", job_id=running)["result"]["state"] == "RUNNING", 60, "the job to run"
    )
    wait_for(lambda: len(_procs_of(uid)) >= 3, 30, "the tenant's processes")

    out = json.loads(host.admin("user", "remove", "leaver", "--json").stdout)
    assert sorted(out["jobs_cancelled"]) == sorted([running, pending])

    # Refused at authentication with either key, although the account, its home and
    # its authorized_keys are still there.
    for k in (key, planted):
        r = host.ssh("leaver", k, "id")
        assert r.returncode == 255 and b"Permission denied" in r.stderr, r.stderr
        tally("attacks_refused")
    assert "was removed from MTGPU" in host.log_path.read_text()
    # The OS account is locked as OpenSSH, su and cron understand it.
    pw, sh = host.passwd("leaver"), _shadow(host, "leaver")
    assert pw[6].endswith(("nologin", "false")) and sh[1].startswith("!") and sh[7] == "1"
    # Nothing of it runs any more, and its jobs are cancelled.
    wait_for(lambda: not _procs_of(uid), 30, "the removed tenant's processes to end")
    for jid in (running, pending):
        wait_for(
            lambda jid=jid: host.api("job.show", job_id=jid)["result"]["state"] == "CANCELLED",
            60,
            f"job {jid} to be cancelled",
        )
    # The API socket refuses its UID too.
    with api_socket(host.run_dir, uid) as s:
        a = call(s, "job.submit", {"script": SLEEPER})
    assert not a["ok"] and "removed from MTGPU" in a["error"], a
    tally("attacks_refused")


class _Client(asyncssh.SSHClient):
    lost: Exception | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc


async def _session_until_removed(host, key):
    conn, client = await asyncssh.create_connection(
        _Client, host.address, host.port, username="talker", client_keys=[str(key)], known_hosts=None
    )
    async with conn:
        await conn.create_process("sleep 600")
        uid = int(host.passwd("talker")[2])
        await asyncio.to_thread(wait_for, lambda: _procs_of(uid), 30, "the session to start")
        out = await asyncio.to_thread(host.admin, "user", "remove", "talker", "--json")
        await asyncio.wait_for(conn.wait_closed(), 30)
    return json.loads(out.stdout), client.lost


def test_removal_closes_the_tenants_live_ssh_session(make_host):
    host = make_host()
    key = host.add_user("talker")
    assert host.ssh("talker", key, "true").returncode == 0
    out, lost = asyncio.run(_session_until_removed(host, key))
    assert sum(m["ssh_connections_closed"] for m in out["members"].values()) == 1
    assert isinstance(lost, asyncssh.DisconnectError), lost
    assert "talker was removed from MTGPU" in lost.reason


def _local_account(host, name: str) -> int:
    home = host.dir / "localhome" / name
    r = host.in_ns(["useradd", "-m", "-d", str(home), "-s", "/bin/sh", name])
    assert r.returncode == 0, r.stderr
    (host.dir / "localhome").chmod(0o755)
    uid = int(host.passwd(name)[2])
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(host.pubkey(name) + "\n")
    for p in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(p, uid, uid)
    return uid


def _reload(host, **config) -> None:
    host.config.update(config)
    host.write_config()
    before = host.log_path.read_text().count("configuration reloaded")
    os.kill(host._server_pid(), signal.SIGHUP)
    wait_for(lambda: host.log_path.read_text().count("configuration reloaded") > before, 30, "the reload")


def _logs_in(host, name: str) -> bool:
    r = host.ssh(name, host.key(name), "id -un")
    return r.returncode == 0 and r.stdout.strip() == name.encode()


def _api_ok(host, uid: int) -> bool:
    with api_socket(host.run_dir, uid) as s:
        return call(s, "whoami")["ok"]


def test_local_accounts_allow_admins_and_deny(make_host):
    host = make_host({"ADMINS": ["boss"]})
    olga, boss = _local_account(host, "olga"), _local_account(host, "boss")
    expected = {"allow": (True, True), "admins": (False, True), "deny": (False, False)}
    for policy, (olga_in, boss_in) in expected.items():
        _reload(host, LOCAL_ACCOUNTS=policy)
        assert _logs_in(host, "olga") == olga_in, policy
        assert _logs_in(host, "boss") == boss_in, policy
        assert _api_ok(host, olga) == olga_in and _api_ok(host, boss) == boss_in, policy
        if not olga_in:
            tally("attacks_refused")
    assert "LOCAL_ACCOUNTS is deny" in host.log_path.read_text()


def test_grants_apply_to_local_accounts(make_host):
    """mtcode-admin's grant and revoke (user.import, user.revoke) decide for a local
    account as for a tenant."""
    host = make_host({"LOCAL_ACCOUNTS": "admins"})
    uid = _local_account(host, "carl")
    assert not _logs_in(host, "carl")
    shown = host.api("user.show", name="carl")["result"]
    assert shown["local"] and not shown["granted"] and shown["uid"] == uid
    r = host.api("user.import", name="carl", uid=uid, keys=[], grant=True)
    assert r["ok"] and r["result"]["local"], r
    assert _logs_in(host, "carl") and _api_ok(host, uid)
    assert host.api("user.revoke", name="carl")["ok"]
    _reload(host, LOCAL_ACCOUNTS="allow")
    # Revoked stays revoked, even where every local account is allowed.
    r = host.ssh("carl", host.key("carl"), "true")
    assert r.returncode == 255
    assert not _api_ok(host, uid)
    assert "not granted the cluster" in host.log_path.read_text()
    # The local account is never turned into a tenant by a grant.
    assert host.api("user.list")["result"] == []


def test_another_tenants_submission_token_is_a_new_submission(make_host):
    """A token seen in another tenant's request names neither that tenant's job nor
    lets a submission past the submit limits as a "retry"."""
    host = make_host({"USER_SUBMIT_RATE": 0.001, "USER_SUBMIT_BURST": 1})
    uids = {}
    for name in ("ann", "mal"):
        key = host.add_user(name)
        assert host.ssh(name, key, "true").returncode == 0
        uids[name] = int(host.passwd(name)[2])
    with api_socket(host.run_dir, uids["ann"]) as s:
        ann = call(s, "job.submit", {"script": SLEEPER, "token": "shared-token"})["result"]
    with api_socket(host.run_dir, uids["mal"]) as s:
        first = call(s, "job.submit", {"script": SLEEPER, "token": "other"})["result"]
        mal = call(s, "job.submit", {"script": SLEEPER, "token": "shared-token"})
    assert first["job_id"] != ann["job_id"]
    # ann's token is no retry of mal's: mal's burst is spent, so it is refused.
    assert not mal["ok"] and mal["code"] == "rate_limited", mal
    tally("attacks_refused")
    with api_socket(host.run_dir, uids["ann"]) as s:  # ann's own retry still is one
        again = call(s, "job.submit", {"script": SLEEPER, "token": "shared-token"})["result"]
    assert again["job_id"] == ann["job_id"] and again["duplicate"]


def test_an_authorized_keys_that_never_ends_costs_one_refused_login(make_host):
    """A local account makes its ~/.ssh/authorized_keys a FIFO that no one writes:
    the daemon's reader (run as that account) is given up after 10 s and killed, the
    login refused, and the next account's login is not held up by it."""
    host = make_host()
    olga, mal = _local_account(host, "olga"), _local_account(host, "mal")
    keys = host.dir / "localhome" / "mal" / ".ssh" / "authorized_keys"
    keys.unlink()
    os.mkfifo(keys, 0o600)
    os.chown(keys, mal, mal)
    r = host.ssh("mal", host.key("mal"), "true")
    assert r.returncode == 255
    tally("attacks_refused")
    wait_for(lambda: not _procs_of(mal), 15, "the reader of mal's FIFO to be killed")
    assert _logs_in(host, "olga") and _api_ok(host, olga)
