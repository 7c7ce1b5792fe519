"""Interactive terminals over real SSH: tmux views, reconnects, resizes, isolation."""

from __future__ import annotations

import os
import signal
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


def _socket(host, user):
    return f"{host.run_dir}/tmux/tmux-{host.passwd(user)[2]}/mtgpu"


def _tmux_as(host, user, *args):
    """tmux as the tenant, on the tenant's MTGPU socket, as a UTF-8 client, where the
    tenant's sessions run."""
    return host.in_tenant_ns(
        user, ["tmux", "-u", "-S", _socket(host, user), *args], env={"PATH": "/usr/bin:/bin", "HOME": "/"}
    )


def test_terminal_is_tmux_and_survives_disconnect(shared_host, terms):
    host = shared_host
    key = host.add_user("tara")
    t = terms(host, "tara", key)
    t.type("echo marker-$((40+2)); sleep 1000")
    t.wait_for("marker-42")
    assert (
        "tara" in _tmux_as(host, "tara", "list-sessions").stdout
        or _tmux_as(host, "tara", "list-sessions").returncode == 0
    )
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
    sock = _socket(host, "ada")
    r = host.ssh("bea", kb, f"tmux -S {sock} list-sessions")
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    b = terms(host, "bea", kb, f"tmux -S {sock} attach")
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


# ------------------------------------------------------------ any locale

#: (label, the client's locale variables) as laptops send them (SendEnv LANG LC_*).
LOCALES = [
    ("unset", {}),
    ("C", {"LC_ALL": "C"}),
    ("POSIX", {"LANG": "POSIX"}),
    ("C.UTF-8", {"LANG": "C.UTF-8"}),
    ("en_US.UTF-8", {"LANG": "en_US.UTF-8"}),
    ("en_US.ISO-8859-1", {"LANG": "en_US.ISO-8859-1"}),
]
CLIENT_PATH = "/usr/local/bin:/usr/bin:/bin"


def _installed_locales() -> set[str]:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.split()
    return {n.lower().replace("-", "") for n in out}


@pytest.fixture(scope="module")
def locales():
    """en_US.UTF-8 and en_US.ISO-8859-1 compiled into the locale archive if this host
    lacks them (glibc's localedef, from the locales package's sources), and removed
    again afterwards: only what this fixture added."""
    added = []
    for name, charmap in (("en_US.UTF-8", "UTF-8"), ("en_US.ISO-8859-1", "ISO-8859-1")):
        if name.lower().replace("-", "") in _installed_locales():
            continue
        r = subprocess.run(["localedef", "-i", "en_US", "-f", charmap, name], capture_output=True, text=True)
        assert r.returncode in (0, 1), r.stderr  # 1: warnings only
        added.append(name)
    assert {"en_us.utf8", "en_us.iso88591"} <= _installed_locales()
    yield
    for name in added:
        subprocess.run(["localedef", "--delete-from-archive", name], capture_output=True)


# Typed as ASCII (printf escapes), so no terminal's encoding is involved in typing them.
SESSION_NAME = "s\u00ebss-\u65e5\u672c"  # sëss-日本
WINDOW_NAME = "w\u00efn"  # wïn
WORKDIR = "d\u00e9-\u65e5"  # dé-日


def _octal(text: str) -> str:
    return "".join(f"\\{b:03o}" for b in text.encode())


