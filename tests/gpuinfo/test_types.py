"""The inventory types and their JSON form (the fields DESIGN.md names)."""

from __future__ import annotations

import json

from mtgpu.gpuinfo.types import GpuInfo, GpuProcess, HostUsage, NodeInventory

GiB = 1 << 30

GPU = GpuInfo(
    index=0,
    brand="nvidia",
    type="h100",
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-1",
    vram_total=80 * GiB,
    vram_used=82 * GiB,
    util=4,
    processes=(GpuProcess(pid=7, uid=20001, used_memory=GiB),),
    mig_mode=False,
    visibility_id="GPU-1",
)
NODE = NodeInventory(
    name="gpu01",
    gpus=(GPU,),
    host=HostUsage(
        cpus=64,
        cpu_percent=12.5,
        ram_total=512 * GiB,
        ram_used=100 * GiB,
        disk_total=4096 * GiB,
        disk_free=1024 * GiB,
    ),
    errors=("amd: broken",),
    sampled_at=1700000000.0,
)


def test_member_fields_of_mt_job_nodes_json():
    d = NODE.to_dict({0: ["17", "18"]}, state="drain")
    assert {"name", "state", "cpus", "ram_total", "ram_used", "gpus"} <= set(d)
    assert (d["name"], d["state"], d["cpus"], d["ram_total"]) == ("gpu01", "drain", 64, 512 * GiB)
    g = d["gpus"][0]
    assert {"index", "brand", "type", "vram_total", "vram_used", "util", "jobs"} <= set(g)
    assert g["jobs"] == ["17", "18"] and g["type"] == "h100"
    assert "processes" not in g  # tenants see this listing; PIDs and UIDs only on request
    assert NODE.to_dict(processes=True)["gpus"][0]["processes"] == [
        {"pid": 7, "uid": 20001, "used_memory": GiB}
    ]
    json.dumps(d)  # plain JSON, no custom types


def test_round_trip():
    back = NodeInventory.from_dict(json.loads(json.dumps(NODE.to_dict(processes=True))))
    assert back.gpus[0].processes == GPU.processes
    assert back.gpus[0].uuid == GPU.uuid and back.host == NODE.host and back.errors == NODE.errors
    assert back.gpu(0) is not None and back.gpu(5) is None


def test_vram_free_never_negative():
    assert GPU.vram_free == 0


def test_report_reader_keeps_unchanged_gpu_records_and_rebuilds_changed_ones():
    from mtgpu.gpuinfo.types import ReportReader

    two = NodeInventory(
        name="gpu01",
        gpus=(GPU, GpuInfo(1, "nvidia", "h100", "H100", "GPU-2", 80 * GiB, 0, 0)),
        host=NODE.host,
    )
    reader = ReportReader()
    wire = json.loads(json.dumps(two.to_dict()))
    first = reader.read(wire)
    assert first.gpus[1].uuid == "GPU-2" and first.host == NODE.host
    # The same figures again (a new message): the very same records.
    again = reader.read(json.loads(json.dumps(two.to_dict())))
    assert again.gpus[0] is first.gpus[0] and again.gpus[1] is first.gpus[1]
    # One card's use changed: that card's record is new and right, the other kept.
    wire["gpus"][1]["vram_used"] = 5 * GiB
    changed = reader.read(wire)
    assert changed.gpus[0] is first.gpus[0]
    assert changed.gpus[1] is not first.gpus[1] and changed.gpus[1].vram_used == 5 * GiB
    # Another member with the same figures gets its own records; a card removed is gone.
    other = reader.read({**wire, "name": "gpu02"})
    assert other.gpus[0] is not first.gpus[0] and other.gpus[0] == first.gpus[0]
    fewer = reader.read({**wire, "gpus": wire["gpus"][:1]})
    assert len(fewer.gpus) == 1
    # What it reads equals what from_dict reads.
    assert reader.read(wire) == NodeInventory.from_dict(wire)


def test_a_mig_device_keeps_its_card_across_the_wire():
    """A member's report reaches the scheduler and other members as JSON: a MIG device
    stays under its card and the card stays unplaceable."""
    card = GpuInfo(1, "nvidia", "h100", "NVIDIA H100 80GB HBM3", "GPU-c", 80 << 30, 0, 0, mig_mode=True)
    dev = GpuInfo(
        10,
        "nvidia",
        "h100-3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "MIG-d",
        40 << 30,
        0,
        0,
        mig_mode=True,
        visibility_id="MIG-d",
        parent=1,
    )
    inv = NodeInventory("gpu01", (card, dev), HostUsage(8, 0.0, 1 << 34, 0, 0, 0))
    back = NodeInventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert [(g.index, g.parent, g.placeable) for g in back.gpus] == [(1, None, False), (10, 1, True)]
    assert "parent" not in inv.to_dict()["gpus"][0]
