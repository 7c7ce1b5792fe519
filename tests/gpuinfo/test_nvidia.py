"""The NVIDIA probe, with NVML replaced at the pynvml boundary by recorded values.

Only functions of the real ``pynvml`` module are patched; the structures they
return are pynvml's own ctypes types, as the real calls return them. Figures
come from nvidia-smi outputs published in GitHub issues (cited per card). Those
outputs show no UUIDs, so the UUIDs below are made up in NVML's format.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import pynvml
import pytest

from mtgpu.config import Options
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.nvidia import NvidiaProbe
from mtgpu.gpuinfo.sampler import Sampler

MiB = 1 << 20


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class Mig:
    """One MIG device: what NVML reports for it, and where it sits on its card."""

    total: int
    used: int
    name: str
    uuid: str
    gi: int
    gi_start: int
    ci: int = 0
    ci_start: int = 0


@dataclass
class Card:
    name: str
    uuid: str
    total: int | None  # None: NVML answers "not supported" (MIG-enabled parent)
    used: int
    util: int | None  # None: "not supported"
    minor: int
    mig: int | None = None  # current MIG mode; None: "not supported" (consumer cards)
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    mig_devices: list[Mig] = field(default_factory=list)


# wilicc/gpu-burn#114 (driver 550.90.07): "NVIDIA H100 80GB HBM3 ... 72790MiB / 81559MiB |
# 0%" on GPU 0 and "72790MiB / 81559MiB | 4%" on GPU 1; MIG M. "Disabled".
H100 = [
    Card(
        "NVIDIA H100 80GB HBM3",
        "GPU-5a1f0c3e-9d2b-4c8a-b7e1-2f6d8a9c0b11",
        81559 * MiB,
        72790 * MiB,
        0,
        0,
        mig=0,
    ),
    Card(
        "NVIDIA H100 80GB HBM3",
        "GPU-7c3e1a2b-0f4d-4e6a-9b8c-1d2e3f4a5b6c",
        81559 * MiB,
        72790 * MiB,
        4,
        1,
        mig=0,
    ),
]
# nvidia-smi on an 8x H200 host (driver 570.158.01), published with product name
# "NVIDIA H200" (as in NVIDIA/mig-parted#120): GPU 0 "130215MiB / 143771MiB | 0%",
# one process, PID 1117159 "VLLM::EngineCore", whose usage column is cut at
# "13020..."; 130200 MiB stands in for it.
H200 = Card(
    "NVIDIA H200",
    "GPU-0d6c2b7a-3e41-4f58-9a6b-c7d8e9f0a1b2",
    143771 * MiB,
    130215 * MiB,
    0,
    0,
    mig=0,
    procs=[(1117159, 130200 * MiB)],
)
# RLinf/RLinf#255 (driver 550.163.01): "NVIDIA GeForce RTX 4090 ... 507MiB / 24564MiB |
# 0% Default | N/A" (no MIG on consumer cards).
RTX4090 = Card(
    "NVIDIA GeForce RTX 4090",
    "GPU-3b9a8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d",
    24564 * MiB,
    507 * MiB,
    0,
    0,
    mig=None,
    procs=[(4242, None)],
)
# NVIDIA/DCGM#152 (driver 535.104.05): "NVIDIA A100-SXM4-80GB ... On | N/A | N/A Default |
# Enabled": MIG on, whole-card memory and utilisation not reported. MIG devices as in
# XuehaiPan/nvitop#8 (its GPU 1, nvidia-smi's "MIG devices" table): GI 3, 5 and 6, CI 0,
# "14366MiB / 19968MiB", "9826MiB / 19968MiB", "13MiB / 19968MiB", 28 SMs each, which is
# the 2g.20gb profile of an A100-SXM4-80GB. That output shows no placements; 0, 2 and 4
# are the 2g profile's placements (nvidia-smi mig -lgipp). UUIDs in the MIG-... form of
# influxdata/telegraf#5812's `nvidia-smi -L` on the same card model.
A100_MIG = Card(
    "NVIDIA A100-SXM4-80GB",
    "GPU-513536b6-7d19-9063-b049-1e69664bb298",
    None,
    0,
    None,
    0,
    mig=1,
    procs=[(31337, 14000 * MiB)],
    mig_devices=[
        Mig(
            19968 * MiB,
            14366 * MiB,
            "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a",
            gi=3,
            gi_start=0,
        ),
        Mig(
            19968 * MiB,
            9826 * MiB,
            "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "MIG-a45882f0-9215-5733-a0c1-49286ab31cb5",
            gi=5,
            gi_start=2,
        ),
        Mig(
            19968 * MiB,
            13 * MiB,
            "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
            "MIG-f00d722c-f4e1-52c9-aa31-750441ae1bfe",
            gi=6,
            gi_start=4,
        ),
    ],
)
# An H200 in MIG mode with mixed profiles. Profile names and sizes from `nvidia-smi mig
# -lgip` of an H200 (NVIDIA/mig-parted#120): "MIG 1g.18gb ... 16.00" GiB, "MIG 2g.35gb ...
# 32.25", "MIG 3g.71gb ... 69.50"; placements 0, 2 and 4 are allowed for those profiles
# (1g: 0-6, 2g: 0/2/4/6, 3g: 0/4) and do not overlap. NVML names a MIG device after its
# card plus "MIG <profile>" (the names nvidia-smi -L prints). Used figures made up.
H200_MIG = Card(
    "NVIDIA H200",
    "GPU-0d6c2b7a-3e41-4f58-9a6b-c7d8e9f0a1b2",
    None,
    0,
    None,
    2,
    mig=1,
    mig_devices=[
        Mig(
            69632 * MiB,
            0,
            "NVIDIA H200 MIG 3g.71gb",
            "MIG-1b2c3d4e-5f60-5172-8394-a5b6c7d8e9f0",
            gi=2,
            gi_start=4,
        ),
        Mig(
            33024 * MiB,
            4096 * MiB,
            "NVIDIA H200 MIG 2g.35gb",
            "MIG-2c3d4e5f-6071-5283-94a5-b6c7d8e9f0a1",
            gi=5,
            gi_start=2,
        ),
        Mig(
            16384 * MiB,
            0,
            "NVIDIA H200 MIG 1g.18gb",
            "MIG-3d4e5f60-7182-5394-a5b6-c7d8e9f0a1b2",
            gi=9,
            gi_start=0,
        ),
    ],
)
# /proc/driver/nvidia-caps/mig-minors lists "gpu<minor>/gi<id>/access <devminor>" and
# "gpu<minor>/gi<id>/ci<id>/access <devminor>" (NVIDIA's MIG user guide, "Device Nodes
# and Capabilities"); the minors below follow the driver's layout of 1 + 1 for config and
# monitor, then per GPU instance its access and its 8 compute instances.
MIG_MINORS = "".join(
    ["config 1\nmonitor 2\n"]
    + [
        f"gpu{g}/gi{gi}/access {3 + (g * 15 + gi) * 9}\n"
        + "".join(f"gpu{g}/gi{gi}/ci{ci}/access {4 + (g * 15 + gi) * 9 + ci}\n" for ci in range(8))
        for g in range(3)
        for gi in range(15)
    ]
)


@pytest.fixture
def nvml(mocker):
    """Install ``cards`` behind pynvml's functions; returns a setter."""
    state: dict = {"cards": [], "init_error": None, "count_error": None}

    def card(h):
        return state["cards"][h[1]]

    def dev(h):
        return card(h).mig_devices[h[2]]

    def memory(h):
        if h[0] == "mig":
            d = dev(h)
            return pynvml.c_nvmlMemory_t(total=d.total, free=d.total - d.used, used=d.used)
        c = card(h)
        if c.total is None:
            raise nvml_error(NOT_SUPPORTED)
        return pynvml.c_nvmlMemory_t(total=c.total, free=c.total - c.used, used=c.used)

    def util(h):
        if card(h).util is None:
            raise nvml_error(NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=card(h).util, memory=0)

    def mig_mode(h):
        if card(h).mig is None:
            raise nvml_error(NOT_SUPPORTED)
        return [card(h).mig, card(h).mig]

    def mig_handle(h, j):
        if j >= len(card(h).mig_devices):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], j)

    def compute(h):
        if h[0] == "mig":
            return []
        out = []
        for pid, mem in card(h).procs:
            p = pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=pid, usedGpuMemory=0, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
                )
            )
            p.usedGpuMemory = mem  # the real call turns "not available" into None too
            out.append(p)
        return out

    def by_gi(i, gi):
        return next(d for d in state["cards"][i].mig_devices if d.gi == gi)

    def gi_info(g):
        if state.get("placement_error"):
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        return pynvml.c_nvmlGpuInstanceInfo_t(
            id=g[2], placement=pynvml.c_nvmlGpuInstancePlacement_t(start=by_gi(g[1], g[2]).gi_start)
        )

    def ci_info(c):
        d = by_gi(c[1], c[2])
        return pynvml.c_nvmlComputeInstanceInfo_t(
            id=c[3], placement=pynvml.c_nvmlComputeInstancePlacement_t(start=d.ci_start)
        )

    def init():
        if state["init_error"] is not None:
            raise state["init_error"]

    def count():
        if state["count_error"] is not None:
            raise state["count_error"]
        return len(state["cards"])

    patches = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": count,
        "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
        "nvmlDeviceGetName": lambda h: dev(h).name if h[0] == "mig" else card(h).name,
        "nvmlDeviceGetUUID": lambda h: dev(h).uuid if h[0] == "mig" else card(h).uuid,
        "nvmlDeviceGetGpuInstanceId": lambda h: dev(h).gi,
        "nvmlDeviceGetComputeInstanceId": lambda h: dev(h).ci,
        "nvmlDeviceGetGpuInstanceById": lambda h, gi: ("gi", h[1], gi),
        "nvmlGpuInstanceGetInfo": gi_info,
        "nvmlGpuInstanceGetComputeInstanceById": lambda g, ci: ("ci", g[1], g[2], ci),
        "nvmlComputeInstanceGetInfo": ci_info,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetMinorNumber": lambda h: card(h).minor,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetComputeRunningProcesses": compute,
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    mocks = {name: mocker.patch.object(pynvml, name, side_effect=fn) for name, fn in patches.items()}
    state["mocks"] = mocks
    return state


