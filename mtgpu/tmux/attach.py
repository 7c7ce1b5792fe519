"""The program a terminal login runs as the tenant, and ``mt-attach``.

``python -m mtgpu.tmux.attach [NAME]`` runs in the login's pty. It picks a
session (:func:`mtgpu.tmux.terminal.choose`), starting the tenant's tmux server
if needed, and then *execs* the tmux client. The client then owns the pty: the
gateway's window-size changes arrive as SIGWINCH on it, and a dropped
connection hangs up only the client, never the server or what runs in it.

Sessions whose only clients are on connections that stopped answering (asked of
the daemon, which probes them: ``terminal.dead``) count as detached, so the
login lands in the session the tenant was using and takes it over.

**A login never strands anyone.** Whatever goes wrong before tmux runs (tmux
missing or broken, a socket problem, a bug), the tenant gets a plain login shell
with one line saying why and how to reach the sessions, and the daemon logs the
cause once (``terminal.failed``); no traceback reaches the terminal.

``mt-attach`` (``main_mt_attach``) lists the sessions, or goes straight to one:
``ssh -t host mt-attach NAME``. ``mt-attach -A`` attaches or makes the session
named for the current directory, without the menu: a VS Code terminal profile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import sys
from collections.abc import Sequence

import libtmux

from mtgpu.cmdline import with_examples
from mtgpu.tmux import sessions as tsessions
from mtgpu.tmux.sessions import TerminalError
from mtgpu.tmux.terminal import (
    Action,
    Decision,
    Takeover,
    TenantSession,
    choose,
    menu_prompt,
    menu_text,
    parse_choice,
    reclaim,
    sessions_table,
    takeover_message,
    tmux_attach_argv,
    tmux_new_argv,
    workspace_session,
)

#: How long the daemon may take to say which terminals are dead. It answers within
#: about a second (mtgpu.gateway.liveness.ANSWER_DEADLINE); this is for a daemon
#: under load, where giving up would put the login in a new, empty session.
_ASK_TIMEOUT = 20.0
#: How long a message stays in tmux's status line, in milliseconds.
_NOTE_MS = 15000
_FALLBACK_TERM = "xterm-256color"


def _inside_our_tmux() -> bool:
    """True when run in a pane of the tenant's MTGPU tmux (attach would nest)."""
    value = os.environ.get("TMUX", "")
    path = value.split(",", 1)[0]
    if not path:
        return False
    try:
        return os.path.samefile(path, tsessions.socket_path())
    except OSError:
        return False


def _client_options() -> list[str]:
    """tmux client options for this terminal (before the command)."""
    if os.environ.get("COLORTERM", "").lower() in ("truecolor", "24bit"):
        return ["-T", "RGB"]  # the terminal said it draws 24-bit colour
    return []


#: Said in the status line once the terminal is attached.
_notes: list[str] = []


def _check_terminal_type() -> None:
    term = os.environ.get("TERM", "")
    if term and not tsessions.has_terminfo(term):
        # tmux would refuse the terminal ("missing or unsuitable terminal").
        os.environ["TERM"] = _FALLBACK_TERM
        _notes.append(f"this host does not know the terminal type {term!r}; using {_FALLBACK_TERM}")


def _exec(argv: list[str], notes: Sequence[str] = ()) -> int:
    # A login warning from the gateway (USER_DISK_LIMIT, say) would be hidden by tmux's
    # screen: show it in the status line too, and keep it out of the session's shells.
    notes = [*_notes, *notes]
    notice = os.environ.pop("MTGPU_LOGIN_NOTICE", "")
    if notice:
        notes.append(notice[:300])
    switching = "switch-client" in argv
    opts = [] if switching else _client_options()
    argv = [argv[0], *opts, *argv[1:]]
    if notes and not switching:
        # '#' starts a format in display-message; the text is shown as it is.
        text = "mtgpu: " + "; ".join(notes).replace("#", "##")
        argv = [*argv, ";", "display-message", "-d", str(_NOTE_MS), text]
    tmux = shutil.which(argv[0])
    if tmux is None:
        raise TerminalError("tmux is not installed on this host; ask an admin to install it")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # Bytes, encoded as UTF-8 whatever the locale: tmux keeps names in UTF-8.
        os.execv(tmux, [a.encode("utf-8", "surrogateescape") for a in argv])
    except OSError as exc:
        raise TerminalError(f"cannot run {tmux}: {exc}") from exc
    return 1  # pragma: no cover - execv does not return


def _need_terminal(how: str) -> None:
    # Checked here so the tenant reads how to fix it, not tmux's "not a terminal".
    if not os.isatty(0):
        raise TerminalError(f"this needs a terminal; {how}")


