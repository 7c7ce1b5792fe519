"""The tenant's tmux server on MTGPU's socket, seen and started through libtmux.

Everything here runs as the tenant, never as root.

**Why another tenant cannot attach.** The server listens on ``tmux -L mtgpu``,
which tmux places at ``/tmp/tmux-UID/mtgpu``. tmux creates ``/tmp/tmux-UID``
with mode 0700 and refuses to use it unless it is a directory owned by the
calling uid with no access for others. The socket inside is mode 0660 for the
tenant's own (private) group, and tmux 3.3 and later also check the connecting
uid against the server's access list, which holds only the owner and root
(``server-access``). So the kernel stops tenant B at the directory
(``Permission denied``) before tmux even sees a connection, whatever path B
names with ``-S``. The flip side: if someone else creates ``/tmp/tmux-UID``
first, tmux refuses it, and :func:`explain` tells the tenant to have an admin
remove it.

**Why the server outlives the daemon.** tmux forks its server off and
daemonizes it: a new session, stdio on ``/dev/null``, parent init. Killing the
login, its process group or ``mtgpu-server`` itself leaves it and its panes
running.
"""

from __future__ import annotations

import os
import pwd
import re

import libtmux
from libtmux import exc as tmux_exc

from mtgpu.errors import MtgpuError
from mtgpu.tmux.terminal import SOCKET_NAME, TenantSession

# Scrollback lines per pane; tmux's default of 2000 is short for training logs.
HISTORY_LIMIT = 50000
# Copied from each attaching client into the session, so shells started later
# see the connection they were opened from (tmux already lists SSH_CONNECTION
# by default; this makes sure of both).
UPDATE_ENVIRONMENT = ("SSH_CONNECTION", "SSH_CLIENT")


class TerminalError(MtgpuError):
    """A tenant's terminal session cannot be listed, started or attached."""


def tenant_server() -> libtmux.Server:
    """The calling tenant's tmux server on MTGPU's socket (it may not be running).

    ``-f /dev/null``: the tenant's own tmux configuration is sourced by
    :func:`start_server` *after* MTGPU's defaults, so the tenant's settings win.
    """
    return libtmux.Server(socket_name=SOCKET_NAME, config_file="/dev/null")


def socket_dir(uid: int | None = None) -> str:
    """Where tmux keeps the tenant's sockets (``TMUX_TMPDIR`` is cleared at start)."""
    return os.path.join("/tmp", f"tmux-{os.getuid() if uid is None else uid}")


def list_sessions(server: libtmux.Server) -> list[TenantSession]:
    """The tenant's sessions; empty when no server runs."""
    out = []
    try:
        sessions = list(server.sessions)
    except tmux_exc.TmuxCommandNotFound as exc:
        raise TerminalError("tmux is not installed on this host; ask an admin to "
                            "install it") from exc
    for s in sessions:
        command = ""
        try:
            pane = s.active_pane
            command = (pane.pane_current_command or "") if pane is not None else ""
        except tmux_exc.LibTmuxException:
            pass  # the session ended while being listed; show it without a command
        out.append(TenantSession(
            name=s.session_name or "", windows=_int(s.session_windows),
            attached=_int(s.session_attached), created=_int(s.session_created),
            last_attached=_int(s.session_last_attached), command=command))
    return out


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def config_files(home: str, environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """The configuration files tmux itself would read, in its order, that exist."""
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    paths = ["/etc/tmux.conf", os.path.join(home, ".tmux.conf"),
             os.path.join(xdg, "tmux", "tmux.conf"), os.path.join(home, ".config", "tmux", "tmux.conf")]
    seen: list[str] = []
    for p in paths:
        if p not in seen and os.path.isfile(p):
            seen.append(p)
    return seen


def start_server(server: libtmux.Server, *, shell: str | None = None,
                 home: str | None = None) -> list[str]:
    """Start the tenant's tmux server with MTGPU's defaults; return config warnings.

    The server is left with ``exit-empty off`` so it lives until the first
    session exists; the command that creates that session turns it back on
    (:func:`mtgpu.tmux.terminal.tmux_new_argv`).
    """
    me = pwd.getpwuid(os.getuid())
    shell = shell or me.pw_shell
    home = home or me.pw_dir
    argv = ["start-server", ";", "set-option", "-g", "exit-empty", "off",
            ";", "set-option", "-g", "history-limit", str(HISTORY_LIMIT)]
    if shell and os.path.isabs(shell) and os.access(shell, os.X_OK):
        argv += [";", "set-option", "-g", "default-shell", shell]
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
        raise TerminalError("tmux is not installed on this host; ask an admin to "
                            "install it") from exc


def _array_option(server: libtmux.Server, option: str) -> list[str]:
    # "update-environment[3] SSH_AUTH_SOCK" -> "SSH_AUTH_SOCK"
    proc = _cmd(server, "show-options", "-g", option)
    return [m.group(1) for line in proc.stdout
            if (m := re.match(rf"{re.escape(option)}\[\d+\]\s+(\S+)", line))]


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
        return (f"{d}, where your terminals' tmux socket lives, is not yours "
                f"(owner uid {st.st_uid}); ask an admin to remove it, then log in again")
    if st.st_mode & 0o007:
        return f"{d} is open to other users; run `chmod 700 {d}` and log in again"
    return f"tmux could not start ({detail})"