def test_h100_pair(nvml):
    nvml["cards"] = H100
    gpus = NvidiaProbe().probe()
    assert [g.index for g in gpus] == [0, 1]
    g = gpus[1]
    assert (g.brand, g.type, g.name) == ("nvidia", "h100", "NVIDIA H100 80GB HBM3")
    assert (g.vram_total, g.vram_used, g.vram_free) == (81559 * MiB, 72790 * MiB, 8769 * MiB)
    assert g.util == 4 and g.mig_mode is False and g.processes == ()
    # Jobs are pointed at cards by UUID: CUDA's numbering need not match NVML's.
    assert g.visibility_id == g.uuid == H100[1].uuid


def test_h200_with_a_process(nvml, tmp_path):
    nvml["cards"] = [H200]
    proc = tmp_path / "proc"
    (proc / "1117159").mkdir(parents=True)  # the process exists here, owned by us
    gpus = NvidiaProbe(proc_root=str(proc)).probe()
    g = gpus[0]
    assert (g.type, g.vram_total, g.vram_used) == ("h200", 143771 * MiB, 130215 * MiB)
    assert [(p.pid, p.uid, p.used_memory) for p in g.processes] == [(1117159, os.getuid(), 130200 * MiB)]


def test_consumer_card_without_mig_and_unknown_process_memory(nvml):
    nvml["cards"] = [RTX4090]
    g = NvidiaProbe(proc_root="/nonexistent").probe()[0]
    assert (g.type, g.vram_total, g.vram_used, g.util) == ("rtx4090", 24564 * MiB, 507 * MiB, 0)
    assert g.mig_mode is None
    # usedGpuMemory None (the driver cannot tell) is 0; an exited process has no UID.
    assert [(p.pid, p.uid, p.used_memory) for p in g.processes] == [(4242, None, 0)]


