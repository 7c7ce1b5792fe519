"""The table ``mt-job nodes`` and ``mtgpu-admin nodes`` print.

It reads the ``--json`` member objects (see :meth:`NodeInventory.to_dict`), so
the CLIs print exactly what the API returned. One row per GPU; the host's own
columns are filled on its first row only, and a host without GPUs gets one row.
A card in MIG mode is shown as ``TYPE MIG`` and its MIG devices follow it, their
types marked ``└`` (they are the GPUs jobs get; the card is never given out whole).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from mtgpu.config import format_size

HEADERS = ("NODE", "STATE", "CPUS", "RAM", "GPU", "TYPE", "VRAM", "UTIL", "JOBS")


def _pair(used: Any, total: Any) -> str:
    try:
        return f"{format_size(int(used))}/{format_size(int(total))}"
    except (TypeError, ValueError):
        return "-"


def under_their_cards(gpus: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """GPUs in index order, each MIG device right after the card it is part of.

    >>> [g["index"] for g in under_their_cards([{"index": 0}, {"index": 1, "mig_mode": True},
    ...     {"index": 2}, {"index": 11, "parent": 1}, {"index": 10, "parent": 1}])]
    [0, 1, 10, 11, 2]
    """

    def key(g: Mapping[str, Any]) -> tuple[int, int]:
        parent, index = g.get("parent"), int(g.get("index") or 0)
        return (index, -1) if parent is None else (int(parent), index)

    return sorted(gpus, key=key)


def format_nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of ``nodes`` (``mt-job nodes --json`` objects).

    >>> table = format_nodes_table([{"name": "gpu01", "state": "up", "cpus": 32,
    ...     "ram_total": 2**37, "ram_used": 2**35, "gpus": [{"index": 0, "brand": "nvidia",
    ...     "type": "rtx4090", "vram_total": 24 * 2**30, "vram_used": 2**30, "util": 7,
    ...     "jobs": ["12"]}]}])
    >>> table.splitlines()[0].split()
    ['NODE', 'STATE', 'CPUS', 'RAM', 'GPU', 'TYPE', 'VRAM', 'UTIL', 'JOBS']
    >>> table.splitlines()[1].split()
    ['gpu01', 'up', '32', '32G/128G', '0', 'rtx4090', '1G/24G', '7%', '12']
    """
    rows = []
    for node in nodes:
        head = [
            node.get("name", "?"),
            node.get("state", "?"),
            node.get("cpus", "-"),
            _pair(node.get("ram_used"), node.get("ram_total")),
        ]
        gpus = list(node.get("gpus") or [])
        if not gpus:
            rows.append(head + ["-", "-", "-", "-", "-"])
        for n, g in enumerate(under_their_cards(gpus)):
            kind = str(g.get("type", "?"))
            if g.get("parent") is not None:
                kind = f"\u2514 {kind}"
            elif g.get("mig_mode"):
                kind += " MIG"
            rows.append(
                (head if n == 0 else ["", "", "", ""])
                + [
                    g.get("index", "?"),
                    kind,
                    _pair(g.get("vram_used"), g.get("vram_total")),
                    f"{g.get('util', 0)}%",
                    ",".join(str(j) for j in g.get("jobs") or []) or "-",
                ]
            )
    text = tabulate(
        rows,
        headers=HEADERS,
        tablefmt="plain",
        disable_numparse=True,
        colalign=("left", "left", "right", "left", "right", "left", "left", "left", "left"),
    )
    for node in nodes:
        for g in node.get("gpus") or []:
            outside = g.get("vram_outside")
            if isinstance(outside, int) and outside > 0:
                text += (
                    f"\n{node.get('name', '?')} GPU {g.get('index', '?')}: {format_size(outside)} "
                    "held by processes outside every job (counted as in use)"
                )
    drained = [n for n in nodes if n.get("state") == "drain" or n.get("drain_reason") is not None]
    for d in drained:
        text += f"\n{d.get('name', '?')} is drained: {d.get('drain_reason') or '(no reason given)'}"
    return text
