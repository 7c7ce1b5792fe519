"""What one SSH channel becomes: a pure decision, tested as a table."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Kind(enum.Enum):
    TERMINAL = "terminal"  # pty, no command: the tenant's persistent terminal
    SHELL = "shell"  # no pty, no command: a login shell reading stdin
    EXEC = "exec"  # a command, no pty
    EXEC_PTY = "exec-pty"  # a command in a pty
    SFTP = "sftp"  # OpenSSH's sftp-server as the tenant
    API = "api"  # the mtgpu-api subsystem (JSON lines)
    JOIN = "join"  # redeem an invite code given on the command line
    JOIN_PROMPT = "join-prompt"  # ask for the invite code on the terminal
    REFUSE = "refuse"


@dataclass(frozen=True)
class Route:
    kind: Kind
    command: str | None = None
    detail: str = ""


def route(*, invitee: bool, command: str | None, subsystem: str | None, pty: bool) -> Route:
    """Decide what a session channel becomes.

    >>> route(invitee=False, command=None, subsystem=None, pty=True).kind
    <Kind.TERMINAL: 'terminal'>
    >>> route(invitee=True, command="mtgpu-join 1234-5678", subsystem=None, pty=False)
    Route(kind=<Kind.JOIN: 'join'>, command='1234-5678', detail='')
    """
    if invitee:
        if command is not None:
            try:
                words = shlex.split(command)
            except ValueError:
                words = []
            if len(words) == 2 and words[0] == "mtgpu-join":
                return Route(Kind.JOIN, words[1])
            return Route(
                Kind.REFUSE,
                detail="this key is not registered yet; redeem your invite first with: mtgpu-join CODE",
            )
        if subsystem is None and pty:
            return Route(Kind.JOIN_PROMPT)
        return Route(
            Kind.REFUSE,
            detail="this key is not registered yet; connect with a terminal, or run: ssh ... mtgpu-join CODE",
        )
    if subsystem is not None:
        if subsystem == "sftp":
            return Route(Kind.SFTP)
        if subsystem == "mtgpu-api":
            return Route(Kind.API)
        return Route(Kind.REFUSE, detail=f"unknown subsystem {subsystem!r}")
    if command is None:
        return Route(Kind.TERMINAL if pty else Kind.SHELL)
    if command.split(None, 1)[0:1] == ["mtgpu-join"]:
        return Route(Kind.REFUSE, detail="this key is already registered; log in without mtgpu-join")
    return Route(Kind.EXEC_PTY if pty else Kind.EXEC, command)


#: The longest command or environment value a session may carry (as OpenSSH, whose
#: channel packets bound them near this).
MAX_SESSION_VALUE = 128 << 10
#: The largest terminal dimension (the kernel's window size fields are 16 bits).
MAX_TERMINAL_SIZE = 65535


def session_refusal(
    *,
    command: str | None,
    env: Mapping[Any, object],
    term_type: str | None,
    term_size: tuple[int, int, int, int],
) -> str | None:
    """Why a session's set-up cannot be carried out, or None. Pure, checked before
    anything is started: each refusal names what was wrong.

    >>> session_refusal(command="ls\\0", env={}, term_type=None, term_size=(0, 0, 0, 0))
    'the command contains a NUL byte, which no program can receive; remove it'
    >>> session_refusal(command=None, env={"A=B": "x"}, term_type=None, term_size=(0, 0, 0, 0))
    "the environment variable name 'A=B' contains '=' or a NUL byte; send a plain name"
    """
    if command is not None:
        if "\0" in command:
            return "the command contains a NUL byte, which no program can receive; remove it"
        if len(command) > MAX_SESSION_VALUE:
            return (
                f"the command is {len(command)} characters; at most {MAX_SESSION_VALUE} "
                "(128 KiB) are accepted; put a long script in a file and run that"
            )
    for k, v in env.items():
        name = k.decode(errors="replace") if isinstance(k, bytes) else str(k)
        value = v.decode(errors="replace") if isinstance(v, bytes) else str(v)
        shown = name if len(name) <= 40 else name[:40] + "..."
        if not name or "=" in name or "\0" in name or len(name) > 256:
            return f"the environment variable name {shown!r} contains '=' or a NUL byte; send a plain name"
        if "\0" in value:
            return f"the value of {shown} contains a NUL byte; remove it"
        if len(value) > MAX_SESSION_VALUE:
            return (
                f"the value of {shown} is {len(value)} characters; at most "
                f"{MAX_SESSION_VALUE} (128 KiB) are accepted"
            )
    if term_type is not None:
        if "\0" in term_type or len(term_type) > 256 or not term_type.isprintable():
            return (
                "the terminal type contains a NUL byte or other control characters (or is "
                "over 256 characters); use a name such as xterm-256color"
            )
        if any(not 0 <= n <= MAX_TERMINAL_SIZE for n in term_size):
            return (
                f"the terminal size {term_size[0]}x{term_size[1]} is out of range; each "
                f"dimension is at most {MAX_TERMINAL_SIZE}"
            )
    return None
