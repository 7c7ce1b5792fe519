"""The tenant's tmux server on MTGPU's socket, seen and started through libtmux.

Everything here runs as the tenant, never as root.

**Where the socket is, and why another tenant cannot reach it.** The daemon
makes ``RUN_DIR/tmux`` (root's, mode 0711) and in it ``tmux-UID`` (the
tenant's, mode 0700) through directory descriptors
(:func:`mtgpu.tmux.runtime.ensure_socket_dir`) and names the parent in
``MTGPU_TMUX_DIR``; the server listens on ``RUN_DIR/tmux/tmux-UID/mtgpu``.
Nobody but root can create anything in ``RUN_DIR/tmux``, so no tenant can
take another's directory first (as anyone can with ``/tmp/tmux-UID``), and
the kernel stops tenant B at A's 0700 directory (``Permission denied``)
before tmux even sees a connection. tmux 3.3 and later also check the
connecting uid against the server's access list (``server-access``). Without
that directory (``mtgpu-shell`` behind OpenSSH, say) tmux's own place,
``/tmp/tmux-UID``, is used, and :func:`explain` says what to do if someone
else made it.

**Why the server outlives the daemon.** tmux forks its server off and
daemonizes it: a new session, stdio on ``/dev/null``, parent init. Killing the
login, its process group or ``mtgpu-server`` itself leaves it and its panes
running.

**Why the output is read as UTF-8.** tmux writes ``_`` for every non-ASCII
character to a client whose locale is not UTF-8, libtmux's field separator
included. Every command whose output is parsed here runs as a UTF-8 client
(:func:`utf8_client`); the tenant's own client keeps the tenant's locale.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
from collections.abc import Iterator, Sequence

import libtmux
from libtmux import exc as tmux_exc

from mtgpu.errors import MtgpuError
from mtgpu.tmux.terminal import DEFAULT_SOCKET, SOCKET_NAME, TenantClient, TenantSession

#: Set by the daemon in every tenant session: the root-made parent of the tenants'
#: socket directories (RUN_DIR/tmux).
TMUX_DIR_ENV = "MTGPU_TMUX_DIR"

# Scrollback lines per pane; tmux's default of 2000 is short for training logs.
HISTORY_LIMIT = 50000
# Copied from each attaching client into the session, so shells started later
# see the connection they were opened from (tmux already lists SSH_CONNECTION
# by default; this makes sure of both).
UPDATE_ENVIRONMENT = ("SSH_CONNECTION", "SSH_CLIENT", "COLORTERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION")
#: MTGPU's defaults, set before the tenant's own files are read (so those win).
#: Each is explained in the manual's terminal section.
DEFAULT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("escape-time", "10"),  # Esc in vim and other TUIs without tmux's 500 ms wait
    ("extended-keys", "on"),  # Shift+Enter and other modified keys, as CSI u
    ("set-clipboard", "on"),  # OSC 52 copy from programs reaches the laptop
    ("focus-events", "on"),
    ("mouse", "on"),  # the wheel scrolls history instead of the shell's
    ("window-size", "latest"),  # a reconnect from another terminal size resizes
)
#: Outer terminals told to have 24-bit colour and extended keys (tmux knows
#: xterm's clipboard and focus already); COLORTERM=truecolor adds RGB for any.
TERMINAL_FEATURES = ("xterm*:RGB:extkeys",)
_TERMINFO_DIRS = (
    "/etc/terminfo",
    "/lib/terminfo",
    "/usr/share/terminfo",
    "/usr/lib/terminfo",
    "/usr/local/share/terminfo",
)


class TerminalError(MtgpuError):
    """A tenant's terminal session cannot be listed, started or attached."""


def tenant_server() -> libtmux.Server:
    """The calling tenant's tmux server on MTGPU's socket (it may not be running).

    ``-f /dev/null``: the tenant's own tmux configuration is sourced by
    :func:`start_server` *after* MTGPU's defaults, so the tenant's settings win.
    """
    args = socket_args()
    if args[0] == "-S":
        return libtmux.Server(socket_path=args[1], config_file="/dev/null")
    return libtmux.Server(socket_name=SOCKET_NAME, config_file="/dev/null")


def tmux_root() -> str | None:
    """``RUN_DIR/tmux`` when this session was given one that holds our directory."""
    base = os.environ.get(TMUX_DIR_ENV, "")
    if base and os.path.isabs(base) and os.path.isdir(os.path.join(base, f"tmux-{os.getuid()}")):
        return base
    return None


