"""API operation for clients that find servers: cluster.members (read-only, any user)."""

from __future__ import annotations

from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher


def register(d: Dispatcher, host: Any) -> None:
    """Register ``cluster.members`` on ``d``; ``host`` is the daemon (its ``cluster`` may be None)."""

    def members(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """This server and the other members of its cluster, with the SSH address of each."""
        o = host.options
        cluster = getattr(host, "cluster", None)
        if cluster is None:
            listen, port = o.ssh_listen
            return {
                "server": o.server_name,
                "cluster_id": None,
                "members": [{"name": o.server_name, "address": f"{listen}:{port}"}],
            }
        out = [{"name": m["name"], "address": m["address"]} for m in cluster.members.all()]
        if not any(m["name"] == cluster.name for m in out):
            out.append({"name": cluster.name, "address": cluster.address})
        return {
            "server": o.server_name,
            "cluster_id": o.cluster_id,
            "members": sorted(out, key=lambda m: m["name"]),
        }

    d.register("cluster.members", members)
