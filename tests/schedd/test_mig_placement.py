"""MIG devices are GPUs for placement; the card they are cut from is never placed whole.

The inventory is the simulated probe's MIG card (the same records the NVIDIA probe
makes, see tests/gpuinfo/test_nvidia.py), put through the scheduler's own
``node_snapshot`` and the placement function, as the daemon does.
"""

from __future__ import annotations

import dataclasses

from mtgpu.config import load_text
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import HostUsage, NodeInventory
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.placement import feasible_ever, place, snapshot_with_allocations
from mtgpu.schedd.scheduler import node_snapshot
from mtgpu.schedd.types import Allocation, ClusterSnapshot, PendingJob, Placement, Reason

G = 1 << 30
HOST = HostUsage(cpus=16, cpu_percent=0, ram_total=64 * G, ram_used=0, disk_total=0, disk_free=0)
# One whole H100 (GPU 0) and one in MIG mode (GPU 1): 3g.40gb at 10, 2g.20gb at 13 and
# 1g.10gb at 15.
CONFIG = (
    "SIMULATED_GPUS:\n  - {type: h100, vram: 80G}\n"
    "  - {type: h100, vram: 80G, mig: [3g.40gb, 2g.20gb, 1g.10gb]}\n"
)


def inventory(drop: tuple[int, ...] = ()) -> NodeInventory:
    gpus = SimulatedProbe(load_text(CONFIG).simulated_gpus, "gpu01").probe()
    return NodeInventory("gpu01", tuple(g for g in gpus if g.index not in drop), HOST)


def job(gpus: str, jid: str = "1") -> PendingJob:
    spec = parse_job_file(f"#!/bin/sh\n#MTGPU gpus={gpus}\ntrue\n", default_workdir="/h")
    return PendingJob(job_id=jid, tenant="ann", request=spec.request)


def test_the_scheduler_sees_the_mig_devices_and_not_their_card():
    snap = node_snapshot(inventory())
    assert [(g.index, g.type) for g in snap.gpus] == [
        (0, "h100"),
        (10, "h100-3g.40gb"),
        (13, "h100-2g.20gb"),
        (15, "h100-1g.10gb"),
    ]


def test_a_profile_request_lands_on_a_mig_device():
    snap = ClusterSnapshot(nodes=(node_snapshot(inventory()),))
    p = place(snap, job("h100-3g.40gb:1"))
    assert isinstance(p, Placement) and p.members[0].gpu_indices == (10,)
    p = place(snap, job("h100-1g.10gb:1"))
    assert isinstance(p, Placement) and p.members[0].gpu_indices == (15,)


def test_a_whole_card_request_never_gets_the_card_in_mig_mode():
    snap = ClusterSnapshot(nodes=(node_snapshot(inventory()),))
    p = place(snap, job("h100:1"))
    assert isinstance(p, Placement) and p.members[0].gpu_indices == (0,)
    # Only one whole h100 here: two can never run, though the MIG card is an h100.
    never = feasible_ever(snap, job("h100:2").request)
    assert isinstance(never, Reason) and never.code == "BadConstraints"
    # By brand, MIG devices are nvidia GPUs like any other; the card itself is not one.
    p = place(snap, job("nvidia:4"))
    assert isinstance(p, Placement) and set(p.members[0].gpu_indices) == {0, 10, 13, 15}
    assert isinstance(feasible_ever(snap, job("nvidia:5").request), Reason)


def test_a_job_on_a_mig_device_that_disappears():
    """An administrator destroys the instance a running job holds (nvidia-smi refuses
    while the job's processes use it, so this happens only by force). The scheduler goes
    on: the job keeps running, nothing new is placed on the device while it is gone, and
    when an instance is created in its place again the job's reservation holds it again."""
    held = place(ClusterSnapshot(nodes=(node_snapshot(inventory()),)), job("h100-2g.20gb:1", "7"))
    assert isinstance(held, Placement) and held.members[0].gpu_indices == (13,)
    running = [Allocation(held)]
    gone = snapshot_with_allocations([node_snapshot(inventory(drop=(13,)))], running)
    assert [g.index for g in gone.nodes[0].gpus] == [0, 10, 15]
    assert isinstance(place(gone, job("h100-2g.20gb:1", "8")), Reason)
    assert isinstance(place(gone, job("h100-1g.10gb:1", "9")), Placement)
    back = snapshot_with_allocations([node_snapshot(inventory())], running, previous=gone)
    assert next(g for g in back.nodes[0].gpus if g.index == 13).exclusive_job == "7"
    assert isinstance(place(back, job("h100-2g.20gb:1", "8")), Reason)


def test_the_cards_use_never_counts_twice():
    inv = inventory()
    card = next(g for g in inv.gpus if g.index == 1)
    busy = dataclasses.replace(
        inv, gpus=tuple(dataclasses.replace(g, vram_used=g.vram_total) if g is card else g for g in inv.gpus)
    )
    # The card's measured use is its devices' (shown in `nodes`), not a GPU of its own.
    assert [g.index for g in node_snapshot(busy).gpus] == [0, 10, 13, 15]