def socket_dir(uid: int | None = None) -> str:
    """The directory of the tenant's socket: ``RUN_DIR/tmux/tmux-UID`` where the daemon
    made it, else tmux's own ``/tmp/tmux-UID`` (``TMUX_TMPDIR`` is not followed)."""
    uid = os.getuid() if uid is None else uid
    root = tmux_root() if uid == os.getuid() else None
    return os.path.join(root or "/tmp", f"tmux-{uid}")


def socket_path() -> str:
    return os.path.join(socket_dir(), SOCKET_NAME)


def socket_args() -> tuple[str, ...]:
    """How tmux commands name the tenant's server: ``-S PATH`` in the daemon's
    directory, else ``-L mtgpu`` (tmux then makes /tmp/tmux-UID itself)."""
    return ("-S", socket_path()) if tmux_root() else DEFAULT_SOCKET


def prepare_environment() -> None:
    """The environment every tmux command of a login starts from.

    One socket location for every way in: a ``TMUX_TMPDIR`` exported in a shell rc
    file would otherwise point plain ``tmux -L mtgpu`` elsewhere; in the daemon's
    directory it is set, so the tenant's own ``tmux -L mtgpu`` finds the server.
    """
    root = tmux_root()
    if root:
        os.environ["TMUX_TMPDIR"] = root
    else:
        os.environ.pop("TMUX_TMPDIR", None)


_UTF8 = {"LC_ALL": None, "LC_CTYPE": "C.UTF-8"}


@contextlib.contextmanager
def utf8_client() -> Iterator[None]:
    """Run the tmux commands inside as a UTF-8 client, whatever the tenant's locale.

    tmux decides from ``LC_ALL``, ``LC_CTYPE`` and ``LANG`` (the first set) whether
    its client may be sent UTF-8; only for the commands inside is it told yes.
    """
    saved = {k: os.environ.get(k) for k in _UTF8}
    for k, v in _UTF8.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def list_sessions(server: libtmux.Server) -> list[TenantSession]:
    """The tenant's sessions; empty when no server runs."""
    out = []
    with utf8_client():
        try:
            sessions = list(server.sessions)
        except tmux_exc.TmuxCommandNotFound as exc:
            raise TerminalError("tmux is not installed on this host; ask an admin to install it") from exc
        except tmux_exc.LibTmuxException as exc:
            detail = " ".join(str(exc).split())[:200]
            raise TerminalError(
                f"tmux does not work on this host ({detail}); ask an admin to check it"
            ) from exc
        for s in sessions:
            command = ""
            try:
                pane = s.active_pane
                command = (pane.pane_current_command or "") if pane is not None else ""
            except tmux_exc.LibTmuxException:
                pass  # the session ended while being listed; show it without a command
            out.append(
                TenantSession(
                    name=s.session_name or "",
                    windows=_int(s.session_windows),
                    attached=_int(s.session_attached),
                    created=_int(s.session_created),
                    last_attached=_int(s.session_last_attached),
                    command=command,
                )
            )
    return out


def list_clients(server: libtmux.Server) -> list[TenantClient]:
    """The terminals attached to the tenant's sessions (none when no server runs)."""
    with utf8_client():
        # The session name goes last: it is the one field that may hold spaces.
        proc = _cmd(server, "list-clients", "-F", "#{client_activity} #{client_tty} #{client_session}")
    out = []
    for line in proc.stdout if proc.returncode == 0 else ():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1].startswith("/"):
            out.append(TenantClient(tty=parts[1], session=parts[2], activity=_int(parts[0])))
    return out


def has_session(server: libtmux.Server, name: str) -> bool:
    with utf8_client():
        return _cmd(server, "has-session", "-t", f"={name}").returncode == 0


