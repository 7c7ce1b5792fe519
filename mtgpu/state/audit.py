"""The audit log: every admin action, who did it, when, where and with what arguments.

It is replicated state (a PySyncObj consumer, like the user registry), so an entry
written through one member can be read on every other: each member holds a full
replica. The dispatcher writes one entry per admin action (see
:meth:`mtgpu.api.dispatcher.Dispatcher.register`'s ``audit``); ``mtgpu-admin audit``
reads them. Entries are plain dicts, appended in log order; the oldest are dropped
past :data:`MAX_ENTRIES`.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObjConsumer, replicated

#: Entries kept; the oldest go first.
MAX_ENTRIES = 20000
#: Longest string argument kept in an entry (the rest is cut, marked with "...").
MAX_TEXT = 200


def summarize(value: Any, depth: int = 0) -> Any:
    """A bounded copy of an action's arguments, fit to keep in the log.

    >>> summarize({"name": "bob", "keys": ["x" * 300]})["keys"][0][-3:]
    '...'
    """
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "..."
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if depth >= 3:
        return "..."
    if isinstance(value, dict):
        return {str(k): summarize(v, depth + 1) for k, v in list(value.items())[:30]}
    if isinstance(value, (list, tuple)):
        return [summarize(v, depth + 1) for v in list(value)[:30]]
    return summarize(str(value), depth)


class AuditLog(SyncObjConsumer):
    """Admin actions in the order they were committed, numbered from 1."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[dict[str, Any]] = []
        self.next_seq = 1

    def list(
        self, limit: int | None = None, actor: str | None = None, action: str | None = None
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` entries (oldest first), optionally of one actor or action."""
        out = [
            e
            for e in list(self.entries)
            if (actor is None or e["actor"] == actor)
            and (action is None or e["action"] == action or e["action"].startswith(action + "."))
        ]
        return out[-limit:] if limit else out

    @replicated
    def record(self, entry: dict[str, Any]) -> int:
        """Append one entry (``time``, ``actor``, ``action``, ``args``...); returns its number."""
        seq = self.next_seq
        self.next_seq += 1
        self.entries.append({**entry, "seq": seq})
        if len(self.entries) > MAX_ENTRIES:
            del self.entries[: len(self.entries) - MAX_ENTRIES]
        return seq