def _attach(
    server: libtmux.Server, name: str, *, detach_others: bool = False, takeover: Takeover | None = None
) -> int:
    socket = tsessions.socket_args()
    if _inside_our_tmux():
        return _exec(tmux_attach_argv(name, switch=True, socket=socket))
    notes = []
    if takeover is not None:
        tsessions.detach_clients(server, takeover.ttys)
        notes.append(takeover_message(takeover))
    return _exec(tmux_attach_argv(name, detach_others=detach_others, socket=socket), notes)


def _new(
    server: libtmux.Server, name: str, running: Sequence[TenantSession], workdir: str | None = None
) -> int:
    me = pwd.getpwuid(os.getuid())
    started = False
    if not server.is_alive():
        for line in tsessions.start_server(server, shell=me.pw_shell, home=me.pw_dir):
            print(f"tmux: {line}", file=sys.stderr)
        started = True
    home = workdir or (me.pw_dir if os.path.isdir(me.pw_dir) else None)
    # A server started with exit-empty off for its first session gets it back on.
    return _exec(
        tmux_new_argv(name, home, restore_exit_empty=started or not running, socket=tsessions.socket_args())
    )


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
        return TerminalError(
            f"no terminal session named {name!r}; you have none yet: log in with `ssh -t HOST` to start one"
        )
    names = ", ".join(s.name for s in running)
    return TerminalError(f"no terminal session named {name!r}; yours are: {names}")


def _api(timeout: float = _ASK_TIMEOUT):  # type: ignore[no-untyped-def]
    from mtgpu.api.client import ApiClient

    path = os.environ.get("MTGPU_API_SOCKET")
    return ApiClient(path, timeout=timeout) if path else None


def dead_terminals(ttys: Sequence[str]) -> set[str]:
    """Which of these terminals the daemon finds on connections that stopped answering.

    Without an answer (no daemon to ask, an old one) every terminal counts as live:
    the login then behaves as if each were in use.
    """
    if not ttys:
        return set()
    try:
        api = _api()
        if api is None:
            return set()
        answer = api.call("terminal.dead", ttys=list(ttys))
        return {t for t in answer.get("dead", []) if isinstance(t, str)}
    except Exception:  # noqa: BLE001 - a question about liveness never stops a login
        return set()


def _view(server: libtmux.Server) -> tuple[list[TenantSession], list[TenantSession], dict[str, Takeover]]:
    """The sessions, as they are and as a login sees them (dead clients discounted)."""
    running = tsessions.list_sessions(server)
    if not any(s.attached for s in running):
        return running, running, {}
    clients = tsessions.list_clients(server)
    view, takeovers = reclaim(running, clients, dead_terminals([c.tty for c in clients]))
    return running, view, takeovers


def login(name: str | None = None, *, detach_others: bool = False, folder: str | None = None) -> int:
    """Attach a terminal login to the right session (or to ``name``).

    ``folder``: attach or make the session named for that directory, no menu.
    """
    tsessions.prepare_environment()
    if not _inside_our_tmux():
        _check_terminal_type()
    server = tsessions.tenant_server()
    running, view, takeovers = _view(server)
    if name is not None and folder is None:
        if not any(s.name == name for s in running):
            raise _missing(name, running)
        _need_terminal(f"use `ssh -t HOST mt-attach {name}`")
        return _attach(server, name, detach_others=detach_others, takeover=takeovers.get(name))
    _need_terminal("connect with `ssh -t HOST`")
    if folder is not None:
        decision = (
            workspace_session(folder, view)
            if name is None
            else Decision(Action.ATTACH if any(s.name == name for s in running) else Action.NEW, name)
        )
    else:
        decision = choose(view)
    if decision.action is Action.MENU:
        picked = _ask(decision)
        if picked is None:
            return 0
        decision = picked
        # The menu waited on a human: the picked session may be gone by now.
        if decision.action is Action.ATTACH and not tsessions.has_session(server, decision.name):
            raise _missing(decision.name, tsessions.list_sessions(server))
    if decision.action is Action.ATTACH:
        return _attach(server, decision.name, takeover=takeovers.get(decision.name))
    return _new(server, decision.name, running, workdir=folder)


def print_sessions() -> int:
    """``mt-attach`` without a name: list the tenant's terminal sessions."""
    tsessions.prepare_environment()
    sys.stdout.write(sessions_table(tsessions.list_sessions(tsessions.tenant_server())))
    return 0


# ------------------------------------------------------------ never stranded

FALLBACK_HINT = (
    "this plain shell ends when you disconnect; `mt-attach` lists your terminals, `mt-attach NAME` opens one"
)


