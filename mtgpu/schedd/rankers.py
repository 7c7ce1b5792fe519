"""Rankers: among members that pass the filters, which is the best fit?

Each ranker gives a named score from 0 to 1 (higher is better); the total is their
weighted sum. The names show up in ``Placement.members[*].scores`` so ``mt-job show``
can say why a member was chosen:

===============  ========  ==========================================================
``gpu_fit``      3         best fit on GPUs: exclusive jobs go where the fewest
                           matching GPUs stay idle; shared and overcommit jobs go to the
                           GPUs left fullest (by the larger of measured and committed)
``cpu_fit``      1         best fit on CPUs: committed share of the member after placing
``ram_fit``      1         best fit on RAM: larger of measured and committed, after placing
``gpu_spare``    4         CPU-only jobs prefer members without GPUs, so GPU hosts keep
                           their CPUs for GPU work
``tiebreak``     0.001     a stable hash of job id and member: spreads equal choices
                           without any unseeded randomness
===============  ========  ==========================================================
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from mtgpu.schedd.filters import Layout, Usage, idle_gpus
from mtgpu.schedd.types import GpuMode, ResourceRequest

WEIGHTS = {"gpu_fit": 3.0, "cpu_fit": 1.0, "ram_fit": 1.0, "gpu_spare": 4.0, "tiebreak": 0.001}


def tiebreak(job_id: str, node: str) -> float:
    """A number in [0, 1) fixed by the job id and member name.

    >>> tiebreak("42", "gpu01") == tiebreak("42", "gpu01")
    True
    """
    return zlib.crc32(node.encode(), zlib.crc32(job_id.encode() + b"\0")) / 4294967296.0


def score_node(
    layout: Layout,
    use: Usage,
    i: int,
    req: ResourceRequest,
    chosen: tuple[int, ...],
    match: Sequence[tuple[int, ...]],
    job_seed: int,
    detail: bool = False,
) -> tuple[float, tuple[tuple[str, float], ...]]:
    """Score member ``i`` for one member of ``req`` on GPUs ``chosen``: (total, named scores).

    ``job_seed`` is ``zlib.crc32(job_id + "\\0")``; the named scores are only built when
    ``detail`` is set (for the members finally chosen), to keep ranking cheap.
    """
    gpu_fit = -1.0
    if req.gpus:
        if req.gpu_mode is GpuMode.EXCLUSIVE:
            ids = match[i]
            idle = len(idle_gpus(use, ids))
            gpu_fit = 1.0 - (idle - len(chosen)) / len(ids)
        else:
            total, used, committed = layout.gpu_total, use.gpu_used, use.gpu_committed
            v = req.vram
            gpu_fit = sum(min(1.0, (max(used[g], committed[g]) + v) / total[g]) for g in chosen) / len(chosen)
    cpus = layout.cpus[i]
    cpu_fit = min(1.0, (cpus - use.cpus_free[i] + req.cpus) / cpus) if cpus else 1.0
    ram_total = layout.ram_total[i]
    ram_fit = (
        min(1.0, (max(use.ram_used[i], use.ram_committed[i]) + req.ram) / ram_total) if ram_total else 1.0
    )
    spare = -1.0 if req.gpus else (0.0 if layout.node_gpus[i] else 1.0)
    tie = zlib.crc32(layout.name_bytes[i], job_seed) / 4294967296.0
    total_score = (
        _W_GPU * max(gpu_fit, 0.0)
        + _W_CPU * cpu_fit
        + _W_RAM * ram_fit
        + _W_SPARE * max(spare, 0.0)
        + _W_TIE * tie
    )
    if not detail:
        return total_score, ()
    named = [("gpu_fit", gpu_fit)] if gpu_fit >= 0 else []
    named += [("cpu_fit", cpu_fit), ("ram_fit", ram_fit)]
    if spare >= 0:
        named.append(("gpu_spare", spare))
    named.append(("tiebreak", tie))
    return total_score, tuple((name, round(value, 6)) for name, value in named)


_W_GPU, _W_CPU, _W_RAM = WEIGHTS["gpu_fit"], WEIGHTS["cpu_fit"], WEIGHTS["ram_fit"]
_W_SPARE, _W_TIE = WEIGHTS["gpu_spare"], WEIGHTS["tiebreak"]
