"""API operations a terminal login uses: ``terminal.dead`` and ``terminal.failed``.

Both answer only about the caller's own terminals (the caller's UID comes from
the socket's peer credentials, never from the request).

- ``terminal.dead`` ``{"ttys": [...]}``: which of those terminals are on SSH
  connections that no longer answer; the login takes their sessions over.
- ``terminal.failed`` ``{"reason": "..."}``: the login could not open tmux and
  gave a plain shell; the reason is logged once for the administrator.
"""

from __future__ import annotations

from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import ValidationError
from mtgpu.tmux.runtime import MAX_TTYS, LiveTerminals


def register(d: Dispatcher, terminals: LiveTerminals) -> None:
    async def dead(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Which of your terminals are on connections that stopped answering."""
        ttys = arg(args, "ttys", list)
        if len(ttys) > MAX_TTYS:
            raise ValidationError(f"at most {MAX_TTYS} terminals per question, not {len(ttys)}")
        if not all(isinstance(t, str) and 0 < len(t) <= 64 for t in ttys):
            raise ValidationError('"ttys" must be terminal names such as /dev/pts/3')
        return {"dead": await terminals.dead(caller.uid, ttys)}

    def failed(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Report that your terminal login fell back to a plain shell, and why."""
        reason = arg(args, "reason", str)
        if len(reason) > 2000:
            raise ValidationError('"reason" is limited to 2000 characters')
        return {"logged": terminals.report_failure(caller.uid, caller.name, reason)}

    d.register("terminal.dead", dead)
    d.register("terminal.failed", failed)
