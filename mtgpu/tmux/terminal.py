"""Which tmux session a new terminal gets: a pure decision, tested as a table.

A login with a pty and no command runs ``python -m mtgpu.tmux.attach`` as the
tenant (:func:`terminal_argv`). That program lists the tenant's sessions on
MTGPU's tmux socket and asks :func:`choose` what to do:

- no sessions, or every one already has a client: start a new session, so each
  terminal gets its own view instead of mirroring another terminal;
- exactly one detached session: re-attach it, screen and processes as they were;
- several detached sessions: show a short menu (:func:`menu_text`,
  :func:`parse_choice`).

A session whose only clients are connections that no longer answer (a laptop
asleep, a network gone) counts as detached (:func:`reclaim`): the login takes it
over instead of opening an empty one, and says so (:func:`takeover_message`).

Nothing here touches tmux; :mod:`mtgpu.tmux.sessions` does the I/O.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

# The socket's name in the tenant's socket directory, RUN_DIR/tmux/tmux-UID/mtgpu
# (see mtgpu.tmux.sessions for why that keeps tenants apart).
SOCKET_NAME = "mtgpu"
FIRST_NAME = "main"
#: How tmux is told which server: ``-S PATH`` once the socket directory is known.
DEFAULT_SOCKET: tuple[str, ...] = ("-L", SOCKET_NAME)


@dataclass(frozen=True)
class TenantSession:
    """One tmux session of the tenant, as the chooser and the menu see it."""

    name: str
    windows: int = 1
    attached: int = 0  # number of clients attached right now
    created: int = 0  # epoch seconds
    last_attached: int = 0  # epoch seconds, 0 if never attached
    command: str = ""  # what runs in the active pane, e.g. "vim"

    @property
    def detached(self) -> bool:
        return self.attached == 0


@dataclass(frozen=True)
class TenantClient:
    """One tmux client (a terminal attached to a session) of the tenant."""

    tty: str  # the client's terminal, e.g. /dev/pts/4
    session: str
    activity: int = 0  # epoch seconds of its last input


@dataclass(frozen=True)
class Takeover:
    """A session held only by connections that stopped answering."""

    session: str
    ttys: tuple[str, ...]
    idle_since: int  # the newest input among those clients, epoch seconds


def reclaim(
    sessions: Sequence[TenantSession], clients: Sequence[TenantClient], dead: Iterable[str]
) -> tuple[list[TenantSession], dict[str, Takeover]]:
    """The sessions as a new login sees them once dead connections' clients are gone.

    A session whose every client is on a dead connection becomes detached, and a
    :class:`Takeover` says which clients to detach when it is attached.

    >>> view, t = reclaim([TenantSession("main", attached=1)],
    ...                   [TenantClient("/dev/pts/3", "main", 100)], {"/dev/pts/3"})
    >>> view[0].detached, t["main"].ttys
    (True, ('/dev/pts/3',))
    """
    gone = set(dead)
    out, takeovers = [], {}
    for s in sessions:
        mine = [c for c in clients if c.session == s.name]
        stale = [c for c in mine if c.tty in gone]
        if s.attached and stale and len(stale) == len(mine):
            out.append(replace(s, attached=0))
            takeovers[s.name] = Takeover(s.name, tuple(c.tty for c in stale), max(c.activity for c in stale))
        else:
            out.append(s)
    return out, takeovers


def takeover_message(t: Takeover) -> str:
    """What the terminal that took a session over is told.

    >>> takeover_message(Takeover("main", ("/dev/pts/3",), 0))
    'took over `main` from a connection that stopped answering'
    """
    if not t.idle_since:
        return f"took over `{t.session}` from a connection that stopped answering"
    return f"took over `{t.session}` from a connection idle since {clock(t.idle_since)}"


def clock(epoch: int, now: float | None = None) -> str:
    """``18:02`` today, ``2025-03-04 18:02`` on another day (local time)."""
    then = time.localtime(epoch)
    today = time.localtime(time.time() if now is None else now)
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    return time.strftime("%Y-%m-%d %H:%M", then)


class Action(enum.Enum):
    NEW = "new"  # create session ``name`` and attach it
    ATTACH = "attach"  # attach the existing session ``name``
    MENU = "menu"  # ask the tenant; ``choices`` are listed, ``name`` is for "n"


@dataclass(frozen=True)
class Decision:
    action: Action
    name: str
    choices: tuple[TenantSession, ...] = ()


def next_name(taken: Iterable[str]) -> str:
    """The name of a new session: ``main``, then ``2``, ``3``...

    >>> next_name([])
    'main'
    >>> next_name(["main", "2", "4"])
    '3'
    """
    used = set(taken)
    if FIRST_NAME not in used:
        return FIRST_NAME
    n = 2
    while str(n) in used:
        n += 1
    return str(n)


def _recency(s: TenantSession) -> tuple[int, str]:
    return (max(s.last_attached, s.created), s.name)


def choose(sessions: Sequence[TenantSession]) -> Decision:
    """Decide what a new terminal attaches to.

    >>> choose([]).action, choose([]).name
    (<Action.NEW: 'new'>, 'main')
    >>> choose([TenantSession("main", attached=1)]).name
    '2'
    >>> choose([TenantSession("main")]).action
    <Action.ATTACH: 'attach'>
    """
    new = next_name(s.name for s in sessions)
    detached = [s for s in sessions if s.detached]
    if not detached:
        # Attaching a session that already has a client would mirror that
        # terminal; a new terminal gets a session of its own instead.
        return Decision(Action.NEW, new)
    if len(detached) == 1:
        return Decision(Action.ATTACH, detached[0].name)
    # Most recently used first, so Enter takes the terminal one left last.
    ordered = tuple(sorted(detached, key=_recency, reverse=True))
    return Decision(Action.MENU, new, ordered)


def workspace_session(folder: str, sessions: Sequence[TenantSession]) -> Decision:
    """The session of a terminal opened for ``folder`` (a VS Code workspace, say).

    Named after the folder's last part; the first of ``NAME``, ``NAME-2``...
    that no other terminal holds is attached, or made. Never the menu.

    >>> workspace_session("/home/a/my.proj", []).name
    'my_proj'
    >>> d = workspace_session("/w/x", [TenantSession("x", attached=1), TenantSession("x-2")])
    >>> d.action, d.name
    (<Action.ATTACH: 'attach'>, 'x-2')
    """
    base = session_name_for(folder)
    by_name = {s.name: s for s in sessions}
    n = 1
    while True:
        name = base if n == 1 else f"{base}-{n}"
        s = by_name.get(name)
        if s is None:
            return Decision(Action.NEW, name)
        if s.detached:
            return Decision(Action.ATTACH, name)
        n += 1


def session_name_for(folder: str) -> str:
    """A tmux session name from a directory: its last part, without ``.`` and ``:``
    (tmux's separators), at most 40 characters.

    >>> session_name_for("/home/a/data:set.v2/")
    'data_set_v2'
    >>> session_name_for("/")
    'main'
    """
    last = folder.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[.:\s]", "_", last)[:40].strip("_")
    return name or FIRST_NAME


def when(epoch: int) -> str:
    """A session's timestamp as the menu and the list show it (local time)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "-"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    # Every column but the last (a command, free text) padded to its widest cell.
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return [("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1]).rstrip() for r in rows]


def menu_text(decision: Decision) -> str:
    """The menu shown when several sessions are detached, without the prompt."""
    rows = [
        (
            f"{i})",
            s.name,
            f"{s.windows} window" + ("" if s.windows == 1 else "s"),
            f"created {when(s.created)}",
            s.command,
        )
        for i, s in enumerate(decision.choices, 1)
    ]
    lines = [
        "Detached terminals:",
        *("  " + line for line in _table(rows)),
        "  n)" + " " * (len(rows[-1][0])) + f"a new terminal ({decision.name})",
    ]
    return "\n".join(lines) + "\n"


def sessions_table(sessions: Sequence[TenantSession]) -> str:
    """What ``mt-attach`` without a name prints."""
    if not sessions:
        return "No terminal sessions. Log in with `ssh -t HOST` to start one.\n"
    rows = [("NAME", "WINDOWS", "STATE", "CREATED", "COMMAND")]
    rows += [
        (s.name, str(s.windows), "detached" if s.detached else "attached", when(s.created), s.command)
        for s in sessions
    ]
    return "\n".join(_table(rows)) + "\n"


def menu_prompt(decision: Decision) -> str:
    return f"Attach which one? [1-{len(decision.choices)}, n = new, Enter = 1] "


def parse_choice(answer: str, decision: Decision) -> Decision | None:
    """What the tenant's answer to the menu means, or None to ask again.

    >>> d = choose([TenantSession("main", created=1), TenantSession("2", created=2)])
    >>> parse_choice("", d).name, parse_choice("2", d).name, parse_choice("n", d).action
    ('2', 'main', <Action.NEW: 'new'>)
    >>> parse_choice("7", d) is None
    True
    """
    text = answer.strip()
    if not text:
        return Decision(Action.ATTACH, decision.choices[0].name)
    if text.lower() in ("n", "new"):
        return Decision(Action.NEW, decision.name)
    if text.isdigit() and 1 <= int(text) <= len(decision.choices):
        return Decision(Action.ATTACH, decision.choices[int(text) - 1].name)
    # A session name typed in full also works, as with mt-attach NAME.
    for s in decision.choices:
        if s.name == text:
            return Decision(Action.ATTACH, s.name)
    return None


# ------------------------------------------------------------------ argv


def terminal_argv(python: str) -> list[str]:
    """What the gateway runs as the tenant in a login's pty (pty, no command).

    ``-P`` keeps the working directory (the tenant's home) off ``sys.path``, so a
    checkout named ``mtgpu`` or a stray ``libtmux.py`` in the home cannot break
    logins. ``-X utf8``: names and tmux commands are UTF-8 whatever the tenant's
    locale (in ISO-8859-1, libtmux's field separator could not even be passed).

    >>> terminal_argv("/opt/mtgpu/bin/python")
    ['/opt/mtgpu/bin/python', '-P', '-X', 'utf8', '-m', 'mtgpu.tmux.attach']
    """
    return [python, "-P", "-X", "utf8", "-m", "mtgpu.tmux.attach"]


def attach_argv(python: str, name: str) -> list[str]:
    """What the gateway runs in a pty to attach the session ``name`` directly.

    >>> attach_argv("/opt/mtgpu/bin/python", "main")[-2:]
    ['--', 'main']
    """
    return [*terminal_argv(python), "--", name]


def tmux_new_argv(
    name: str, home: str | None, *, restore_exit_empty: bool, socket: Sequence[str] = DEFAULT_SOCKET
) -> list[str]:
    """The tmux client command that creates session ``name`` and attaches it.

    ``restore_exit_empty`` undoes the ``exit-empty off`` that kept a freshly
    started server alive until its first session existed; it runs right after
    the session is created, in the same command list.
    """
    argv = ["tmux", *socket, "new-session", "-s", name]
    if home:
        argv += ["-c", home]
    if restore_exit_empty:
        argv += [";", "set-option", "-g", "exit-empty", "on"]
    return argv


def tmux_attach_argv(
    name: str, *, detach_others: bool = False, switch: bool = False, socket: Sequence[str] = DEFAULT_SOCKET
) -> list[str]:
    """The tmux client command that attaches (or, inside tmux, switches to) ``name``.

    ``=`` asks tmux for this exact name, so ``2`` never matches ``20``.

    >>> tmux_attach_argv("2")
    ['tmux', '-L', 'mtgpu', 'attach-session', '-t', '=2']
    """
    if switch:
        return ["tmux", *socket, "switch-client", "-t", f"={name}"]
    argv = ["tmux", *socket, "attach-session", "-t", f"={name}"]
    if detach_others:
        argv.insert(len(socket) + 2, "-d")
    return argv
