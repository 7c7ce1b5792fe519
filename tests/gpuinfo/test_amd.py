"""The AMD probe, with amdsmi replaced at the import boundary by recorded values.

The real ``amdsmi`` package cannot be imported without ROCm (it raises KeyError
'libamd_smi.so'), so a stand-in module with amdsmi's function names, return
shapes and exception class is put in ``sys.modules``. Figures are from published
outputs of real cards, cited per card.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from enum import IntEnum

import pytest

from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.amd import AmdProbe

MiB = 1 << 20


@dataclass
class Card:
    market_name: str
    uuid: str
    bdf: str
    vram_total: int
    vram_used: int
    gfx_activity: int | str
    partition: str | None = "SPX"
    hip_id: int | None = None
    render: int | None = None
    procs: list[dict] = field(default_factory=list)


# ROCm/ROCm#4750 (an 8x MI300X host, device id 0x74a1): "VRAM Total Memory (B):
# 206141652992", "VRAM Total Used Memory (B): 297771008" per GPU.
MI300X = Card(
    "AMD Instinct MI300X",
    "2eff74a1-0000-1000-80a5-f8d9a1b2c3d4",
    "0000:05:00.0",
    206141652992,
    297771008,
    0,
    hip_id=0,
    render=128,
    procs=[
        {
            "name": "python3",
            "pid": 5150,
            "mem": 4 << 30,
            "memory_usage": {"gtt_mem": 2 * MiB, "cpu_mem": 0, "vram_mem": 4 << 30},
        }
    ],
)
# ROCm/rocm_smi_lib#165: marketing name "AMD Instinct MI250X/MI250" (gfx90a); a 64 GiB
# MI250/MI250X GCD shows a VRAM pool of 67092480 KB (ROCm/rocm_smi_lib#160).
MI250X = Card(
    "AMD Instinct MI250X/MI250",
    "63ff740c-0000-1000-80b2-0a1b2c3d4e5f",
    "0000:29:00.0",
    67092480 * 1024,
    10 << 20,
    87,
    partition=None,
    hip_id=1,
)
# ilya-zlobintsev/LACT#533: "AMD Radeon RX 7900 XTX (0x1002:0x744C)", "VRAM Size: 24560
# MiB"; rocminfo names it "Radeon RX 7900 XTX" (ollama/ollama#3158).
RX7900XTX = Card("Radeon RX 7900 XTX", "", "0000:03:00.0", 24560 * MiB, 1200 * MiB, "N/A", partition=None)


class AmdSmiException(Exception):
    """amdsmi's base exception."""


class AmdSmiLibraryException(AmdSmiException):
    """amdsmi's library error: carries the status code as ``err_code``."""

    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = abs(err_code)

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | AMDSMI_STATUS_{self.err_code}"


NOT_SUPPORTED, DRIVER_NOT_LOADED, API_FAILED = 2, 34, 16


def fake_amdsmi(
    cards: list[Card], *, init_error: int | None = None, old_api: bool = False, memory_calls: bool = True
) -> types.ModuleType:
    """A module shaped like amdsmi (7.x names; ``old_api`` for 6.0 process handles)."""
    m = types.ModuleType("amdsmi")
    m.AmdSmiException = AmdSmiException
    m.AmdSmiLibraryException = AmdSmiLibraryException
    m.AmdSmiInitFlags = IntEnum("AmdSmiInitFlags", {"INIT_AMD_GPUS": 2})
    m.AmdSmiMemoryType = IntEnum("AmdSmiMemoryType", {"VRAM": 0, "VIS_VRAM": 1, "GTT": 2})
    m.calls = []

    def init(flag):
        m.calls.append(("init", flag))
        if init_error is not None:
            raise AmdSmiLibraryException(init_error)

    def handle(h):
        return cards[h]

    m.amdsmi_init = init
    m.amdsmi_shut_down = lambda: m.calls.append(("shut_down",))
    m.amdsmi_get_processor_handles = lambda: list(range(len(cards)))
    m.amdsmi_get_gpu_asic_info = lambda h: {"market_name": handle(h).market_name, "vendor_id": "0x1002"}
    m.amdsmi_get_gpu_device_uuid = lambda h: handle(h).uuid
    m.amdsmi_get_gpu_device_bdf = lambda h: handle(h).bdf
    m.amdsmi_get_gpu_activity = lambda h: {
        "gfx_activity": handle(h).gfx_activity,
        "umc_activity": 0,
        "mm_activity": "N/A",
    }
    if memory_calls:
        m.amdsmi_get_gpu_memory_total = lambda h, t: handle(h).vram_total
        m.amdsmi_get_gpu_memory_usage = lambda h, t: handle(h).vram_used
    # Always present; reports MiB.
    m.amdsmi_get_gpu_vram_usage = lambda h: {
        "vram_total": handle(h).vram_total >> 20,
        "vram_used": handle(h).vram_used >> 20,
    }

    def partition(h):
        if handle(h).partition is None:
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        return handle(h).partition

    def enumeration(h):
        c = handle(h)
        if c.hip_id is None:
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        return {
            "drm_render": c.render if c.render is not None else "N/A",
            "drm_card": 0,
            "hsa_id": 2,
            "hip_id": c.hip_id,
            "hip_uuid": "GPU-x",
        }

    m.amdsmi_get_gpu_compute_partition = partition
    m.amdsmi_get_gpu_enumeration_info = enumeration
    if old_api:
        m.amdsmi_get_gpu_process_list = lambda h: [("proc", h, i) for i in range(len(handle(h).procs))]
        m.amdsmi_get_gpu_process_info = lambda h, p: handle(h).procs[p[2]]
    else:
        m.amdsmi_get_gpu_process_list = lambda h: handle(h).procs
    return m


