"""What one SSH channel becomes: a pure decision, tested as a table."""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass


class Kind(enum.Enum):
    TERMINAL = "terminal"      # pty, no command: the tenant's persistent terminal
    SHELL = "shell"            # no pty, no command: a login shell reading stdin
    EXEC = "exec"              # a command, no pty
    EXEC_PTY = "exec-pty"      # a command in a pty
    SFTP = "sftp"              # OpenSSH's sftp-server as the tenant
    API = "api"                # the mtgpu-api subsystem (JSON lines)
    JOIN = "join"              # redeem an invite code given on the command line
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
            return Route(Kind.REFUSE, detail="this key is not registered yet; redeem your invite "
                                             "first with: mtgpu-join CODE")
        if subsystem is None and pty:
            return Route(Kind.JOIN_PROMPT)
        return Route(Kind.REFUSE, detail="this key is not registered yet; connect with a "
                                         "terminal, or run: ssh ... mtgpu-join CODE")
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
