"""API operation ``published``: the datasets and Python interpreters of this host.

Any caller may ask (``mt-python list``, ``mtgpu-setup status``). An entry that is
not published (a missing directory, a broken interpreter) carries ``ok: false`` and
its ``problem``.
"""

from __future__ import annotations

from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher


def register(d: Dispatcher, host: Any) -> None:
    def published(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The datasets and Python interpreters published here, and what is wrong with any."""
        return {"server": host.options.server_name, **host.published.to_dict()}

    d.register("published", published)