@pytest.fixture
def amdsmi(mocker):
    def install(*args, **kwargs):
        module = fake_amdsmi(*args, **kwargs)
        mocker.patch.dict("sys.modules", {"amdsmi": module})
        return module

    return install


def test_mi300x(amdsmi, tmp_path):
    amdsmi([MI300X])
    (tmp_path / "proc" / "5150").mkdir(parents=True)
    g = AmdProbe(proc_root=str(tmp_path / "proc")).probe()[0]
    assert (g.brand, g.type, g.name) == ("amd", "mi300x", "AMD Instinct MI300X")
    assert (g.vram_total, g.vram_used, g.util) == (206141652992, 297771008, 0)
    assert g.mig_mode is False  # SPX: one device, not partitioned
    assert [(p.pid, p.uid, p.used_memory) for p in g.processes] == [(5150, os.getuid(), 4 << 30)]
    assert g.visibility_id == "0"


def test_mi250x_and_consumer_card(amdsmi):
    amdsmi([MI250X, RX7900XTX])
    probe = AmdProbe()
    a, b = probe.probe()
    assert (a.type, a.vram_total, a.util, a.mig_mode) == ("mi250x", 68702699520, 87, None)
    assert a.visibility_id == "1"  # amdsmi's HIP id, not its list position
    assert (b.type, b.vram_total, b.vram_used) == ("rx7900xtx", 24560 * MiB, 1200 * MiB)
    assert b.util == 0  # "N/A"
    assert b.visibility_id == "1"  # no HIP id from this amdsmi: its position


# ROCm/legacy-rocm-build#4261: one MI300 in TPX mode, whose three partitions rocm-smi
# lists as "PCI Bus: 0000:01:00.0", "0000:01:00.1" and "0000:01:00.2" (the partition in
# the PCI function, as ROCm/rocm-systems#5805 says amdsmi reports it too). Name and
# memory as MI300X above (ROCm/ROCm#4750), per partition; HIP ids and render minors
# (renderD128...) in amdsmi's order.
TPX = [
    Card(
        "AMD Instinct MI300X",
        f"2eff74a1-0000-1000-80a5-f8d9a1b2c3d{n}",
        f"0000:01:00.{n}",
        206141652992,
        297771008,
        0,
        partition="TPX",
        hip_id=n,
        render=128 + n,
    )
    for n in range(3)
]