def test_mig_enabled_card_sums_its_instances(nvml):
    nvml["cards"] = [A100_MIG]
    g = NvidiaProbe().probe()[0]
    assert g.mig_mode is True and g.type == "a100-80gb"
    assert g.vram_total == 3 * 19968 * MiB
    assert g.vram_used == (14366 + 9826 + 13) * MiB
    assert g.util == 0  # not measurable with MIG on
    assert [p.pid for p in g.processes] == [31337]


def test_mig_card_with_whole_card_memory_uses_it(nvml):
    nvml["cards"] = [
        Card(
            "NVIDIA A100-SXM4-80GB",
            "GPU-x",
            81920 * MiB,
            13 * MiB,
            None,
            0,
            mig=1,
            mig_devices=[A100_MIG.mig_devices[2]],
        )
    ]
    g = NvidiaProbe().probe()[0]
    assert (g.vram_total, g.vram_used, g.mig_mode) == (81920 * MiB, 13 * MiB, True)


def test_library_missing_is_not_an_error(nvml):
    nvml["init_error"] = nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    probe = NvidiaProbe()
    assert probe.probe() == []
    assert probe.available is False and "NVML Shared Library Not Found" in probe.reason


def test_driver_not_loaded_is_not_an_error(nvml):
    nvml["init_error"] = nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    probe = NvidiaProbe()
    assert probe.probe() == [] and probe.available is False


