"""Intel GPUs from sysfs/DRM (the xe and i915 drivers), named by xpu-smi where present.

Cards are found under ``/sys/class/drm/cardN``: Intel vendor id, bound to xe or
i915, with local memory. Integrated GPUs share host RAM and are not offered to
jobs unless ``include_integrated`` is set. Total VRAM comes from, in order:

- ``cardN/lmem_total_bytes`` (Intel's backported i915; also looked for under ``device/``);
- the sum of ``device/tile*/physical_vram_size_bytes`` (xe).

Used VRAM, utilisation and processes come from DRM fdinfo (see
:mod:`mtgpu.gpuinfo.drmclients`): the sum of each client's resident local memory,
the busiest engine class since the last sample, and the clients' PIDs. Memory
the kernel driver keeps for itself is not in that sum, so it can read a little low.

Names come from ``xpu-smi discovery -j`` when it is installed (run once, not
every sample), else from the PCI device id, else "Intel GPU 0xNNNN".

Visibility: ``ZE_AFFINITY_MASK`` lists Level Zero device numbers, and
``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`` makes those numbers follow PCI order, which is
the order this probe uses.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mtgpu.errors import CommandError, GpuProbeError
from mtgpu.gpuinfo import drmclients
from mtgpu.gpuinfo.base import GpuProbe, existing, process_uid, run_check_job
from mtgpu.gpuinfo.names import normalize_type
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess
from mtgpu.proc import run

_INTEL_VENDOR = "0x8086"
_DRIVERS = ("xe", "i915")

# PCI device ids of the discrete cards most often met in compute hosts.
PCI_NAMES: Mapping[str, str] = {
    "0x0bd5": "Intel Data Center GPU Max 1550",
    "0x0bda": "Intel Data Center GPU Max 1100",
    "0x56c0": "Intel Data Center GPU Flex 170",
    "0x56c1": "Intel Data Center GPU Flex 140",
    "0x56a0": "Intel Arc A770",
    "0x56a1": "Intel Arc A750",
    "0x56a5": "Intel Arc A380",
    "0xe20b": "Intel Arc B580",
    "0xe20c": "Intel Arc B570",
}

# The check job counts Level Zero devices, which is what ZE_AFFINITY_MASK filters.
_ZE_JOB = r"""
import ctypes, sys
try:
    ze = ctypes.CDLL("libze_loader.so.1")
except OSError as exc:
    sys.exit("libze_loader.so.1 cannot be loaded (%s); install the Level Zero loader" % exc)
if ze.zeInit(1):  # ZE_INIT_FLAG_GPU_ONLY
    print(0)
    sys.exit(0)
n = ctypes.c_uint32(0)
ze.zeDriverGet(ctypes.byref(n), None)
drivers = (ctypes.c_void_p * n.value)()
ze.zeDriverGet(ctypes.byref(n), drivers)
total = 0
for d in drivers:
    c = ctypes.c_uint32(0)
    ze.zeDeviceGet(ctypes.c_void_p(d), ctypes.byref(c), None)
    total += c.value
print(total)
"""


@dataclass(frozen=True)
class IntelCard:
    """One Intel GPU found in sysfs."""

    card: str  # "card1"
    bdf: str  # "0000:03:00.0"
    device_id: str  # "0x56a0"
    driver: str  # "xe" or "i915"
    vram_total: int
    nodes: tuple[str, ...]  # DRM node names: ("card1", "renderD129")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return 0


def find_cards(sysfs_root: str = "/sys", include_integrated: bool = False) -> list[IntelCard]:
    """Intel xe/i915 cards under ``sysfs_root``, in PCI order."""
    drm = os.path.join(sysfs_root, "class/drm")
    try:
        names = [n for n in os.listdir(drm) if n.startswith("card") and n[4:].isdigit()]
    except OSError:
        return []
    cards = []
    for name in names:
        dev = os.path.join(drm, name, "device")
        if _read(os.path.join(dev, "vendor")).lower() != _INTEL_VENDOR:
            continue
        driver = os.path.basename(os.path.realpath(os.path.join(dev, "driver")))
        if driver not in _DRIVERS:
            continue
        vram = (
            _int(_read(os.path.join(drm, name, "lmem_total_bytes")))
            or _int(_read(os.path.join(dev, "lmem_total_bytes")))
            or sum(
                _int(_read(p))
                for p in sorted(glob.glob(os.path.join(dev, "tile*", "physical_vram_size_bytes")))
            )
        )
        if not vram and not include_integrated:
            continue  # an integrated GPU: its "VRAM" is host RAM
        try:
            nodes = tuple(
                sorted(n for n in os.listdir(os.path.join(dev, "drm")) if n.startswith(("card", "renderD")))
            )
        except OSError:
            nodes = (name,)
        cards.append(
            IntelCard(
                card=name,
                bdf=os.path.basename(os.path.realpath(dev)).lower(),
                device_id=_read(os.path.join(dev, "device")).lower(),
                driver=driver,
                vram_total=vram,
                nodes=nodes,
            )
        )
    return sorted(cards, key=lambda c: c.bdf)


def parse_discovery(text: str) -> dict[str, dict]:
    """``xpu-smi discovery -j`` output as PCI address -> device entry."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    devices = data.get("device_list", []) if isinstance(data, dict) else []
    return {str(d.get("pci_bdf_address", "")).lower(): d for d in devices if isinstance(d, dict)}


