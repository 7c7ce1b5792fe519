"""Drained members: the admins' "take no new work here" marks, in replicated state.

``mtgpu-admin drain NODE --reason TEXT`` records a drain; ``mtgpu-admin undrain NODE``
removes it. A drained member runs what it already runs, but the scheduler places
nothing new there (it treats it as :attr:`~mtgpu.schedd.types.NodeState.DRAIN`), so
jobs that only it could run wait with Slurm's reason ``ReqNodeNotAvail``.

The marks are replicated (a consumer of the store in both modes: a standalone host
is a cluster of one), so a drain survives a restart and a failover: the next
scheduler reads the same marks. They are not measured state: nobody but an admin
sets or clears them.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObjConsumer, replicated

#: The longest drain reason kept (the rest is cut).
MAX_REASON = 200


class Drains(SyncObjConsumer):
    """Member name -> ``{"node", "reason", "by", "since"}`` for each drained member."""

    def __init__(self) -> None:
        super().__init__()
        self.drained: dict[str, dict[str, Any]] = {}

    def get(self, name: str) -> dict[str, Any] | None:
        """The drain of member ``name``, or None when it takes work."""
        return self.drained.get(name)

    def is_drained(self, name: str) -> bool:
        return name in self.drained

    def all(self) -> list[dict[str, Any]]:
        return [self.drained[n] for n in sorted(self.drained)]

    @replicated
    def drain(self, name: str, reason: str, by: str, now: float) -> dict[str, Any]:
        """Mark ``name`` drained; draining it again only changes the reason."""
        old = self.drained.get(name)
        self.drained[name] = {
            "node": name,
            "reason": reason[:MAX_REASON],
            "by": by,
            "since": old["since"] if old else now,
        }
        return dict(self.drained[name])

    @replicated
    def undrain(self, name: str) -> dict[str, Any] | None:
        """Let ``name`` take work again; returns the drain it had, or None."""
        return self.drained.pop(name, None)
