"""``python -m mtgpu.tmux.window``: run a command in a window of the tenant's tmux, then
attach to it (``mt-container shell`` on a terminal).

``mt-container`` only talks to the API; once it knows the command to run (``podman
exec`` into the workspace) it execs this program, which owns the tenant's tmux the way
:mod:`mtgpu.tmux.attach` does for logins. Inside the tenant's tmux already, the command
opens in a new window of the current session instead of nesting a client.

    python -m mtgpu.tmux.window SESSION WINDOW DIR COMMAND [--new-window]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mtgpu.tmux import sessions as ts
from mtgpu.tmux.terminal import tmux_attach_argv


def inside_tenant_tmux() -> bool:
    """True when run in a pane of the tenant's MTGPU tmux (attaching would nest)."""
    path = os.environ.get("TMUX", "").split(",", 1)[0]
    try:
        return bool(path) and os.path.samefile(path, ts.socket_path())
    except OSError:
        return False


def open_window(session: str, window: str, cwd: str, command: str, *, new_window: bool) -> list[str]:
    """Start ``command`` (a shell line) in ``session`` (made if missing) and return the
    argv that attaches to it, or ``[]`` when run inside the tenant's tmux (the window
    opened in the current session). ``new_window``: add a window to an existing session
    rather than just attach to it."""
    ts.prepare_environment()
    server = ts.tenant_server()
    if inside_tenant_tmux():
        ts._cmd(server, "new-window", "-n", window, "-c", cwd, command)
        return []
    started = False
    if not server.is_alive():
        ts.start_server(server)
        started = True
    if not ts.has_session(server, session):
        ts._cmd(server, "new-session", "-d", "-s", session, "-n", window, "-c", cwd, command)
    elif new_window:
        ts._cmd(server, "new-window", "-t", f"={session}:", "-n", window, "-c", cwd, command)
    if started:
        ts._cmd(server, "set-option", "-g", "exit-empty", "on")
    return tmux_attach_argv(session, socket=ts.socket_args())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtgpu.tmux.window", description=__doc__.split("\n")[0])
    p.add_argument("session")
    p.add_argument("window")
    p.add_argument("cwd")
    p.add_argument("command")
    p.add_argument("--new-window", action="store_true")
    args = p.parse_args(argv)
    attach = open_window(args.session, args.window, args.cwd, args.command, new_window=args.new_window)
    if attach:
        os.execvp(attach[0], attach)
    return 0


if __name__ == "__main__":
    sys.exit(main())
