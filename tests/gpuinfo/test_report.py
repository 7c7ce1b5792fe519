"""The nodes table the CLIs print."""

from __future__ import annotations

from mtgpu.gpuinfo.report import format_nodes_table

GiB = 1 << 30


def test_table():
    text = format_nodes_table(
        [
            {
                "name": "gpu01",
                "state": "up",
                "cpus": 64,
                "ram_total": 512 * GiB,
                "ram_used": 100 * GiB,
                "gpus": [
                    {
                        "index": 0,
                        "brand": "nvidia",
                        "type": "h100",
                        "vram_total": 80 * GiB,
                        "vram_used": 70 * GiB,
                        "util": 93,
                        "jobs": ["17", "18"],
                    },
                    {
                        "index": 1,
                        "brand": "nvidia",
                        "type": "h100",
                        "vram_total": 80 * GiB,
                        "vram_used": 0,
                        "util": 0,
                        "jobs": [],
                    },
                ],
            },
            {
                "name": "cpu01",
                "state": "drain",
                "cpus": 8,
                "ram_total": 32 * GiB,
                "ram_used": GiB,
                "gpus": [],
            },
        ]
    )
    rows = [line.split() for line in text.splitlines()]
    assert rows[0] == ["NODE", "STATE", "CPUS", "RAM", "GPU", "TYPE", "VRAM", "UTIL", "JOBS"]
    assert rows[1] == ["gpu01", "up", "64", "100G/512G", "0", "h100", "70G/80G", "93%", "17,18"]
    assert rows[2] == ["1", "h100", "0/80G", "0%", "-"]  # host columns only on its first row
    assert rows[3] == ["cpu01", "drain", "8", "1G/32G", "-", "-", "-", "-", "-"]


def test_empty_and_partial():
    assert format_nodes_table([]).split() == [
        "NODE",
        "STATE",
        "CPUS",
        "RAM",
        "GPU",
        "TYPE",
        "VRAM",
        "UTIL",
        "JOBS",
    ]
    assert "gpu02" in format_nodes_table([{"name": "gpu02"}])


def test_vram_held_outside_every_job_is_reported():
    from mtgpu.gpuinfo.report import format_nodes_table

    node = {
        "name": "gpu01",
        "state": "up",
        "cpus": 8,
        "ram_total": 1 << 34,
        "ram_used": 0,
        "gpus": [
            {
                "index": 0,
                "brand": "nvidia",
                "type": "h100",
                "vram_total": 80 << 30,
                "vram_used": 30 << 30,
                "util": 0,
                "jobs": [],
                "vram_outside": 3 << 30,
            },
            {
                "index": 1,
                "brand": "nvidia",
                "type": "h100",
                "vram_total": 80 << 30,
                "vram_used": 0,
                "util": 0,
                "jobs": [],
                "vram_outside": 0,
            },
        ],
    }
    text = format_nodes_table([node])
    assert "gpu01 GPU 0: 3G held by processes outside every job" in text
    assert "GPU 1:" not in text
