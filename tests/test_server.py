"""The daemon's life: start errors, SIGHUP reload, SIGTERM shutdown."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

pytestmark = pytest.mark.root


def test_port_in_use_is_a_clear_error(make_host):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        host = make_host(start=False)
        host.config["SSH_LISTEN"] = f"127.0.0.1:{blocker.getsockname()[1]}"
        host.write_config()
        with pytest.raises(RuntimeError) as info:
            host.start(timeout=20)
        assert "SSH_LISTEN" in str(info.value) and "address already in use" in str(info.value).lower()
        assert host.proc.returncode == 1
    finally:
        blocker.close()


def test_unwritable_state_dir_is_a_clear_error(make_host, tmp_path):
    host = make_host(start=False)
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    host.config["STATE_DIR"] = str(target / "state")
    host.write_config()
    with pytest.raises(RuntimeError) as info:
        host.start(timeout=20)
    assert "STATE_DIR" in str(info.value)


def test_state_of_a_newer_format_is_refused(make_host):
    host = make_host(start=False)
    host.state_dir.mkdir(mode=0o700)
    (host.state_dir / "release.json").write_text('{"version": "9.0.0", "state_format": 99}\n')
    with pytest.raises(RuntimeError) as info:
        host.start(timeout=20)
    assert "holds state format 99, written by MTGPU 9.0.0" in str(info.value)
    assert str(info.value).startswith("mtgpu-server exited 3:")  # not restarted by systemd
    assert "Run MTGPU 9.0.0 or newer" in str(info.value)


@pytest.mark.parametrize("kind", ["journal", "snapshot"])
def test_state_of_format_1_is_converted_at_start(make_host, kind):
    """A daemon started on the state a format-1 daemon left (tests/data/state-format-1)
    serves its jobs; from a dump, it says it converts it."""
    import shutil

    from state_testing import FIXTURE

    host = make_host(start=False, name="testhost")
    shutil.copytree(FIXTURE / kind, host.state_dir)
    os.chmod(host.state_dir, 0o700)
    host.start()
    listed = [line.split() for line in (FIXTURE / "jobs.txt").read_text().splitlines()]
    for jid, what, state in listed:
        # The running job's supervisor is gone with the host that made the state: this
        # host ends it, and the job waiting for it to succeed with it.
        if what not in ("running", "dependency"):
            assert host.api("job.show", job_id=jid)["result"]["state"] == state, jid
    failed = host.api("job.show", job_id="2")["result"]
    assert (failed["exit_code"], failed["user"]) == (3, "fixture")
    assert [t["numeric_id"] for t in host.api("job.show", job_id="6")["result"]["tasks"]] == ["7", "8", "9"]
    if kind == "snapshot":
        assert "STATE_DIR holds state format 1; converting it to format 2" in host.log()


def test_sighup_reloads_or_keeps_the_old_config(make_host):
    host = make_host()
    key = host.add_user("hup")
    assert host.ssh("hup", key, "true").returncode == 0
    pid = int((host.run_dir / "mtgpu.pid").read_text())
    # A bad file is refused and the daemon keeps serving with the old one.
    host.config_path.write_text(host.config_path.read_text() + "USER_DISK_LIMIT: 20Q\n")
    os.kill(pid, signal.SIGHUP)
    deadline = time.time() + 10
    while "keeping the old configuration" not in host.log() and time.time() < deadline:
        time.sleep(0.1)
    assert "keeping the old configuration" in host.log()
    assert "USER_DISK_LIMIT" in host.log()
    assert host.ssh("hup", key, "true").returncode == 0
    # A good change is applied: the user becomes an admin through ADMINS.
    host.config["ADMINS"] = ["hup"]
    host.write_config()
    os.kill(pid, signal.SIGHUP)
    deadline = time.time() + 10
    while "configuration reloaded" not in host.log() and time.time() < deadline:
        time.sleep(0.1)
    r = host.ssh("hup", key, "mtgpu-admin whoami --json")
    assert r.returncode == 0, r.stderr
    assert b'"admin": true' in r.stdout


def test_sigterm_stops_cleanly(make_host):
    host = make_host()
    assert host.stop(signal.SIGTERM) == 0
    assert not (host.run_dir / "mtgpu.pid").exists()


def test_tenant_api_identity_comes_from_the_kernel(make_host):
    host = make_host()
    key = host.add_user("pam")
    r = host.ssh("pam", key, "mtgpu-admin whoami --json; mtgpu-admin user list")
    assert b'"name": "pam"' in r.stdout and b'"admin": false' in r.stdout
    assert b"needs an admin" in r.stderr