def test_pynvml_not_importable_is_not_an_error(mocker):
    mocker.patch.dict("sys.modules", {"pynvml": None})  # what a missing package looks like
    probe = NvidiaProbe()
    assert probe.probe() == [] and not probe.available
    assert "nvidia-ml-py cannot be imported" in probe.reason


def test_version_mismatch_is_reported_clearly(nvml):
    # What nvidia-smi prints after a driver upgrade without a reboot:
    # "Failed to initialize NVML: Driver/library version mismatch".
    nvml["init_error"] = nvml_error(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(GpuProbeError, match="NVML cannot start.*version mismatch.*reboot"):
        NvidiaProbe().probe()


def test_lost_gpu_raises_then_recovers(nvml):
    nvml["cards"] = H100
    probe = NvidiaProbe()
    nvml["count_error"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuProbeError, match="GPU is lost"):
        probe.probe()
    assert nvml["mocks"]["nvmlShutdown"].call_count == 1  # NVML starts afresh next time
    nvml["count_error"] = None
    assert len(probe.probe()) == 2
    assert nvml["mocks"]["nvmlInit"].call_count == 2


def test_nvml_is_initialised_once(nvml):
    nvml["cards"] = [RTX4090]
    probe = NvidiaProbe()
    for _ in range(3):
        probe.probe()
    assert nvml["mocks"]["nvmlInit"].call_count == 1


def test_sampler_logs_a_broken_driver_once(nvml, caplog):
    nvml["init_error"] = nvml_error(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    sampler = Sampler(Options(server_name="gpu01"), probes=[NvidiaProbe()])
    with caplog.at_level(logging.ERROR, logger="mtgpu.gpuinfo"):
        for _ in range(4):
            inv = sampler.sample()
    assert inv.gpus == () and len(inv.errors) == 1 and "version mismatch" in inv.errors[0]
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1
    nvml["init_error"] = None
    nvml["cards"] = [RTX4090]
    with caplog.at_level(logging.WARNING, logger="mtgpu.gpuinfo"):
        inv = sampler.sample()
    assert inv.errors == () and len(inv.gpus) == 1
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_visibility_and_device_nodes(nvml, tmp_path):
    nvml["cards"] = [H100[0], Card("NVIDIA H100 80GB HBM3", "GPU-b", 1, 0, 0, 3, mig=0)]
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    probe = NvidiaProbe(dev_root=str(tmp_path))
    probe.probe()
    assert probe.visibility_env([1]) == {"CUDA_VISIBLE_DEVICES": "GPU-b"}
    assert probe.visibility_env([0, 1]) == {"CUDA_VISIBLE_DEVICES": f"{H100[0].uuid},GPU-b"}
    # The minor number, not the index, names the device file; missing files are left out.
    assert probe.device_nodes([1]) == [
        f"{tmp_path}/nvidia3",
        f"{tmp_path}/nvidiactl",
        f"{tmp_path}/nvidia-uvm",
    ]


def test_bytes_names_from_older_bindings(nvml):
    nvml["cards"] = [Card(b"NVIDIA L40S", b"GPU-l40s", 46068 * MiB, 0, 0, 0, mig=0)]  # type: ignore[arg-type]
    g = NvidiaProbe().probe()[0]
    assert (g.name, g.uuid, g.type) == ("NVIDIA L40S", "GPU-l40s", "l40s")


# ---------------------------------------------------------------- MIG devices are GPUs


def test_mig_devices_are_gpus_under_their_card(nvml):
    nvml["cards"] = [H100[0], H200_MIG]
    gpus = NvidiaProbe().probe()
    card = gpus[1]
    assert (card.index, card.mig_mode, card.parent, card.placeable) == (1, True, None, False)
    mig = gpus[2:]
    # Indexed by where each sits on its card: 2 cards, card 1, first slices 0, 2 and 4.
    assert [g.index for g in mig] == [2 + 8 + 4, 2 + 8 + 2, 2 + 8 + 0]
    assert [g.type for g in mig] == ["h200-3g.71gb", "h200-2g.35gb", "h200-1g.18gb"]
    assert [g.vram_total for g in mig] == [69632 * MiB, 33024 * MiB, 16384 * MiB]
    assert mig[1].vram_used == 4096 * MiB
    assert all(g.parent == 1 and g.placeable and g.brand == "nvidia" for g in mig)
    assert [g.visibility_id for g in mig] == [d.uuid for d in H200_MIG.mig_devices]
    assert all(g.uuid.startswith("MIG-") for g in mig)
    assert gpus[0].placeable and gpus[0].parent is None


def test_a_mig_device_keeps_its_index_when_another_is_destroyed(nvml):
    """An administrator destroys the 3g instance (nvidia-smi mig -dci/-dgi): the others
    keep their numbers, so the jobs on them keep their reservations."""
    nvml["cards"] = [H200_MIG]
    probe = NvidiaProbe()
    before = {g.uuid: g.index for g in probe.probe() if g.parent is not None}
    nvml["cards"] = [Card(**{**H200_MIG.__dict__, "mig_devices": H200_MIG.mig_devices[1:]})]
    after = {g.uuid: g.index for g in probe.probe() if g.parent is not None}
    assert len(after) == 2 and all(before[u] == i for u, i in after.items())


def test_mig_devices_without_readable_placements_are_numbered_in_nvml_order(nvml):
    nvml["cards"] = [A100_MIG]
    nvml["placement_error"] = True
    mig = [g for g in NvidiaProbe().probe() if g.parent is not None]
    assert [g.index for g in mig] == [1, 2, 3]
    assert [g.type for g in mig] == ["a100-80gb-2g.20gb"] * 3


def test_a_job_on_a_mig_device_gets_its_card_and_its_own_capability_files(nvml, tmp_path):
    nvml["cards"] = [H200_MIG]
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    (dev / "nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia-caps/mig-minors").write_text(MIG_MINORS)
    for n in ("nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / n).touch()
    for m in range(1, 3 + 45 * 9):
        (dev / f"nvidia-caps/nvidia-cap{m}").touch()
    probe = NvidiaProbe(dev_root=str(dev), proc_root=str(proc))
    mig = {g.type: g for g in probe.probe() if g.parent is not None}
    one = mig["h200-2g.35gb"]  # GI 5 on the card whose minor is 2
    gi_minor, ci_minor = 3 + (2 * 15 + 5) * 9, 4 + (2 * 15 + 5) * 9
    assert probe.device_nodes([one.index]) == [
        f"{dev}/nvidia2",
        f"{dev}/nvidia-caps/nvidia-cap{gi_minor}",
        f"{dev}/nvidia-caps/nvidia-cap{ci_minor}",
        f"{dev}/nvidiactl",
        f"{dev}/nvidia-uvm",
    ]
    other = set(probe.device_nodes([mig["h200-3g.71gb"].index]))
    assert f"{dev}/nvidia-caps/nvidia-cap{gi_minor}" not in other
    assert probe.visibility_env([one.index]) == {"CUDA_VISIBLE_DEVICES": one.uuid}


def test_sampler_numbers_mig_parents_host_wide(nvml):
    nvml["cards"] = [A100_MIG]
    inv = Sampler(Options(), [NvidiaProbe()]).sample()
    assert [(g.index, g.parent) for g in inv.gpus] == [(0, None), (1, 0), (3, 0), (5, 0)]
    assert [g.to_dict().get("parent") for g in inv.gpus] == [None, 0, 0, 0]