@pytest.mark.parametrize("label, lang", LOCALES, ids=[lab for lab, _ in LOCALES])
def test_a_second_login_in_any_locale_lands_in_the_running_session(shared_host, terms, locales, label, lang):
    host = shared_host
    user = "loc" + "".join(c for c in label.lower() if c.isalnum())[:10]
    key = host.add_user(user)
    env = {"PATH": CLIENT_PATH, "TERM": "xterm-256color", **lang}
    first = terms(host, user, key, env=env)
    first.type("echo ready-$((1+1))")
    first.wait_for("ready-2")
    # The shells have the client's locale, nothing added (Python's C-locale coercion).
    first.type('echo "lc=[${LC_ALL-}][${LANG-}][${LC_CTYPE-}]"')
    first.wait_for(f"lc=[{lang.get('LC_ALL', '')}][{lang.get('LANG', 'C.UTF-8')}][]")
    # A non-ASCII session, window and working directory, and a program left running.
    first.type(
        f"S=$(printf '{_octal(SESSION_NAME)}'); W=$(printf '{_octal(WINDOW_NAME)}'); "
        f'D=$(printf \'{_octal(WORKDIR)}\'); mkdir -p ~/"$D" && cd ~/"$D" && '
        'tmux rename-session "$S" && tmux rename-window "$W" && '
        "echo marker-$((6*7)); sleep 1000"
    )
    first.wait_for("marker-42")
    names = _tmux_as(host, user, "list-sessions", "-F", "#{session_name}").stdout.split()
    assert names == [SESSION_NAME], names
    path = _tmux_as(
        host, user, "display", "-p", "-t", f"={SESSION_NAME}:", "#{window_name} #{pane_current_path}"
    ).stdout.strip()
    assert path == f"{WINDOW_NAME} {host.homes}/{user}/{WORKDIR}", path
    first.kill()
    _detached(host, user, SESSION_NAME)
    # The second login: the same session, its screen, no traceback, no new session.
    second = terms(host, user, key, env=env)
    screen = second.wait_for("marker-42")
    assert "Traceback" not in screen and "ValueError" not in screen
    assert _tmux_as(host, user, "list-sessions", "-F", "#{session_name}").stdout.split() == [SESSION_NAME]
    sleep = subprocess.run(["pgrep", "-u", host.passwd(user)[2], "-x", "sleep"], capture_output=True)
    assert sleep.returncode == 0
    # The listing works in this locale too (names the terminal cannot show become '?').
    r = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *host.ssh_argv(user, key, "mt-attach")],
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    assert r.stdout.split()[:5] == [b"NAME", b"WINDOWS", b"STATE", b"CREATED", b"COMMAND"]
    if "UTF-8" in label:
        assert SESSION_NAME.encode() in r.stdout


def _detached(host, user, name, timeout=20):
    deadline = time.time() + timeout
    out = ""
    while time.time() < deadline:
        out = _tmux_as(host, user, "list-sessions", "-F", "#{session_name} #{session_attached}").stdout
        if f"{name} 0" in out.splitlines():
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} not detached: {out!r}")


# ------------------------------------------------------------ dropped and frozen clients


def _start_work(t, tag):
    t.type(f"echo {tag}-$((40+2)); sleep 1000")
    t.wait_for(f"{tag}-42")


#: The client's environment: this process's, or a laptop in the C locale.
CLIENT_ENVS = [
    pytest.param(None, id="default"),
    pytest.param({"PATH": CLIENT_PATH, "TERM": "xterm-256color", "LC_ALL": "C"}, id="LC_ALL=C"),
]


def _running(host, user, session):
    """What runs in ``session``'s active pane."""
    return _tmux_as(
        host, user, "display", "-p", "-t", f"={session}:", "#{pane_current_command}"
    ).stdout.strip()


@pytest.mark.parametrize("env", CLIENT_ENVS)
def test_a_killed_client_then_a_new_login_shows_the_earlier_screen(shared_host, terms, env):
    host = shared_host
    user = "kilo" if env is None else "kiloc"
    key = host.add_user(user)
    first = terms(host, user, key, env=env)
    _start_work(first, "killed")
    first.kill()
    time.sleep(1.5)
    second = terms(host, user, key, env=env)
    second.wait_for("killed-42")
    assert _tmux_as(host, user, "list-sessions", "-F", "#{session_name}").stdout.split() == ["main"]
    assert _tmux_as(host, user, "list-clients", "-F", "#{client_session}").stdout.split() == ["main"]
    assert _running(host, user, "main") == "sleep"
    assert (
        subprocess.run(["pgrep", "-u", host.passwd(user)[2], "-x", "sleep"], capture_output=True).returncode
        == 0
    )


