"""The scheduler's memory of which request shapes could ever run is bounded: tenants
choose its keys (one per distinct request), so the least recently used go first."""

from __future__ import annotations

from mtgpu.errors import JobError
from mtgpu.schedd import scheduler as sched_mod
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import GpuMode, ResourceRequest


async def _nothing(*args, **kwargs):
    raise AssertionError("not expected")


def test_distinct_rejected_shapes_do_not_grow_the_cache_without_bound():
    s = Scheduler(JobTable(), _nothing, _nothing, term=lambda: 1)
    s.grace = 0
    refused = 0
    for i in range(3 * sched_mod.MAX_FEASIBLE_CACHE):
        req = ResourceRequest(
            gpus=0,
            gpu_brand=None,
            gpu_type=None,
            gpu_mode=GpuMode.EXCLUSIVE,
            vram=0,
            cpus=1000 + i,
            ram=1 << 20,
            nodes=1,
            servers=tuple(f"n{k}" for k in range(50)),
        )
        try:
            s.check_submit(req)
        except JobError:
            refused += 1
    assert refused == 3 * sched_mod.MAX_FEASIBLE_CACHE  # no member: each is refused
    assert len(s._feasible) == sched_mod.MAX_FEASIBLE_CACHE
