"""Logging in with the real OpenSSH client: accounts, keys, exec, invites."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import stat
import time

import pytest

pytestmark = pytest.mark.root


def _invite(host, name: str, *extra: str) -> str:
    out = host.admin("invite", name, "--json", *extra).stdout
    return json.loads(out)["code"]


def test_added_user_first_login_creates_account_with_registry_uid(shared_host):
    host = shared_host
    key = host.add_user("alice")
    uid = json.loads(host.admin("user", "show", "alice", "--json").stdout)["uid"]
    assert host.passwd("alice") is None  # no account until the first login
    r = host.ssh("alice", key, "id -u; id -g; id -un; echo $HOME; pwd")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().split()
    assert lines[:3] == [str(uid), str(uid), "alice"]
    assert lines[3] == lines[4] == str(host.homes / "alice")
    pw = host.passwd("alice")
    assert pw is not None and int(pw[2]) == uid and pw[5] == str(host.homes / "alice")


def test_home_is_private_and_owned_by_tenant(shared_host):
    host = shared_host
    key = host.add_user("homer")
    assert host.ssh("homer", key, "true").returncode == 0
    st = os.stat(host.homes / "homer")
    uid = int(host.passwd("homer")[2])
    assert st.st_uid == uid and st.st_gid == uid
    assert stat.S_IMODE(st.st_mode) == 0o700


def test_password_is_locked_and_subids_derived_from_uid(shared_host):
    host = shared_host
    key = host.add_user("subby")
    assert host.ssh("subby", key, "true").returncode == 0
    uid = int(host.passwd("subby")[2])
    shadow = [line.split(":") for line in (host.etc / "shadow").read_text().splitlines()]
    entry = next(s for s in shadow if s[0] == "subby")
    assert entry[1].startswith("!") or entry[1] == "*"
    start = (1 << 31) + (uid - 1000) * 65536
    for f in ("subuid", "subgid"):
        lines = (host.etc / f).read_text().splitlines()
        assert f"subby:{start}:65536" in lines


def test_tenants_cannot_read_or_write_each_others_homes(shared_host):
    host = shared_host
    ka = host.add_user("ann")
    kb = host.add_user("ben")
    assert host.ssh("ann", ka, "echo secret > ~/note.txt").returncode == 0
    r = host.ssh("ben", kb, f"cat {host.homes}/ann/note.txt")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    r = host.ssh("ben", kb, f"touch {host.homes}/ann/evil")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    assert not (host.homes / "ann" / "evil").exists()


def test_unknown_key_and_root_are_refused(shared_host):
    host = shared_host
    host.add_user("carl")
    stranger = host.key("stranger")
    r = host.ssh("carl", stranger, "true")
    assert r.returncode == 255 and b"Permission denied" in r.stderr
    r = host.ssh("root", host.key("carl"), "true")
    assert r.returncode == 255 and b"Permission denied" in r.stderr
    r = host.ssh("nosuchuser", stranger, "true")
    assert r.returncode == 255 and b"Permission denied" in r.stderr


def test_only_publickey_is_offered(shared_host):
    host = shared_host
    r = host.ssh(
        "carl",
        None,
        "true",
        opts=[
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
            "-o",
            "PubkeyAuthentication=no",
        ],
    )
    assert r.returncode == 255
    # OpenSSH lists the methods the server still offers: publickey alone.
    assert re.search(rb"Permission denied \(publickey\)", r.stderr), r.stderr
    assert b"password" not in r.stderr.split(b"Permission denied")[1]


def test_exit_status_and_stderr_pass_through(shared_host):
    host = shared_host
    key = host.add_user("exy")
    r = host.ssh("exy", key, "echo out; echo err >&2; exit 7")
    assert r.returncode == 7
    assert r.stdout == b"out\n" and r.stderr == b"err\n"


def test_ten_mib_through_stdin_keeps_its_sha256(shared_host):
    host = shared_host
    key = host.add_user("bulk")
    data = os.urandom(10 << 20)
    r = host.ssh("bulk", key, "sha256sum", input=data)
    assert r.returncode == 0
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    r = host.ssh("bulk", key, "cat", input=data)
    assert r.returncode == 0 and hashlib.sha256(r.stdout).digest() == hashlib.sha256(data).digest()


def test_environment_is_clean_and_names_the_daemon_config(shared_host):
    host = shared_host
    key = host.add_user("envy")
    r = host.ssh("envy", key, "env", opts=["-o", "SetEnv=LANG=fr_FR.UTF-8 EVIL=1 LC_TIME=C"])
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
    assert env["USER"] == env["LOGNAME"] == "envy"
    assert env["HOME"] == str(host.homes / "envy")
    assert env["MTGPU_CONFIG"] == str(host.config_path)
    assert env["PATH"].split(":")[0] == str(host.run_dir / "bin")
    assert env["LANG"] == "fr_FR.UTF-8" and env["LC_TIME"] == "C"
    assert "EVIL" not in env


def test_restart_keeps_host_key(make_host):
    host = make_host()
    before = host.host_key_fingerprints()
    assert before
    host.restart()
    assert host.host_key_fingerprints() == before
    key_file = host.state_dir / "ssh_host_ed25519_key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600


def test_registry_survives_restart(make_host):
    host = make_host()
    key = host.add_user("persist")
    uid = host.ssh("persist", key, "id -u").stdout.strip()
    host.restart()
    assert host.ssh("persist", key, "id -u").stdout.strip() == uid


def test_invite_binds_key_once(shared_host):
    host = shared_host
    code = _invite(host, "ivy")
    key = host.key("ivy")
    # Before redeeming, the key only reaches the join flow.
    r = host.ssh("ivy", key, "id")
    assert r.returncode == 1 and b"mtgpu-join" in r.stderr
    r = host.ssh("ivy", key, "mtgpu-join", code)
    assert r.returncode == 0, r.stderr
    assert b"registered" in r.stdout
    r = host.ssh("ivy", key, "id -un")
    assert r.stdout.strip() == b"ivy"
    # The code is spent: another key cannot use it.
    other = host.key("ivy-other")
    r = host.ssh("ivy", other, "mtgpu-join", code)
    assert r.returncode == 255 and b"Permission denied" in r.stderr


def test_invite_on_the_terminal(shared_host):
    """`ssh NAME@HOST` with a pty asks for the code; a client-side tmux types it."""
    import shlex
    import subprocess

    host = shared_host
    code = _invite(host, "tina")
    key = host.key("tina")
    sock = f"mtgpu-client-{os.getpid()}"
    argv = host.ssh_argv("tina", key, opts=["-tt"])
    subprocess.run(
        ["tmux", "-L", sock, "new-session", "-d", "-x", "120", "-y", "30", shlex.join(argv) + "; sleep 30"],
        check=True,
    )
    try:

        def screen() -> str:
            return subprocess.run(
                ["tmux", "-L", sock, "capture-pane", "-p"], capture_output=True, text=True
            ).stdout

        deadline = time.time() + 20
        while "Invite code:" not in screen() and time.time() < deadline:
            time.sleep(0.1)
        assert "Invite code:" in screen()
        subprocess.run(["tmux", "-L", sock, "send-keys", code, "Enter"], check=True)
        deadline = time.time() + 20
        while "now registered" not in screen() and time.time() < deadline:
            time.sleep(0.1)
        assert "now registered for tina" in screen()
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert host.ssh("tina", key, "id -un").stdout.strip() == b"tina"


def test_a_strangers_wrong_codes_neither_revoke_nor_disclose_the_invite(shared_host):
    host = shared_host
    code = _invite(host, "wendy")
    stranger = host.key("wendy-stranger")
    answers = []
    for _ in range(3):
        r = host.ssh("wendy", stranger, "mtgpu-join", "aaaa-bbbb-cccc")
        assert r.returncode == 1 and b"wrong or expired invite code" in r.stderr
        answers.append(r.stderr)
    # Every answer reads the same: no count of tries, nothing about the invite.
    assert len(set(answers)) == 1 and b"tries" not in answers[0] and b"revoked" not in answers[0]
    # The stranger's key is now refused; the invite stays open for wendy's own key.
    r = host.ssh("wendy", stranger, "mtgpu-join", code)
    assert r.returncode == 255 and b"Permission denied" in r.stderr
    key = host.key("wendy")
    r = host.ssh("wendy", key, "mtgpu-join", code)
    assert r.returncode == 0 and b"registered" in r.stdout, r.stderr
    assert host.ssh("wendy", key, "id -un").stdout.strip() == b"wendy"


def test_expired_invite_is_refused(shared_host):
    host = shared_host
    code = _invite(host, "eve", "--expires", "1s")
    time.sleep(1.5)
    r = host.ssh("eve", host.key("eve"), "mtgpu-join", code)
    assert r.returncode == 255 and b"Permission denied" in r.stderr


@pytest.mark.parametrize("name", ["root", "../x", "a" * 33, "Upper", "1abc", "-dash", "daemon"])
def test_bad_and_system_names_are_refused(shared_host, name):
    r = shared_host.admin("invite", "--", name, check=False)
    assert r.returncode == 1
    assert "user name" in r.stderr or "system" in r.stderr or "reserved" in r.stderr


def test_two_simultaneous_first_logins_make_one_account(make_host):
    host = make_host()
    key = host.add_user("twin")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: host.ssh("twin", key, "id -u"), range(4)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert len({r.stdout for r in results}) == 1
    lines = [line for line in (host.etc / "passwd").read_text().splitlines() if line.startswith("twin:")]
    assert len(lines) == 1
    assert (
        len([line for line in (host.etc / "group").read_text().splitlines() if line.startswith("twin:")]) == 1
    )


def test_existing_local_account_uses_own_authorized_keys_and_is_untouched(make_host):
    host = make_host()
    home = host.dir / "localhome" / "olga"
    r = host.in_ns(["useradd", "-m", "-d", str(home), "-s", "/bin/sh", "olga"])
    assert r.returncode == 0, r.stderr
    (host.dir / "localhome").chmod(0o755)
    pub = host.pubkey("olga")
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(pub + "\n")
    pw = host.passwd("olga")
    uid = int(pw[2])
    for p in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(p, uid, uid)
    before = (
        (host.etc / "passwd").read_text(),
        (host.etc / "shadow").read_text(),
        (host.etc / "subuid").read_text(),
        os.stat(home),
    )
    r = host.ssh("olga", host.key("olga"), "id -u; echo $HOME")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == [str(uid), str(home)]
    after = (
        (host.etc / "passwd").read_text(),
        (host.etc / "shadow").read_text(),
        (host.etc / "subuid").read_text(),
        os.stat(home),
    )
    assert before[:3] == after[:3]
    assert (before[3].st_mode, before[3].st_uid) == (after[3].st_mode, after[3].st_uid)
    # Another key is refused for the local account.
    assert host.ssh("olga", host.key("notolga"), "true").returncode == 255
    # And the admin cannot register a tenant under its name.
    r = host.admin("user", "add", "olga", "--key", pub, check=False)
    assert r.returncode == 1 and "existing local account" in r.stderr


def test_uid_conflict_with_local_account_is_refused_loudly(make_host):
    host = make_host()
    key = host.add_user("clash")
    uid = json.loads(host.admin("user", "show", "clash", "--json").stdout)["uid"]
    r = host.in_ns(["useradd", "-M", "-u", str(uid), "squatter"])
    assert r.returncode == 0, r.stderr
    r = host.ssh("clash", key, "id")
    assert r.returncode != 0
    assert b"already belongs to the local account 'squatter'" in r.stderr
    assert host.passwd("clash") is None