def fall_back_to_shell(reason: str) -> int:
    """Say why in one line, have the daemon log it, and become a login shell."""
    reason = " ".join(reason.split())[:300] or "unknown error"
    # The shell matters more than the message or the log line.
    with contextlib.suppress(Exception):
        sys.stderr.write(f"mtgpu: your terminal could not open tmux ({reason}); {FALLBACK_HINT}\r\n")
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        api = _api(timeout=3.0)
        if api is not None:
            api.call("terminal.failed", reason=reason)
    shells = [pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh", "/bin/sh"]
    for shell in shells:
        try:
            os.execv(shell, ["-" + os.path.basename(shell)])  # a login shell, as sshd starts
        except OSError:
            continue
    return 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TerminalError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


_MT_ATTACH = (
    "import sys; from mtgpu.tmux.attach import main_mt_attach; sys.exit(main_mt_attach(sys.argv[1:]))"
)


def _utf8_mode(argv: Sequence[str] | None, code: str | None) -> None:
    """Run again in Python's UTF-8 mode where the locale's encoding is another.

    Arguments to tmux (libtmux's field separator among them) and session names
    must be UTF-8; in an ISO-8859-1 locale Python could not even pass them.
    """
    if sys.flags.utf8_mode or sys.getfilesystemencoding().lower().replace("-", "") == "utf8":
        return
    args = list(sys.argv[1:] if argv is None else argv)
    how = ["-c", code] if code else ["-m", "mtgpu.tmux.attach"]
    with contextlib.suppress(OSError):
        os.execv(sys.executable, [os.fsencode(a) for a in (sys.executable, "-P", "-X", "utf8", *how, *args)])


def _safe_streams() -> None:
    """Write to the terminal in its own encoding (UTF-8 mode would not), and show what
    it cannot show as '?' instead of failing. In C and POSIX, UTF-8 stays (PEP 540)."""
    import codecs
    import locale

    getencoding = getattr(locale, "getencoding", None)
    encoding = getencoding() if getencoding is not None else "utf-8"
    try:
        if codecs.lookup(encoding).name == "ascii":
            encoding = "utf-8"
    except LookupError:
        encoding = "utf-8"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(encoding=encoding, errors="replace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, LookupError):
            pass


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Attach one of your terminal sessions (tmux on MTGPU's socket)."
    )
    p.add_argument(
        "-d",
        "--detach-others",
        action="store_true",
        help="detach other terminals attached to NAME (for example a dropped one)",
    )
    p.add_argument(
        "-A",
        "--here",
        action="store_true",
        help="attach or make the session named for the current directory (or NAME), "
        "without the menu: for editor terminals such as VS Code's",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="the session to attach")
    return with_examples(
        p,
        {
            "": "mt-attach               # list your sessions\nmt-attach train         # attach the one named train\n"
            "mt-attach -d train      # and detach a dropped terminal from it\n"
            "mt-attach -A            # in VS Code: the session of this folder"
        },
    )


def build_parser() -> argparse.ArgumentParser:
    return _parser("mt-attach")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtgpu.tmux.attach [NAME]``: what a terminal login runs."""
    # Set by the gateway only so that this interpreter keeps the tenant's locale
    # (PEP 538); the tenant's shells must not inherit it.
    os.environ.pop("PYTHONCOERCECLOCALE", None)
    _utf8_mode(argv, None)
    _safe_streams()
    args = _parser("mtgpu.tmux.attach").parse_args(argv)
    try:
        return login(args.name, detach_others=args.detach_others, folder=os.getcwd() if args.here else None)
    except KeyboardInterrupt:
        return 130
    except TerminalError as exc:
        if args.name is not None and not args.here:
            print(f"mtgpu: {exc}", file=sys.stderr)  # a named session: say which exist
            return 1
        return fall_back_to_shell(_describe(exc))
    except Exception as exc:  # noqa: BLE001 - a login must never end in a traceback
        return fall_back_to_shell(_describe(exc))


def main_mt_attach(argv: Sequence[str] | None = None) -> int:
    """``mt-attach [-d] [-A] [NAME]``: list the sessions, or attach ``NAME``."""
    _utf8_mode(argv, _MT_ATTACH)
    _safe_streams()
    args = _parser("mt-attach").parse_args(argv)
    try:
        if args.here:
            return login(args.name, folder=os.getcwd())
        if args.name is None:
            return print_sessions()
        return login(args.name, detach_others=args.detach_others)
    except TerminalError as exc:
        if args.here and os.isatty(0):
            return fall_back_to_shell(_describe(exc))
        print(f"mt-attach: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        if args.here and os.isatty(0):
            return fall_back_to_shell(_describe(exc))
        print(f"mt-attach: {_describe(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
