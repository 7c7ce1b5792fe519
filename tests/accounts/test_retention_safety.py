"""TENANT_RETENTION_DAYS never removes what is not the tenant's: bind mounts inside a
home, another account's home, immutable files. One real daemon, real OpenSSH tenants,
real ``mount --bind`` of directories made here (inside the daemon's mount namespace,
unmounted in a finalizer); the policy clock is moved through MTGPU_CLOCK_OFFSET_FILE.

Each test keeps a victim file outside the home and checks it after every removal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from mtgpu_testing import python_env, wait_for
from retention_testing import clock_host, clock_mover

pytestmark = pytest.mark.root

CONFIG = {
    "TENANT_RETENTION_DAYS": 30,
    "TENANT_RETENTION_GRACE": "7d",
    "TENANT_RETENTION_HOME": "archive",
    "SIMULATED_CPUS": 4,
}


@pytest.fixture(scope="module")
def host():
    yield from clock_host(CONFIG)


@pytest.fixture
def clock(host):
    """Move the daemon's policy clock (days ahead of real time)."""
    yield from clock_mover(host)


@pytest.fixture
def victim():
    """A directory outside every home with a file that must survive every removal."""
    d = Path(tempfile.mkdtemp(prefix="mtgpu-victim-", dir="/tmp"))
    d.chmod(0o755)
    (d / "precious.txt").write_text("only copy\n")
    (d / "sub").mkdir()
    (d / "sub" / "deep.txt").write_text("deep\n")
    yield d
    subprocess.run(["chattr", "-R", "-i", str(d)], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


def intact(victim: Path) -> None:
    assert (victim / "precious.txt").read_text() == "only copy\n"
    assert (victim / "sub" / "deep.txt").read_text() == "deep\n"


@pytest.fixture
def mounts(host):
    """``bind(src, dst)`` inside the daemon's mount namespace; each unmounted afterwards."""
    made: list[str] = []

    def bind(src: Path, dst: Path, *opts: str) -> None:
        r = host.in_ns(["mount", "--bind", str(src), str(dst)])
        assert r.returncode == 0, r.stderr
        made.append(str(dst))
        if opts:
            r = host.in_ns(["mount", "-o", "remount,bind," + ",".join(opts), str(dst)])
            assert r.returncode == 0, r.stderr

    def unbind(dst: Path) -> None:
        r = host.in_ns(["umount", str(dst)])
        assert r.returncode == 0, r.stderr
        made.remove(str(dst))

    bind.unbind = unbind  # type: ignore[attr-defined]
    yield bind
    for dst in reversed(made):
        host.in_ns(["umount", "-l", dst])


def retention(host, *args):
    return {s["user"]: s for s in json.loads(host.admin("retention", "--json", *args).stdout)["steps"]}


def archives(host, name):
    return sorted((host.state_dir / "retired-homes").glob(f"{name}-*"))


def keep_others_active(host, *mine):
    for u in json.loads(host.admin("user", "list", "--json").stdout):
        if u["name"] not in mine:
            host.admin("retention", "--unlock", u["name"])


def lock_then_due(host, clock, name, start):
    """Lock ``name`` (idle 31 days from ``start``), then move past the grace period."""
    # The test's own logins end first: on a loaded host their session processes may
    # outlive the ssh command for a moment, and a live process rightly blocks the lock.
    pw = host.passwd(name)
    uid = int(pw[2]) if pw is not None else None
    wait_for(
        lambda: (
            not [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        ),
        what=f"{name}'s logins to end",
    )
    clock(start + 31)
    keep_others_active(host, name)
    assert retention(host)[name]["done"] == "locked"
    clock(start + 39)
    keep_others_active(host, name)


def setup_status(host) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.install.setup", "status", "--config", str(host.config_path)],
        capture_output=True,
        text=True,
        env=python_env(),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_bind_mount_inside_a_home_is_never_emptied_nor_archived(host, clock, victim, mounts):
    key = host.add_user("binder")
    assert host.ssh("binder", key, "mkdir ~/project ~/ro && echo mine > ~/notes").returncode == 0
    home = host.homes / "binder"
    mounts(victim, home / "project")  # same filesystem: same st_dev
    mounts(victim / "sub", home / "ro", "ro")  # a read-only one as well
    lock_then_due(host, clock, "binder", 0)

    done = retention(host)["binder"]["done"]
    assert done.startswith("failed (attempt 1"), done
    assert f"{home}/project is a mount point" in done and f"{home}/ro is a mount point" in done
    intact(victim)
    assert (home / "notes").read_text() == "mine\n"  # nothing of the home was touched
    assert host.passwd("binder") is not None and archives(host, "binder") == []

    # Shown to the admin, with the back-off: the next pass does not try again yet.
    table = host.admin("retention").stdout
    assert "binder" in table and "failed" in table and "retried" in table, table
    again = retention(host)["binder"]
    assert again["action"] == "failed" and "is a mount point" in again["reason"]
    assert "REMOVAL FAILED 1 time(s)" in setup_status(host)
    # Retried at the admin's request: refused again, and no archive is ever written.
    assert retention(host, "--retry")["binder"]["done"].startswith("failed (attempt 2")
    intact(victim)
    assert archives(host, "binder") == []

    mounts.unbind(home / "project")
    mounts.unbind(home / "ro")
    assert retention(host, "--retry")["binder"]["done"] == "removed"
    intact(victim)
    assert not home.exists() and host.passwd("binder") is None
    assert len(archives(host, "binder")) == 1
    assert "binder" not in setup_status(host)


def test_a_bind_mount_found_by_the_walk_alone_is_refused(host, clock, victim, mounts):
    """A mount point renamed after the mount table was read is still found by mount ID."""
    from mtgpu.accounts import homeremove

    key = host.add_user("walker")
    assert host.ssh("walker", key, "mkdir -p ~/a/b").returncode == 0
    home = host.homes / "walker"
    mounts(victim, home / "a" / "b")
    r = host.in_ns(
        [
            sys.executable,
            "-c",
            (
                "import sys; from mtgpu.accounts import homeremove as h; "
                "h.mounts_under = lambda p: []; "
                f"home = h.Home({str(host.homes)!r}, 'walker', {int(host.passwd('walker')[2])}); "
                "print(home.problems())"
            ),
        ],
        env=python_env(),
    )
    assert r.returncode == 0, r.stderr
    assert f"{home}/a/b is a mount point (mount ID" in r.stdout, r.stdout
    assert homeremove.MAX_DEPTH > 0
    intact(victim)


def test_another_accounts_home_is_never_taken_nor_removed(host, clock, victim):
    # An OS account MTGPU did not create, whose home is TENANT_HOME_ROOT/alice.
    home = host.homes / "alice"
    r = host.in_ns(["useradd", "-m", "-d", str(home), "-c", "local user", "lalice"])
    assert r.returncode == 0, r.stderr
    (home / "thesis.tex").write_text("years of work\n")
    try:
        r = host.admin("user", "add", "alice", "--key", host.pubkey("alice"), check=False)
        assert r.returncode != 0
        assert f"{home} already exists and belongs to 'lalice'" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        r = host.admin("invite", "alice", check=False)  # an invite would make it too
        assert r.returncode != 0 and "belongs to 'lalice'" in r.stderr, r.stderr
        names = {u["name"] for u in json.loads(host.admin("user", "list", "--json").stdout)}
        assert "alice" not in names

        # Added before the directory appeared: the first login refuses to make the account.
        key = host.add_user("bertha")
        bhome = host.homes / "bertha"
        assert host.in_ns(["install", "-d", "-o", "lalice", "-m", "0700", str(bhome)]).returncode == 0
        (bhome / "data").write_text("lalice's\n")
        r = host.ssh("bertha", key, "true")
        assert r.returncode != 0
        assert host.passwd("bertha") is None
        err = r.stderr.decode()
        assert f"{bhome} already exists and belongs to 'lalice'" in err, err
        lock_then_due(host, clock, "bertha", 0)
        assert retention(host)["bertha"]["done"] == "removed"  # the registry record only
        assert (bhome / "data").read_text() == "lalice's\n"
        assert (home / "thesis.tex").read_text() == "years of work\n"
        intact(victim)
    finally:
        host.in_ns(["userdel", "-r", "lalice"])
        subprocess.run(["rm", "-rf", str(host.homes / "bertha")], check=False)


def test_an_immutable_file_fails_the_removal_before_anything_is_removed(host, clock, victim):
    key = host.add_user("stuck")
    assert host.ssh("stuck", key, "mkdir -p ~/a && echo one > ~/a/one && echo two > ~/two").returncode == 0
    home = host.homes / "stuck"
    subprocess.run(["chattr", "+i", str(home / "two")], check=True)
    try:
        lock_then_due(host, clock, "stuck", 0)
        done = retention(host)["stuck"]["done"]
        assert done.startswith("failed") and f"{home}/two is immutable" in done, done
        # The home is whole, not emptied; the account stays, locked, to be finished later.
        assert (home / "a" / "one").read_text() == "one\n"
        assert host.passwd("stuck") is not None and archives(host, "stuck") == []
        intact(victim)
        log = [json.loads(x) for x in (host.state_dir / "retention.log").read_text().splitlines()]
        assert any(e["user"] == "stuck" and e["action"] == "remove failed" for e in log)
    finally:
        subprocess.run(["chattr", "-i", str(home / "two")], check=True)
    # The back-off has passed (an hour): the unattended pass would retry; so does this one.
    clock(39 + 2 / 24)
    keep_others_active(host, "stuck")
    s = retention(host)["stuck"]
    assert s["done"] == "removed", s
    assert not home.exists() and len(archives(host, "stuck")) == 1
    intact(victim)