@pytest.fixture
def frozen():
    """SIGSTOP a client; every one frozen is continued at the end."""
    stopped: list[int] = []

    def freeze(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    yield freeze
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _a_new_login_takes_over(host, terms, user, key, env, tag) -> None:
    """A second login shows the earlier session's screen (``TAG-42``), says it took it
    over on tmux's status line, and makes no new, empty session."""
    started = time.monotonic()
    second = terms(host, user, key, env=env)
    screen = second.wait_for(f"{tag}-42")
    assert "took over `main` from a connection idle since" in second.wait_for("took over")
    print(
        f"{tag}: the new login showed the earlier screen {time.monotonic() - started:.1f} s after it started"
    )
    assert f"{tag}-42" in screen
    assert _tmux_as(host, user, "list-sessions", "-F", "#{session_name}").stdout.split() == ["main"]
    assert _tmux_as(host, user, "list-clients", "-F", "#{client_session}").stdout.split() == ["main"]
    assert _running(host, user, "main") == "sleep"


@pytest.mark.parametrize("env", CLIENT_ENVS)
def test_a_frozen_client_then_a_new_login_takes_the_session_over(shared_host, terms, frozen, env):
    host = shared_host
    user = "frida" if env is None else "fridac"
    key = host.add_user(user)
    first = terms(host, user, key, env=env)
    _start_work(first, "frozen")
    pid = first.ssh_pid()
    assert pid is not None
    frozen(pid)  # a laptop lid closed: the server still holds the connection
    time.sleep(2)
    assert _tmux_as(
        host, user, "list-sessions", "-F", "#{session_name} #{session_attached}"
    ).stdout.split() == ["main", "1"]
    _a_new_login_takes_over(host, terms, user, key, env, "frozen")
    assert (
        subprocess.run(["pgrep", "-u", host.passwd(user)[2], "-x", "sleep"], capture_output=True).returncode
        == 0
    )
    # The laptop wakes up: its terminal was detached, not the session ended.
    os.kill(pid, signal.SIGCONT)
    first.wait_for("detached")


@pytest.fixture
def dropped():
    """Drop every packet of one TCP connection, both ways (a Wi-Fi gone, a VPN cut):
    iptables rules of this test's own, by comment, removed at the end."""
    tag = f"mtgpu-test-drop-{os.getpid()}"
    rules: list[list[str]] = []

    def drop(client_port: int, server_port: int) -> None:
        for sport, dport in ((client_port, server_port), (server_port, client_port)):
            rule = ["INPUT", "-p", "tcp", "--sport", str(sport), "--dport", str(dport)]
            rule += ["-m", "comment", "--comment", tag, "-j", "DROP"]
            subprocess.run(["iptables", "-w", "-I", *rule], check=True)
            rules.append(rule)

    yield drop
    for rule in rules:
        subprocess.run(["iptables", "-w", "-D", *rule], check=False)


@pytest.mark.parametrize("env", CLIENT_ENVS)
def test_a_client_whose_packets_are_dropped_then_a_new_login_takes_the_session_over(
    shared_host, terms, dropped, env
):
    import psutil

    host = shared_host
    user = "drew" if env is None else "drewc"
    key = host.add_user(user)
    first = terms(host, user, key, env=env)
    _start_work(first, "dropped")
    pid = first.ssh_pid()
    assert pid is not None
    conn = next(
        c for c in psutil.Process(pid).net_connections("tcp") if c.raddr and c.raddr.port == host.port
    )
    dropped(conn.laddr.port, host.port)  # the server still holds the connection, silent
    time.sleep(2)
    _a_new_login_takes_over(host, terms, user, key, env, "dropped")


@pytest.mark.parametrize("env", CLIENT_ENVS)
def test_two_live_terminals_still_get_their_own_sessions(shared_host, terms, env):
    host = shared_host
    user = "lina" if env is None else "linac"
    key = host.add_user(user)
    a = terms(host, user, key, env=env)
    _start_work(a, "live-a")
    time.sleep(2)  # idle, as the frozen one above: silence alone is not death
    b = terms(host, user, key, env=env)
    b.type("echo live-$((1))-b")
    b.wait_for("live-1-b")
    assert sorted(_tmux_as(host, user, "list-sessions", "-F", "#{session_name}").stdout.split()) == [
        "2",
        "main",
    ]
    assert "live-a-42" in a.screen() and "took over" not in b.screen()
    assert sorted(_tmux_as(host, user, "list-clients", "-F", "#{client_session}").stdout.split()) == [
        "2",
        "main",
    ]


# ------------------------------------------------------------ never stranded

BROKEN_TMUX = "#!/bin/sh\necho 'tmux: simulated breakage' >&2\nexit 1\n"


def test_a_broken_tmux_gives_a_plain_shell_and_one_log_line(make_host, terms):
    host = make_host()
    key = host.add_user("stran")
    broken = host.run_dir / "bin" / "tmux"  # first on tenants' PATH
    broken.write_text(BROKEN_TMUX)
    broken.chmod(0o755)
    for attempt in range(2):
        t = terms(host, "stran", key)
        screen = t.wait_for("`mt-attach` lists your terminals")
        assert "your terminal could not open tmux" in screen
        assert "Traceback" not in screen
        t.type(f"echo shell-{attempt}-$((6*7))")
        t.wait_for(f"shell-{attempt}-42")
        t.close()
    deadline = time.time() + 10
    while "fell back to a plain shell" not in host.log() and time.time() < deadline:
        time.sleep(0.2)
    lines = [line for line in host.log().splitlines() if "fell back to a plain shell" in line]
    assert len(lines) == 1, lines  # once, though it happened twice
    assert "stran" in lines[0]


# ------------------------------------------------------------ inside a session

KEYS_PY = r"""
import os, sys, termios, tty
old = termios.tcgetattr(0)
tty.setraw(0)
os.write(1, b"\x1b[>4;1m")  # ask for extended keys, as Claude Code and Codex CLI do
os.write(1, b"keys-ready\r\n")
data = b""
while b"q" not in data:
    data += os.read(0, 100)
termios.tcsetattr(0, termios.TCSADRAIN, old)
os.write(1, b"\x1b[>4m")
print("got:" + data.hex())
"""


def test_session_defaults_colour_clipboard_and_modified_keys_reach_the_terminal(shared_host, terms):
    host = shared_host
    key = host.add_user("cole")
    r = host.ssh("cole", key, "cat > ~/keys.py", input=KEYS_PY.encode())
    assert r.returncode == 0, r.stderr
    env = {
        "PATH": CLIENT_PATH,
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "COLORTERM": "truecolor",
        "TERM_PROGRAM": "iTerm.app",
    }
    t = terms(host, "cole", key, env=env, opts=["-o", "SendEnv=COLORTERM TERM_PROGRAM"])
    t.tmux("set-option", "-g", "set-clipboard", "on")  # the laptop's terminal takes OSC 52
    t.type("echo env-$COLORTERM")
    t.wait_for("env-truecolor")
    # tmux names itself in its panes' TERM_PROGRAM; the laptop's is in its environment.
    assert (
        _tmux_as(host, "cole", "show-environment", "-g", "TERM_PROGRAM").stdout.strip()
        == "TERM_PROGRAM=iTerm.app"
    )
    show = {
        o: _tmux_as(host, "cole", "show", "-gv", o).stdout.strip()
        for o in ("escape-time", "extended-keys", "set-clipboard", "focus-events", "mouse", "window-size")
    }
    assert show == {
        "escape-time": "10",
        "extended-keys": "on",
        "set-clipboard": "on",
        "focus-events": "on",
        "mouse": "on",
        "window-size": "latest",
    }, show
    features = _tmux_as(host, "cole", "show", "-s", "terminal-features").stdout
    assert "xterm*:RGB:extkeys" in features
    client = _tmux_as(host, "cole", "list-clients", "-F", "#{client_termfeatures}").stdout
    assert "RGB" in client and "extkeys" in client, client
    # A 24-bit colour reaches the outer terminal as 24-bit.
    t.type("printf '\\033[38;2;1;2;3mRGB''X\\033[0m\\n'")
    t.wait_for("RGBX")
    colours = t.tmux("capture-pane", "-p", "-e").stdout
    assert "\x1b[38;2;1;2;3mRGBX" in colours, colours
    # OSC 52 from a program reaches the outer terminal's clipboard.
    t.type("printf '\\033]52;c;%s\\a' $(printf hello-clip | base64)")
    deadline = time.time() + 10
    while t.tmux("show-buffer").stdout != "hello-clip" and time.time() < deadline:
        time.sleep(0.1)
    assert t.tmux("show-buffer").stdout == "hello-clip"
    # Shift+Enter as the laptop's terminal sends it (CSI u) reaches the program.
    t.type("/usr/bin/python3 ~/keys.py")
    t.wait_for("keys-ready")
    t.tmux("send-keys", "-l", "\x1b[13;2u")
    time.sleep(0.3)
    t.tmux("send-keys", "-l", "q")
    t.wait_for("got:1b5b31333b327571")


def test_the_tenants_tmux_conf_still_wins_over_the_defaults(shared_host, terms):
    host = shared_host
    key = host.add_user("tina")
    r = host.ssh("tina", key, "printf 'set -g mouse off\\nset -sg escape-time 50\\n' > ~/.tmux.conf")
    assert r.returncode == 0
    t = terms(host, "tina", key)
    t.type("echo in-$((2+2))")
    t.wait_for("in-4")
    assert _tmux_as(host, "tina", "show", "-gv", "mouse").stdout.strip() == "off"
    assert _tmux_as(host, "tina", "show", "-sv", "escape-time").stdout.strip() == "50"


def test_mt_attach_here_is_an_editor_terminal_for_the_workspace_folder(shared_host, terms):
    host = shared_host
    key = host.add_user("vsc")
    host.ssh("vsc", key, "mkdir -p ~/my.proj")
    # What a VS Code terminal profile runs: in the workspace folder, `mt-attach -A`.
    a = terms(host, "vsc", key, "cd ~/my.proj && mt-attach -A")
    a.type("echo vs-$((3*3))")
    a.wait_for("vs-9")
    assert _tmux_as(host, "vsc", "list-sessions", "-F", "#{session_name}").stdout.split() == ["my_proj"]
    # A second editor terminal beside it gets its own; no menu either way.
    b = terms(host, "vsc", key, "cd ~/my.proj && mt-attach -A")
    b.type("echo vs-$((4*4))")
    b.wait_for("vs-16")
    assert sorted(_tmux_as(host, "vsc", "list-sessions", "-F", "#{session_name}").stdout.split()) == [
        "my_proj",
        "my_proj-2",
    ]
    a.kill()
    _detached(host, "vsc", "my_proj")
    c = terms(host, "vsc", key, "cd ~/my.proj && mt-attach -A")
    c.wait_for("vs-9")
    assert "Attach which one?" not in c.screen()


# ------------------------------------------------------------ hostile tenants


def test_a_tenant_pre_creating_tmp_tmux_uid_no_longer_denies_a_terminal(shared_host, terms):
    host = shared_host
    kv = host.add_user("vera")
    km = host.add_user("mal")
    assert host.ssh("vera", kv, "true").returncode == 0  # her account, not yet a terminal
    uid = host.passwd("vera")[2]
    # Mallory takes /tmp/tmux-UID of Vera before Vera's first terminal.
    r = host.ssh("mal", km, f"mkdir -m 700 /tmp/tmux-{uid} && echo ok")
    assert r.stdout.strip() == b"ok", r.stderr
    try:
        t = terms(host, "vera", kv)
        t.type("echo vera-$((5*5))")
        t.wait_for("vera-25")
        assert "is not yours" not in t.screen()
        assert _tmux_as(host, "vera", "list-sessions", "-F", "#{session_name}").stdout.split() == ["main"]
        # RUN_DIR/tmux is root's and closed to writes; Vera's directory is hers alone.
        top, mine = host.run_dir / "tmux", host.run_dir / "tmux" / f"tmux-{uid}"
        assert (top.stat().st_uid, top.stat().st_mode & 0o777) == (0, 0o711)
        assert (mine.stat().st_uid, mine.stat().st_mode & 0o777) == (int(uid), 0o700)
        for probe in (
            f"mkdir {top}/tmux-99999",
            f"ls {mine}",
            f"tmux -S {mine}/mtgpu ls",
            f"ln -s /etc {top}/tmux-{host.passwd('mal')[2]}x",
        ):
            r = host.ssh("mal", km, probe)
            assert r.returncode != 0, probe
    finally:
        host.ssh("mal", km, f"rm -rf /tmp/tmux-{uid}")
