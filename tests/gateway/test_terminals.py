"""Interactive terminals over real SSH: tmux views, reconnects, resizes, isolation."""

from __future__ import annotations

import subprocess
import time

import pytest

from mtgpu_testing import ClientTerminal

pytestmark = [pytest.mark.root, pytest.mark.tmux]


@pytest.fixture
def terms():
    opened: list[ClientTerminal] = []

    def open_(host, user, key, *cmd, **kw):
        t = ClientTerminal(host, user, key, *cmd, **kw)
        opened.append(t)
        return t

    yield open_
    for t in opened:
        t.close()


def _tmux_as(host, user, *args):
    uid = host.passwd(user)[2]
    return host.in_ns(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                       "tmux", "-L", "mtgpu", *args], env={"PATH": "/usr/bin:/bin", "HOME": "/"})


def test_terminal_is_tmux_and_survives_disconnect(shared_host, terms):
    host = shared_host
    key = host.add_user("tara")
    t = terms(host, "tara", key)
    t.type("echo marker-$((40+2)); sleep 1000")
    t.wait_for("marker-42")
    assert "tara" in _tmux_as(host, "tara", "list-sessions").stdout or \
        _tmux_as(host, "tara", "list-sessions").returncode == 0
    t.kill()
    # The session is detached, and the sleep still runs.
    deadline = time.time() + 10
    while time.time() < deadline:
        out = _tmux_as(host, "tara", "list-sessions", "-F", "#{session_name} #{session_attached}").stdout
        if out.strip().endswith(" 0"):
            break
        time.sleep(0.1)
    assert out.split() == ["main", "0"], out
    ps = subprocess.run(["pgrep", "-u", host.passwd("tara")[2], "-x", "sleep"], capture_output=True)
    assert ps.returncode == 0
    # Reconnecting re-attaches the session with the earlier output on screen.
    t2 = terms(host, "tara", key)
    t2.wait_for("marker-42")


def test_two_terminals_get_their_own_views(shared_host, terms):
    host = shared_host
    key = host.add_user("vic")
    a = terms(host, "vic", key)
    a.type("echo in-$((1+1))-a")
    a.wait_for("in-2-a")
    b = terms(host, "vic", key)
    b.type("echo in-$((1+1))-b")
    b.wait_for("in-2-b")
    assert "in-2-b" not in a.screen()
    assert "in-2-a" not in b.screen()
    out = _tmux_as(host, "vic", "list-sessions", "-F", "#{session_name}").stdout.split()
    assert sorted(out) == ["2", "main"]


def test_window_resize_reaches_tmux_client(shared_host, terms):
    host = shared_host
    key = host.add_user("ray")
    t = terms(host, "ray", key, cols=100, rows=30)
    t.type("echo re$((0))ady")
    t.wait_for("re0ady")

    def client_width():
        return _tmux_as(host, "ray", "list-clients", "-F", "#{client_width}x#{client_height}").stdout.strip()

    assert client_width() == "100x30"
    t.resize(132, 43)
    deadline = time.time() + 10
    while client_width() != "132x43" and time.time() < deadline:
        time.sleep(0.1)
    assert client_width() == "132x43"


def test_other_tenants_tmux_cannot_be_attached(shared_host, terms):
    host = shared_host
    ka = host.add_user("ada")
    kb = host.add_user("bea")
    a = terms(host, "ada", ka)
    a.type("echo ada-$((1))-here")
    a.wait_for("ada-1-here")
    uid_a = host.passwd("ada")[2]
    r = host.ssh("bea", kb, f"tmux -S /tmp/tmux-{uid_a}/mtgpu list-sessions")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    b = terms(host, "bea", kb, f"tmux -S /tmp/tmux-{uid_a}/mtgpu attach")
    b.wait_for("SSH-EXITED")
    assert "ada-1-here" not in b.screen()


def test_tmux_survives_daemon_restart(make_host, terms):
    host = make_host()
    key = host.add_user("rita")
    t = terms(host, "rita", key)
    t.type("echo before-$((1))-restart; sleep 1000")
    t.wait_for("before-1-restart")
    host.restart()
    t.kill()
    t2 = terms(host, "rita", key)
    t2.wait_for("before-1-restart")
    ps = subprocess.run(["pgrep", "-u", host.passwd("rita")[2], "-x", "sleep"], capture_output=True)
    assert ps.returncode == 0


def test_mt_attach_goes_straight_to_a_session(shared_host, terms):
    host = shared_host
    key = host.add_user("matt")
    a = terms(host, "matt", key)
    a.type("echo first-$((1))-view")
    a.wait_for("first-1-view")
    b = terms(host, "matt", key)
    b.type("echo second-$((2))-view")
    b.wait_for("second-2-view")
    a.kill()
    b.kill()
    time.sleep(0.5)
    c = terms(host, "matt", key, "mt-attach", "2")
    c.wait_for("second-2-view")
