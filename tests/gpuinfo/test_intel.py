"""The Intel probe against a fake sysfs tree, a fake /proc with DRM fdinfo, and a fake xpu-smi.

The trees mimic the kernel's layout (class/drm/cardN/device -> the PCI device,
device/driver -> the bound driver, DRM usage stats in fdinfo) with values
shaped like an Arc A770 on i915 and a Data Center GPU Max 1550 on xe.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mtgpu.gpuinfo import drmclients
from mtgpu.gpuinfo.intel import IntelProbe, find_cards

GiB = 1 << 30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def add_card(
    sys_root: Path,
    card: str,
    bdf: str,
    vendor: str,
    device: str,
    driver: str,
    nodes: tuple[str, ...],
    *,
    lmem: int | None = None,
    tiles: tuple[int, ...] = (),
) -> None:
    dev = sys_root / "devices/pci0000:00" / bdf
    write(dev / "vendor", vendor + "\n")
    write(dev / "device", device + "\n")
    drv = sys_root / "bus/pci/drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(drv)
    for n in nodes:
        (dev / "drm" / n).mkdir(parents=True)
    for i, size in enumerate(tiles):
        write(dev / f"tile{i}" / "physical_vram_size_bytes", f"{size}\n")
    cls = sys_root / "class/drm" / card
    cls.mkdir(parents=True)
    (cls / "device").symlink_to(dev)
    if lmem is not None:
        write(cls / "lmem_total_bytes", f"{lmem}\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    add_card(
        root, "card0", "0000:03:00.0", "0x8086", "0x56a0", "i915", ("card0", "renderD128"), lmem=16 * GiB
    )
    add_card(root, "card1", "0000:00:02.0", "0x8086", "0x4680", "i915", ("card1", "renderD129"))
    add_card(
        root,
        "card2",
        "0000:29:00.0",
        "0x8086",
        "0x0bd5",
        "xe",
        ("card2", "renderD130"),
        tiles=(64 * GiB, 64 * GiB),
    )
    add_card(root, "card3", "0000:c1:00.0", "0x1002", "0x74a1", "amdgpu", ("card3", "renderD131"))
    (root / "class/drm/card0-DP-1").mkdir()  # a connector, not a card
    return root


def add_client(proc: Path, pid: int, fd: int, target: str, fdinfo: dict[str, str]) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    link = proc / str(pid) / "fd" / str(fd)
    if not link.is_symlink():
        link.symlink_to(target)
    write(
        proc / str(pid) / "fdinfo" / str(fd),
        "".join(f"{k}:\t{v}\n" for k, v in {"pos": "0", "flags": "02100002", **fdinfo}.items()),
    )


def i915_client(render_ns: int) -> dict[str, str]:
    return {
        "drm-driver": "i915",
        "drm-pdev": "0000:03:00.0",
        "drm-client-id": "7",
        "drm-total-local0": "2097152 KiB",
        "drm-resident-local0": "1048576 KiB",
        "drm-engine-render": f"{render_ns} ns",
        "drm-engine-video": "0 ns",
        "drm-engine-capacity-video": "2",
    }


def xe_client(rcs: int, ccs: int, clock: int) -> dict[str, str]:
    return {
        "drm-driver": "xe",
        "drm-pdev": "0000:29:00.0",
        "drm-client-id": "12",
        "drm-total-vram0": "8388608 KiB",
        "drm-resident-vram0": "4194304 KiB",
        "drm-cycles-rcs": str(rcs),
        "drm-total-cycles-rcs": str(clock),
        "drm-cycles-ccs": str(ccs),
        "drm-total-cycles-ccs": str(clock),
        "drm-engine-capacity-ccs": "4",
    }


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    add_client(root, 100, 5, "/dev/dri/renderD128", i915_client(1_000_000_000))
    add_client(root, 100, 6, "/dev/dri/renderD128", i915_client(1_000_000_000))  # dup'd fd
    add_client(root, 101, 3, "/dev/dri/renderD128", i915_client(1_000_000_000))  # forked child
    (root / "100" / "fd" / "0").symlink_to("/dev/null")
    add_client(root, 200, 4, "/dev/dri/renderD130", xe_client(1000, 5000, 10_000))
    add_client(
        root,
        300,
        4,
        "/dev/dri/renderD131",
        {
            "drm-driver": "amdgpu",
            "drm-pdev": "0000:c1:00.0",
            "drm-client-id": "1",
            "drm-memory-vram": "1024 KiB",
        },
    )
    (root / "self").mkdir()  # not a PID
    return root


@pytest.fixture
def xpu_smi(tmp_path: Path) -> Path:
    script = tmp_path / "xpu-smi"
    calls = tmp_path / "xpu-smi.calls"
    out = {
        "device_list": [
            {
                "device_id": 0,
                "device_name": "Intel(R) Data Center GPU Max 1550",
                "device_type": "GPU",
                "pci_bdf_address": "0000:29:00.0",
                "pci_device_id": "0xbd5",
                "uuid": "01000000-0000-0029-0000-000000bd58086",
                "vendor_name": "Intel(R) Corporation",
            }
        ]
    }
    script.write_text(f"#!/bin/sh\necho x >> {calls}\ncat <<'EOF'\n{json.dumps(out)}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_find_cards_skips_integrated_and_other_vendors(sysfs):
    cards = find_cards(str(sysfs))
    assert [(c.card, c.bdf, c.driver, c.vram_total) for c in cards] == [
        ("card0", "0000:03:00.0", "i915", 16 * GiB),
        ("card2", "0000:29:00.0", "xe", 128 * GiB),
    ]
    assert cards[0].nodes == ("card0", "renderD128")
    with_igpu = find_cards(str(sysfs), include_integrated=True)
    assert [c.card for c in with_igpu] == ["card1", "card0", "card2"]  # PCI order


def test_probe(sysfs, proc, xpu_smi):
    clock = iter([1_000_000_000, 6_000_000_000])
    probe = IntelProbe(
        sysfs_root=str(sysfs), proc_root=str(proc), xpu_smi=str(xpu_smi), clock_ns=lambda: next(clock)
    )
    arc, pvc = probe.probe()
    assert (arc.index, arc.brand, arc.name, arc.type) == (0, "intel", "Intel Arc A770", "arca770")
    assert (arc.vram_total, arc.vram_used, arc.uuid) == (16 * GiB, 1 * GiB, "intel-0000:03:00.0")
    # One client reached through three descriptors in two processes counts once.
    assert [(p.pid, p.uid, p.used_memory) for p in arc.processes] == [(100, os.getuid(), 1 * GiB)]
    assert (pvc.name, pvc.type, pvc.vram_total, pvc.vram_used) == (
        "Intel(R) Data Center GPU Max 1550",
        "max1550",
        128 * GiB,
        4 * GiB,
    )
    assert pvc.uuid.startswith("01000000-")
    assert arc.util == pvc.util == 0  # nothing to compare with yet
    assert (arc.visibility_id, pvc.visibility_id, arc.mig_mode) == ("0", "1", None)

    # Five seconds later: render busy 2.5 s of 5 s; xe compute 32000 of 10000 cycles on 4 engines.
    for pid, fd in ((100, 5), (100, 6), (101, 3)):  # one client: every descriptor shows it
        add_client(proc, pid, fd, "/dev/dri/renderD128", i915_client(3_500_000_000))
    add_client(proc, 200, 4, "/dev/dri/renderD130", xe_client(4000, 37000, 20_000))
    arc, pvc = probe.probe()
    assert arc.util == 50
    assert pvc.util == 80  # the busiest class: ccs 32000/10000/4, rcs only 30%
    assert (xpu_smi.parent / "xpu-smi.calls").read_text().count("x") == 1  # run once, not per sample


def test_without_xpu_smi_names_come_from_pci_ids(sysfs, proc):
    gpus = IntelProbe(sysfs_root=str(sysfs), proc_root=str(proc), xpu_smi=None).probe()
    assert [g.name for g in gpus] == ["Intel Arc A770", "Intel Data Center GPU Max 1550"]
    assert [g.type for g in gpus] == ["arca770", "max1550"]


def test_no_cards_is_not_an_error(tmp_path):
    probe = IntelProbe(sysfs_root=str(tmp_path), proc_root=str(tmp_path), xpu_smi=None)
    assert probe.probe() == [] and probe.available is False


def test_visibility_and_device_nodes(sysfs, proc, tmp_path):
    dev = tmp_path / "dev"
    for n in ("card2", "renderD130", "renderD128"):
        write(dev / "dri" / n, "")
    probe = IntelProbe(sysfs_root=str(sysfs), proc_root=str(proc), dev_root=str(dev), xpu_smi=None)
    probe.probe()
    assert probe.visibility_env([1]) == {"ZE_AFFINITY_MASK": "1", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert probe.device_nodes([1]) == [f"{dev}/dri/card2", f"{dev}/dri/renderD130"]
    assert probe.device_nodes([0]) == [f"{dev}/dri/renderD128"]  # card0 node absent here


def test_fdinfo_units_and_legacy_keys():
    c = drmclients.client_from_fdinfo(
        1,
        {
            "drm-driver": "i915",
            "drm-client-id": "3",
            "drm-pdev": "0000:03:00.0",
            "drm-memory-local0": "2 MiB",
        },
    )
    assert c is not None and c.vram == 2 << 20
    assert drmclients.client_from_fdinfo(1, {"pos": "0"}) is None


def test_engine_meter_ignores_clients_that_came_and_went():
    meter = drmclients.EngineMeter()
    a = drmclients.DrmClient(1, "p", "1", engines={"render": (0, None)})
    assert meter.update([a], 0) == {}
    b = drmclients.DrmClient(2, "p", "2", engines={"render": (10**9, None)})  # new: no baseline
    a2 = drmclients.DrmClient(1, "p", "1", engines={"render": (5 * 10**8, None)})
    assert meter.update([a2, b], 10**9) == {"p": 50}