def detach_clients(server: libtmux.Server, ttys: Sequence[str]) -> None:
    """Detach the clients on ``ttys`` (their connections stopped answering)."""
    for tty in ttys:
        _cmd(server, "detach-client", "-t", tty)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def config_files(home: str, environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """The configuration files tmux itself would read, in its order, that exist."""
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    paths = [
        "/etc/tmux.conf",
        os.path.join(home, ".tmux.conf"),
        os.path.join(xdg, "tmux", "tmux.conf"),
        os.path.join(home, ".config", "tmux", "tmux.conf"),
    ]
    seen: list[str] = []
    for p in paths:
        if p not in seen and os.path.isfile(p):
            seen.append(p)
    return seen


def start_server(server: libtmux.Server, *, shell: str | None = None, home: str | None = None) -> list[str]:
    """Start the tenant's tmux server with MTGPU's defaults; return config warnings.

    The server is left with ``exit-empty off`` so it lives until the first
    session exists; the command that creates that session turns it back on
    (:func:`mtgpu.tmux.terminal.tmux_new_argv`).
    """
    me = pwd.getpwuid(os.getuid())
    shell = shell or me.pw_shell
    home = home or me.pw_dir
    argv = [
        "start-server",
        ";",
        "set-option",
        "-g",
        "exit-empty",
        "off",
        ";",
        "set-option",
        "-g",
        "history-limit",
        str(HISTORY_LIMIT),
    ]
    for option, value in DEFAULT_OPTIONS:
        argv += [";", "set-option", "-g", option, value]
    for feature in TERMINAL_FEATURES:
        argv += [";", "set-option", "-as", "terminal-features", feature]
    if has_terminfo("tmux-256color"):
        # Italics and 256 colours inside, where the terminfo entry exists.
        argv += [";", "set-option", "-g", "default-terminal", "tmux-256color"]
    if shell and os.path.isabs(shell) and os.access(shell, os.X_OK):
        argv += [";", "set-option", "-g", "default-shell", shell]
    # Started in the tenant's own environment: the server passes it (locale
    # included) to every shell it starts.
    proc = _cmd(server, *argv)
    if proc.returncode != 0:
        raise TerminalError(explain(proc.stderr))
    have = _array_option(server, "update-environment")
    for name in UPDATE_ENVIRONMENT:
        if name not in have:
            _cmd(server, "set-option", "-ga", "update-environment", name)
    warnings = []
    for path in config_files(home, os.environ):
        # A broken file is reported, not fatal: the terminal still opens, as
        # tmux itself does with a bad ~/.tmux.conf.
        warnings += _cmd(server, "source-file", "-q", path).stderr
    return warnings


def _cmd(server: libtmux.Server, cmd: str, *args: str) -> libtmux.common.tmux_cmd:
    try:
        return server.cmd(cmd, *args)
    except tmux_exc.TmuxCommandNotFound as exc:
        raise TerminalError("tmux is not installed on this host; ask an admin to install it") from exc


def has_terminfo(term: str) -> bool:
    """Whether this host can drive a terminal of type ``term`` (tmux refuses one it
    has no terminfo entry for: ``missing or unsuitable terminal``)."""
    if not term or "/" in term or term.startswith("."):
        return False
    home = os.environ.get("HOME", "")
    extra = [os.environ.get("TERMINFO", ""), *os.environ.get("TERMINFO_DIRS", "").split(":")]
    dirs = [*(d for d in extra if d), *_TERMINFO_DIRS, *([os.path.join(home, ".terminfo")] if home else [])]
    for d in dirs:
        for sub in (term[0], f"{ord(term[0]):x}"):
            if os.path.exists(os.path.join(d, sub, term)):
                return True
    return False


def _array_option(server: libtmux.Server, option: str) -> list[str]:
    # "update-environment[3] SSH_AUTH_SOCK" -> "SSH_AUTH_SOCK"
    with utf8_client():
        proc = _cmd(server, "show-options", "-g", option)
    return [
        m.group(1) for line in proc.stdout if (m := re.match(rf"{re.escape(option)}\[\d+\]\s+(\S+)", line))
    ]


def explain(stderr: list[str] | str, uid: int | None = None) -> str:
    """A message saying why tmux failed and what to do, from its stderr."""
    detail = stderr if isinstance(stderr, str) else " ".join(stderr)
    detail = detail.strip() or "no error message"
    uid = os.getuid() if uid is None else uid
    d = socket_dir(uid)
    try:
        st = os.lstat(d)
    except OSError:
        return f"tmux could not start ({detail})"
    if st.st_uid != uid or not os.path.isdir(d) or os.path.islink(d):
        return (
            f"{d}, where your terminals' tmux socket lives, is not yours "
            f"(owner uid {st.st_uid}); ask an admin to remove it, then log in again"
        )
    if st.st_mode & 0o007:
        return f"{d} is open to other users; run `chmod 700 {d}` and log in again"
    return f"tmux could not start ({detail})"
