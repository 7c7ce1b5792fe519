"""The manual's "GPUs and node inventory" section: its examples work as shown."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from mtgpu.config import GpuProbeSpec, load_text
from mtgpu.gpuinfo.command import CommandProbe, validate
from mtgpu.gpuinfo.names import EXAMPLES
from mtgpu.gpuinfo.simulated import SimulatedProbe

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "manual.md"
MiB = 1 << 20


@pytest.fixture(scope="module")
def section() -> str:
    text = MANUAL.read_text()
    start = text.index("## GPUs and node inventory")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_type_table_matches_the_code(section):
    for brand, model, expected in EXAMPLES:
        assert f"| {brand} | {model} | `{expected}` |" in section


def test_yaml_examples_are_valid_configuration(section):
    yamls = blocks(section, "yaml")
    assert len(yamls) == 3
    probes = load_text(yamls[0]).gpu_probes
    assert probes[0].name == "amd-sysfs" and probes[0].visibility_env == "ROCR_VISIBLE_DEVICES"
    sims = load_text(yamls[1]).simulated_gpus
    assert [(s.type, s.count, s.brand) for s in sims] == [("rtx4090", 2, "nvidia"), ("mi300x", 1, "amd")]
    # The MIG card example, with the numbers the manual gives its MIG devices.
    mig = load_text(textwrap.dedent(yamls[2])).simulated_gpus
    assert [s.mig for s in mig] == [(), ("3g.40gb", "2g.20gb", "1g.10gb")]
    assert [g.index for g in SimulatedProbe(mig).probe()] == [0, 1, 10, 13, 15]


def test_output_example_matches_the_schema(section):
    example = next(b for b in blocks(section, "json") if b.startswith('{"gpus"'))
    gpus, errors = validate(json.loads(example))
    assert errors == [] and gpus[0]["name"] == "AMD Radeon RX 7900 XTX"


def amdgpu(
    sys_root: Path, card: str, bdf: str, product: str, total: int, used: int, busy: int, render: str
) -> None:
    dev = sys_root / "devices/pci0000:00" / bdf
    dev.mkdir(parents=True)
    files = {
        "vendor": "0x1002",
        "device": "0x744c",
        "product_name": product,
        "unique_id": f"uid{bdf[5:7]}",
        "mem_info_vram_total": str(total),
        "mem_info_vram_used": str(used),
        "gpu_busy_percent": str(busy),
    }
    for name, value in files.items():
        (dev / name).write_text(value + "\n")
    (dev / "drm" / render).mkdir(parents=True)
    (sys_root / "class/drm" / card).mkdir(parents=True)
    (sys_root / "class/drm" / card / "device").symlink_to(dev)


def test_example_probe_script_works(section, tmp_path):
    script = next(b for b in blocks(section, "python") if b.startswith("#!/usr/bin/env python3"))
    path = tmp_path / "amdgpu-sysfs-probe"
    path.write_text(script)
    root = tmp_path / "sys"
    # Two RX 7900 XTX as amdgpu reports them (24560 MiB, ilya-zlobintsev/LACT#533).
    amdgpu(root, "card1", "0000:03:00.0", "AMD Radeon RX 7900 XTX", 24560 * MiB, 1200 * MiB, 12, "renderD128")
    amdgpu(root, "card2", "0000:0a:00.0", "AMD Radeon RX 7900 XTX", 24560 * MiB, 0, 0, "renderD129")
    (root / "class/drm/card1-DP-1").mkdir()
    probe = CommandProbe(
        GpuProbeSpec(
            brand="amd",
            command=(sys.executable, str(path), str(root)),
            visibility_env="ROCR_VISIBLE_DEVICES",
            name="amd-sysfs",
        )
    )
    a, b = probe.probe()
    assert (a.type, a.vram_total, a.vram_used, a.util, a.uuid) == (
        "rx7900xtx",
        24560 * MiB,
        1200 * MiB,
        12,
        "uid03",
    )
    assert b.index == 1 and b.uuid == "uid0a"
    assert probe.visible_devices(probe.visibility_env([1])) == ["uid0a"]
