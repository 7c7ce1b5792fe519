"""The program a terminal login runs as the tenant, and ``mt-attach``.

``python -m mtgpu.tmux.attach [NAME]`` runs in the login's pty. It picks a
session (:func:`mtgpu.tmux.terminal.choose`), starting the tenant's tmux server
if needed, and then *execs* the tmux client. The client then owns the pty: the
gateway's window-size changes arrive as SIGWINCH on it, and a dropped
connection hangs up only the client, never the server or what runs in it.

``mt-attach`` (``main_mt_attach``) lists the sessions, or goes straight to one:
``ssh -t host mt-attach NAME``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
from collections.abc import Sequence

import libtmux

from mtgpu.tmux import sessions as tsessions
from mtgpu.tmux.sessions import TerminalError
from mtgpu.tmux.terminal import (
    Action,
    Decision,
    TenantSession,
    choose,
    menu_prompt,
    menu_text,
    parse_choice,
    sessions_table,
    tmux_attach_argv,
    tmux_new_argv,
)


def _prepare_environment() -> None:
    # One socket location for every way in: a TMUX_TMPDIR exported in a shell
    # rc file would otherwise make mt-attach look for another server.
    os.environ.pop("TMUX_TMPDIR", None)


def _inside_our_tmux() -> bool:
    """True when run in a pane of the tenant's MTGPU tmux (attach would nest)."""
    value = os.environ.get("TMUX", "")
    path = value.split(",", 1)[0]
    if not path:
        return False
    ours = os.path.join(tsessions.socket_dir(), tsessions.SOCKET_NAME)
    try:
        return os.path.samefile(path, ours)
    except OSError:
        return False


def _exec(argv: list[str]) -> int:
    # A login warning from the gateway (USER_DISK_LIMIT, say) would be hidden by tmux's
    # screen: show it in the status line too, and keep it out of the session's shells.
    notice = os.environ.pop("MTGPU_LOGIN_NOTICE", "")
    if notice and argv[3:4] != ["switch-client"]:
        argv = [*argv, ";", "display-message", "-d", "20000", "mtgpu: " + notice[:300]]
    tmux = shutil.which(argv[0])
    if tmux is None:
        raise TerminalError("tmux is not installed on this host; ask an admin to install it")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(tmux, argv)
    except OSError as exc:
        raise TerminalError(f"cannot run {tmux}: {exc}") from exc
    return 1  # pragma: no cover - execv does not return


def _need_terminal(how: str) -> None:
    # Checked here so the tenant reads how to fix it, not tmux's "not a terminal".
    if not os.isatty(0):
        raise TerminalError(f"this needs a terminal; {how}")


def _attach(name: str, *, detach_others: bool = False) -> int:
    if _inside_our_tmux():
        return _exec(tmux_attach_argv(name, switch=True))
    return _exec(tmux_attach_argv(name, detach_others=detach_others))


def _new(server: libtmux.Server, name: str, running: Sequence[TenantSession]) -> int:
    me = pwd.getpwuid(os.getuid())
    started = False
    if not server.is_alive():
        for line in tsessions.start_server(server, shell=me.pw_shell, home=me.pw_dir):
            print(f"tmux: {line}", file=sys.stderr)
        started = True
    home = me.pw_dir if os.path.isdir(me.pw_dir) else None
    # A server started with exit-empty off for its first session gets it back on.
    return _exec(tmux_new_argv(name, home, restore_exit_empty=started or not running))


def _ask(decision: Decision) -> Decision | None:
    """Show the menu on the terminal until the answer makes sense; None on EOF."""
    sys.stdout.write(menu_text(decision))
    while True:
        try:
            answer = input(menu_prompt(decision))
        except EOFError:
            print()
            return None
        picked = parse_choice(answer, decision)
        if picked is not None:
            return picked
        print(f"Type a number from 1 to {len(decision.choices)}, n, or press Enter.")


def _missing(name: str, running: Sequence[TenantSession]) -> TerminalError:
    if not running:
        return TerminalError(f"no terminal session named {name!r}; you have none yet: "
                             "log in with `ssh -t HOST` to start one")
    names = ", ".join(s.name for s in running)
    return TerminalError(f"no terminal session named {name!r}; yours are: {names}")


def login(name: str | None = None, *, detach_others: bool = False) -> int:
    """Attach a terminal login to the right session (or to ``name``)."""
    _prepare_environment()
    server = tsessions.tenant_server()
    running = tsessions.list_sessions(server)
    if name is not None:
        if not any(s.name == name for s in running):
            raise _missing(name, running)
        _need_terminal(f"use `ssh -t HOST mt-attach {name}`")
        return _attach(name, detach_others=detach_others)
    _need_terminal("connect with `ssh -t HOST`")
    decision = choose(running)
    if decision.action is Action.MENU:
        picked = _ask(decision)
        if picked is None:
            return 0
        decision = picked
        # The menu waited on a human: the picked session may be gone by now.
        if decision.action is Action.ATTACH and not server.has_session(decision.name):
            raise _missing(decision.name, tsessions.list_sessions(server))
    if decision.action is Action.ATTACH:
        return _attach(decision.name)
    return _new(server, decision.name, running)


def print_sessions() -> int:
    """``mt-attach`` without a name: list the tenant's terminal sessions."""
    _prepare_environment()
    sys.stdout.write(sessions_table(tsessions.list_sessions(tsessions.tenant_server())))
    return 0


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Attach one of your terminal sessions (tmux on MTGPU's socket).")
    p.add_argument("-d", "--detach-others", action="store_true",
                   help="detach other terminals attached to NAME (for example a dropped one)")
    p.add_argument("name", nargs="?", metavar="NAME", help="the session to attach")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtgpu.tmux.attach [NAME]``: what a terminal login runs."""
    args = _parser("mtgpu.tmux.attach").parse_args(argv)
    try:
        return login(args.name, detach_others=args.detach_others)
    except TerminalError as exc:
        print(f"mtgpu: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main_mt_attach(argv: Sequence[str] | None = None) -> int:
    """``mt-attach [-d] [NAME]``: list the sessions, or attach ``NAME``."""
    args = _parser("mt-attach").parse_args(argv)
    try:
        if args.name is None:
            return print_sessions()
        return login(args.name, detach_others=args.detach_others)
    except TerminalError as exc:
        print(f"mt-attach: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