def test_a_partitioned_card_is_handled_as_a_card_in_mig_mode(amdsmi):
    amdsmi([RX7900XTX, *TPX])
    gpus = AmdProbe().probe()
    assert [(g.index, g.type, g.parent, g.placeable) for g in gpus] == [
        (0, "rx7900xtx", None, True),
        (1, "mi300x-tpx", 4, True),
        (2, "mi300x-tpx", 4, True),
        (3, "mi300x-tpx", 4, True),
        (4, "mi300x", None, False),
    ]
    card = gpus[4]
    assert card.mig_mode is True and card.vram_total == 3 * 206141652992
    probe = AmdProbe()
    probe.probe()
    # Each partition is reached as the runtime numbers it, through its own render node.
    assert probe.visibility_env([2]) == {"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}


def test_a_partitioned_card_without_a_bdf_is_a_card_of_its_own(amdsmi):
    amdsmi([Card("AMD Instinct MI300X", "u", "", 1, 0, 0, partition="CPX")])
    gpus = AmdProbe().probe()
    assert [(g.index, g.type, g.parent) for g in gpus] == [(0, "mi300x-cpx", 1), (1, "mi300x", None)]


def test_vram_usage_fallback_in_mib(amdsmi):
    amdsmi([RX7900XTX], memory_calls=False)
    g = AmdProbe().probe()[0]
    assert (g.vram_total, g.vram_used) == (24560 * MiB, 1200 * MiB)


def test_amdsmi_6_0_process_handles(amdsmi):
    amdsmi([MI300X], old_api=True)
    g = AmdProbe(proc_root="/nonexistent").probe()[0]
    assert [(p.pid, p.used_memory) for p in g.processes] == [(5150, 4 << 30)]


def test_real_import_without_rocm_is_not_an_error(capsys):
    # The real package: here it raises KeyError 'libamd_smi.so' on import.
    probe = AmdProbe()
    assert probe.probe() == [] and probe.available is False
    assert "amdsmi cannot be loaded" in probe.reason
    # Its complaint printed on stdout must not leak into a CLI's --json output.
    assert capsys.readouterr().out == ""
    probe.probe()  # and it is not retried every sample


def test_import_raising_oserror_is_not_an_error(tmp_path, monkeypatch):
    # A half-installed ROCm: the package is there, its library will not load.
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text(
        "raise OSError('libamd_smi.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    probe = AmdProbe()
    assert probe.probe() == [] and not probe.available
    assert "OSError" in probe.reason


def test_driver_not_loaded_is_not_an_error(amdsmi):
    amdsmi([], init_error=DRIVER_NOT_LOADED)
    probe = AmdProbe()
    assert probe.probe() == [] and not probe.available and "no AMD GPU driver" in probe.reason


def test_broken_driver_raises_clearly(amdsmi):
    amdsmi([], init_error=API_FAILED)
    with pytest.raises(GpuProbeError, match="amdsmi cannot start: Error code: 16 .*Run amd-smi"):
        AmdProbe().probe()


def test_failure_while_reading_shuts_down_and_raises(amdsmi):
    m = amdsmi([MI300X])

    def boom(h, t):
        raise AmdSmiLibraryException(API_FAILED)

    m.amdsmi_get_gpu_memory_total = boom
    m.amdsmi_get_gpu_vram_usage = lambda h: boom(h, 0)
    probe = AmdProbe()
    with pytest.raises(GpuProbeError, match="AMD driver failed"):
        probe.probe()
    assert ("shut_down",) in m.calls


def test_visibility_env_renumbers_for_hip(amdsmi):
    amdsmi(
        [
            Card("AMD Instinct MI300X", f"u{i}", f"0000:0{i}:00.0", 1, 0, 0, hip_id=i, render=128 + i)
            for i in range(4)
        ]
    )
    probe = AmdProbe()
    probe.probe()
    # ROCR picks the cards; HIP then numbers what is left from 0.
    assert probe.visibility_env([2, 3]) == {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0,1"}


def test_device_nodes(amdsmi, tmp_path):
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    for name in ("kfd", "dri/renderD128", "dri/renderD130", "dri/card2"):
        (dev / name).touch()
    sysfs = tmp_path / "sys"
    drm = sysfs / "bus/pci/devices/0000:29:00.0/drm"
    (drm / "card2").mkdir(parents=True)
    (drm / "renderD130").mkdir()
    amdsmi([MI300X, MI250X])
    probe = AmdProbe(sysfs_root=str(sysfs), dev_root=str(dev))
    probe.probe()
    assert probe.device_nodes([0]) == [f"{dev}/kfd", f"{dev}/dri/renderD128"]
    # No render minor from amdsmi: found through the PCI device in sysfs.
    assert probe.device_nodes([1]) == [f"{dev}/kfd", f"{dev}/dri/card2", f"{dev}/dri/renderD130"]
