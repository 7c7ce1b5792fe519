"""Terminal logins against real tmux, as real unprivileged tenants, in real ptys."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil
import pytest

from mtgpu.tmux.sessions import HISTORY_LIMIT
from mtgpu.tmux.terminal import attach_argv, terminal_argv

if TYPE_CHECKING:
    from conftest import Tenant, Terminal

pytestmark = [pytest.mark.tmux, pytest.mark.root]

# What tenants run: a world-readable interpreter (never one under /root).
PYTHON = sys.executable

LOGIN = terminal_argv(PYTHON)
MT_ATTACH = "import sys; from mtgpu.tmux.attach import main_mt_attach; sys.exit(main_mt_attach(sys.argv[1:]))"

Tenants = Callable[[], "Tenant"]
Terminals = Callable[..., "Terminal"]


def attached_to(t: Tenant, name: str) -> None:
    t.until(lambda: t.sessions().get(name) == 1, what=lambda: f"{name!r} attached; have {t.sessions()}")


def detached(t: Tenant, name: str) -> None:
    t.until(lambda: t.sessions().get(name) == 0, what=lambda: f"{name!r} detached; have {t.sessions()}")


def shell_ready(t: Tenant, name: str) -> None:
    t.until(
        lambda: (
            t.tmux("display", "-p", "-t", f"={name}:", "#{pane_current_command}", check=False).stdout.strip()
            == "bash"
        ),
        what="bash in the pane",
    )


def test_new_terminal_creates_a_session_run_as_the_tenant(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    terminals(a, LOGIN)
    attached_to(a, "main")
    assert a.sessions() == {"main": 1}
    pid = int(a.tmux("display", "-p", "-t", "=main:", "#{pid}").stdout)
    pane_pid = int(a.tmux("display", "-p", "-t", "=main:", "#{pane_pid}").stdout)
    for p in (pid, pane_pid):
        assert psutil.Process(p).uids().real == a.uid
    # The server's defaults: the login shell, a long history, SSH variables kept fresh.
    assert a.tmux("show", "-gv", "default-shell").stdout.strip() == "/bin/bash"
    assert a.tmux("show", "-gv", "history-limit").stdout.strip() == str(HISTORY_LIMIT)
    upd = a.tmux("show", "-g", "update-environment").stdout
    assert "SSH_CONNECTION" in upd and "SSH_CLIENT" in upd
    # The first session switched exit-empty back on, so an empty server goes away.
    assert a.tmux("show", "-gv", "exit-empty").stdout.strip() == "on"
    env = a.tmux("show-environment", "-t", "=main", "SSH_CONNECTION").stdout
    assert env.strip() == "SSH_CONNECTION=127.0.0.1 40000 127.0.0.1 2222"


def test_tenant_config_is_read_after_our_defaults(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    conf = os.path.join(a.home, ".tmux.conf")
    with open(conf, "w") as f:
        f.write("set -g history-limit 1234\nset -g status-right 'mine'\n")
    os.chown(conf, a.uid, a.gid)
    terminals(a, LOGIN)
    attached_to(a, "main")
    assert a.tmux("show", "-gv", "history-limit").stdout.strip() == "1234"
    assert a.tmux("show", "-gv", "status-right").stdout.strip() == "mine"


def test_second_terminal_gets_its_own_session(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    terminals(a, LOGIN)
    attached_to(a, "main")
    terminals(a, LOGIN)
    attached_to(a, "2")
    assert a.sessions() == {"main": 1, "2": 1}
    clients = a.tmux("list-clients", "-F", "#{client_session}").stdout.split()
    assert sorted(clients) == ["2", "main"]


def test_reconnect_reattaches_with_the_screen_as_it_was(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    first = terminals(a, LOGIN)
    attached_to(a, "main")
    shell_ready(a, "main")
    first.send("echo marker-$((6*7))\r")
    a.until(lambda: "marker-42" in a.capture("main"), what="the marker in the pane")
    shell = a.tmux("display", "-p", "-t", "=main:", "#{pane_pid}").stdout
    first.hang_up()  # the network went away
    detached(a, "main")
    second = terminals(a, LOGIN)
    attached_to(a, "main")
    assert a.sessions() == {"main": 1}
    # Same shell, same screen: the client redraws what was there.
    assert a.tmux("display", "-p", "-t", "=main:", "#{pane_pid}").stdout == shell
    second.wait_for("marker-42")


def _two_detached(a: Tenant, terminals: Terminals) -> None:
    one = terminals(a, LOGIN)
    attached_to(a, "main")
    two = terminals(a, LOGIN)
    attached_to(a, "2")
    one.hang_up()
    two.hang_up()
    detached(a, "main")
    detached(a, "2")


def _menu(output: str) -> list[str]:
    """Session names in the order the menu numbers them."""
    names = []
    for line in output.splitlines():
        words = line.split()
        if len(words) > 2 and words[0] == f"{len(names) + 1})":
            names.append(words[1])
    return names


def test_menu_with_several_detached_sessions(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    _two_detached(a, terminals)
    t = terminals(a, LOGIN)
    t.wait_for("Attach which one?")
    assert "Detached terminals:" in t.output and "a new terminal (3)" in t.output
    menu = _menu(t.output)
    assert sorted(menu) == ["2", "main"]
    second = menu[1]
    t.send("2\r")
    attached_to(a, second)
    assert a.sessions() == {second: 1, menu[0]: 0}
    t.hang_up()
    detached(a, second)
    # "n" starts a new session even though two are detached.
    t = terminals(a, LOGIN)
    t.wait_for("Attach which one?")
    t.send("n\r")
    attached_to(a, "3")
    assert a.sessions() == {"main": 0, "2": 0, "3": 1}


def test_menu_enter_takes_the_first_and_a_bad_answer_asks_again(
    tenant: Tenants, terminals: Terminals
) -> None:
    a = tenant()
    _two_detached(a, terminals)
    t = terminals(a, LOGIN)
    t.wait_for("Attach which one?")
    first = _menu(t.output)[0]
    t.send("9\r")
    t.wait_for("Type a number from 1 to 2")
    t.send("\r")
    attached_to(a, first)


def test_mt_attach_goes_straight_to_a_session(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    _two_detached(a, terminals)
    terminals(a, attach_argv(PYTHON, "main"))
    attached_to(a, "main")
    assert a.sessions()["2"] == 0
    # Without a name it lists them; with a wrong one it says which exist.
    listing = a.python(MT_ATTACH, check=True).stdout.splitlines()
    assert listing[0].split() == ["NAME", "WINDOWS", "STATE", "CREATED", "COMMAND"]
    assert sorted(line.split()[0] + ":" + line.split()[2] for line in listing[1:]) == [
        "2:detached",
        "main:attached",
    ]
    wrong = a.python(MT_ATTACH, "nope")
    assert wrong.returncode == 1
    assert "no terminal session named 'nope'; yours are: " in wrong.stderr
    assert "main" in wrong.stderr and "2" in wrong.stderr
    # Without a terminal it says how to get one instead of failing in tmux.
    notty = a.python(MT_ATTACH, "main")
    assert notty.returncode == 1 and "ssh -t" in notty.stderr


def test_mt_attach_lists_nothing_before_the_first_login(tenant: Tenants) -> None:
    a = tenant()
    p = a.python(MT_ATTACH, check=True)
    assert "No terminal sessions" in p.stdout


def test_another_tenant_cannot_attach(tenant: Tenants, terminals: Terminals) -> None:
    a, b = tenant(), tenant()
    terminals(a, LOGIN)
    attached_to(a, "main")
    sock_dir = os.path.dirname(a.socket)
    st = os.stat(sock_dir)
    assert st.st_uid == a.uid and stat.S_IMODE(st.st_mode) == 0o700
    top = os.stat(os.path.dirname(sock_dir))
    assert top.st_uid == 0 and stat.S_IMODE(top.st_mode) == 0o711
    a_socket = a.socket
    assert os.path.exists(a_socket)
    for args in (["list-sessions"], ["attach-session", "-t", "main"]):
        p = b.run(["tmux", "-S", a_socket, *args], check=False)
        assert p.returncode != 0 and "Permission denied" in p.stderr, p.stderr
    # In a real terminal too, and B's own login sees none of A's sessions.
    t = terminals(b, ["tmux", "-S", a_socket, "attach-session", "-t", "main"])
    t.wait_for("Permission denied")
    terminals(b, LOGIN)
    attached_to(b, "main")
    assert b.sessions() == {"main": 1}
    assert a.sessions() == {"main": 1}


def test_window_size_changes_reach_the_tmux_client(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    t = terminals(a, LOGIN, cols=100, rows=30)
    attached_to(a, "main")

    def size() -> str:
        return a.tmux("list-clients", "-F", "#{client_width}x#{client_height}").stdout.strip()

    a.until(lambda: size() == "100x30", what=lambda: f"client size 100x30, got {size()}")
    t.resize(132, 43)
    a.until(lambda: size() == "132x43", what=lambda: f"client size 132x43, got {size()}")
    # and the window follows (less the status line)
    win = a.tmux("display", "-p", "-t", "=main:", "#{window_width}x#{window_height}").stdout.strip()
    assert win == "132x42"


def test_killing_the_login_leaves_tmux_and_its_processes_running(
    tenant: Tenants, terminals: Terminals
) -> None:
    a = tenant()
    t = terminals(a, LOGIN)
    attached_to(a, "main")
    shell_ready(a, "main")
    t.send("sleep 1000\r")
    a.until(
        lambda: a.tmux("display", "-p", "-t", "=main:", "#{pane_current_command}").stdout.strip() == "sleep",
        what="sleep in the pane",
    )
    server = psutil.Process(int(a.tmux("display", "-p", "-t", "=main:", "#{pid}").stdout))
    shell = psutil.Process(int(a.tmux("display", "-p", "-t", "=main:", "#{pane_pid}").stdout))
    sleep = next(p for p in shell.children() if p.name() == "sleep")
    client = t.client_pid()
    # The server was daemonized: not in the login's session, not its descendant.
    assert os.getsid(server.pid) not in (os.getsid(client), os.getsid(t.proc.pid))
    assert server.pid not in {p.pid for p in psutil.Process(t.proc.pid).children(recursive=True)}
    t.kill_tree()
    a.until(lambda: not psutil.pid_exists(client), what="the client to die")
    detached(a, "main")
    assert server.is_running() and sleep.is_running()
    assert sleep.status() != psutil.STATUS_ZOMBIE


def test_mt_attach_inside_tmux_switches_instead_of_nesting(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    _two_detached(a, terminals)
    t = terminals(a, attach_argv(PYTHON, "main"))
    attached_to(a, "main")
    shell_ready(a, "main")
    # What typing `mt-attach 2` in the pane does (the console script calls the same code).
    t.send(f"{PYTHON} -P -m mtgpu.tmux.attach 2\r")
    attached_to(a, "2")
    assert a.sessions() == {"main": 0, "2": 1}
    assert a.tmux("list-clients", "-F", "#{client_session}").stdout.split() == ["2"]


def test_mt_attach_d_takes_over_from_a_dropped_terminal(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    stale = terminals(a, LOGIN)
    attached_to(a, "main")
    terminals(a, [*terminal_argv(PYTHON), "-d", "main"])
    stale.wait_for("[detached")
    a.until(
        lambda: a.tmux("list-clients", "-F", "#{client_session}").stdout.split() == ["main"],
        what="exactly one client on main",
    )


def test_a_tmp_tmux_directory_taken_by_someone_else_no_longer_denies_a_terminal(
    tenant: Tenants, terminals: Terminals
) -> None:
    a, b = tenant(), tenant()
    # B got there first, in the world-writable /tmp: tmux refuses a directory A does
    # not own, but A's socket lives in the root-made RUN_DIR/tmux/tmux-UID.
    os.mkdir(f"/tmp/tmux-{a.uid}", 0o700)
    os.chown(f"/tmp/tmux-{a.uid}", b.uid, b.gid)
    terminals(a, LOGIN)
    attached_to(a, "main")
    assert os.path.exists(a.socket)
    # Inside, the tenant's own `tmux -L mtgpu` finds the same server.
    shell_ready(a, "main")
    out = a.run(
        ["tmux", "-L", "mtgpu", "list-sessions", "-F", "#{session_name}"],
        TMUX_TMPDIR=os.path.dirname(os.path.dirname(a.socket)),
    ).stdout.split()
    assert out == ["main"]


def test_without_the_daemons_directory_a_taken_tmp_directory_is_explained_and_a_shell_given(
    tenant: Tenants, terminals: Terminals
) -> None:
    a, b = tenant(), tenant()
    os.mkdir(f"/tmp/tmux-{a.uid}", 0o700)
    os.chown(f"/tmp/tmux-{a.uid}", b.uid, b.gid)
    t = terminals(a, LOGIN, env={"MTGPU_TMUX_DIR": None, "TMUX_TMPDIR": None})
    t.wait_for("ask an admin to remove it")
    assert f"/tmp/tmux-{a.uid}, where your terminals' tmux socket lives, is not yours" in t.output
    assert "`mt-attach` lists your terminals" in t.output
    assert "Traceback" not in t.output
    # Never stranded: a plain login shell answers.
    t.send("echo shell-$((6*7))\r")
    t.wait_for("shell-42")


def test_a_terminal_type_this_host_does_not_know_still_gets_tmux(
    tenant: Tenants, terminals: Terminals
) -> None:
    a = tenant()
    # tmux itself would refuse it: "missing or unsuitable terminal: xterm-mtgpu-unknown".
    t = terminals(a, LOGIN, env={"TERM": "xterm-mtgpu-unknown"})
    a.until(lambda: a.sessions().get("main") == 1, what=lambda: f"main attached; got {t.output!r}")
    assert a.tmux("list-clients", "-F", "#{client_termname}").stdout.split() == ["xterm-256color"]


def test_non_utf8_locales_list_and_reattach_non_ascii_sessions(tenant: Tenants, terminals: Terminals) -> None:
    a = tenant()
    first = terminals(a, LOGIN, env={"LC_ALL": "C"})
    attached_to(a, "main")
    a.tmux("rename-session", "-t", "=main", "s\u00ebss")
    first.hang_up()
    detached(a, "s\u00ebss")
    second = terminals(a, LOGIN, env={"LC_ALL": "C"})
    attached_to(a, "s\u00ebss")
    assert "Traceback" not in second.output
    listing = a.run([PYTHON, "-P", "-c", MT_ATTACH], LC_ALL="C").stdout
    assert "s\u00ebss" in listing