class IntelProbe(GpuProbe):
    """Intel GPUs via sysfs and DRM fdinfo. The roots and ``xpu_smi`` exist for tests."""

    brand = "intel"

    def __init__(
        self,
        *,
        sysfs_root: str = "/sys",
        proc_root: str = "/proc",
        dev_root: str = "/dev",
        xpu_smi: str | None = "xpu-smi",
        include_integrated: bool = False,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__("intel")
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.dev_root = dev_root
        self.xpu_smi = xpu_smi
        self.include_integrated = include_integrated
        self._clock_ns = clock_ns
        self._meter = drmclients.EngineMeter()
        self._discovery: dict[str, dict] | None = None
        self._cards: dict[int, IntelCard] = {}

    def probe(self) -> list[GpuInfo]:
        """Measure every Intel GPU; see :class:`~mtgpu.gpuinfo.base.GpuProbe`."""
        cards = find_cards(self.sysfs_root, self.include_integrated)
        if not cards:
            return self._unavailable("no Intel GPU with local memory bound to xe or i915")
        discovery = self._discover()
        clients = drmclients.scan(self.proc_root, _DRIVERS)
        busy = self._meter.update(clients, self._clock_ns())
        gpus = []
        self._cards = {}
        for i, card in enumerate(cards):
            mine = [c for c in clients if c.pdev == card.bdf]
            found = discovery.get(card.bdf, {})
            name = str(
                found.get("device_name")
                or PCI_NAMES.get(card.device_id)
                or f"Intel GPU {card.device_id or card.bdf}"
            )
            used: dict[int, int] = {}
            for c in mine:
                used[c.pid] = used.get(c.pid, 0) + c.vram
            self._cards[i] = card
            gpus.append(
                GpuInfo(
                    index=i,
                    brand="intel",
                    type=normalize_type("intel", name),
                    name=name,
                    uuid=str(found.get("uuid") or f"intel-{card.bdf}"),
                    vram_total=card.vram_total,
                    vram_used=min(sum(used.values()), card.vram_total),
                    util=busy.get(card.bdf, 0),
                    processes=tuple(
                        GpuProcess(pid, process_uid(pid, self.proc_root), mem)
                        for pid, mem in sorted(used.items())
                    ),
                    mig_mode=None,
                    visibility_id=str(i),
                )
            )
        return self._found(gpus)

    def _discover(self) -> dict[str, dict]:
        # Once per daemon: xpu-smi is slow to start and names do not change.
        if self._discovery is None:
            self._discovery = {}
            exe = shutil.which(self.xpu_smi) if self.xpu_smi else None
            if exe:
                try:
                    self._discovery = parse_discovery(run([exe, "discovery", "-j"], timeout=30).stdout)
                except CommandError:
                    pass  # names then come from the PCI id table
        return self._discovery

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """ZE_AFFINITY_MASK, with Level Zero told to number devices in PCI order."""
        return {
            "ZE_AFFINITY_MASK": ",".join(self.visibility_ids(indices)),
            "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
        }

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """Each GPU's ``/dev/dri/cardN`` and ``/dev/dri/renderDN``."""
        return existing(
            [
                f"{self.dev_root}/dri/{n}"
                for i in indices
                for n in (self._cards[i].nodes if i in self._cards else ())
            ]
        )

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """One "" per device Level Zero shows a job run with ``env`` (it only counts)."""
        out = run_check_job([sys.executable, "-c", _ZE_JOB], env).strip()
        if not out.isdigit():
            raise GpuProbeError(f"the Level Zero check job printed {out!r}, not a device count")
        return [""] * int(out)
