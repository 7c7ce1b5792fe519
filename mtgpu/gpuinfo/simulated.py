"""Simulated GPUs (``SIMULATED_GPUS``), for tests, demos and capacity planning.

A simulated GPU's measured VRAM use is what MTGPU's own placed jobs declared
(``set_declared``, called by the daemon) plus ``used``: work outside MTGPU, which
an admin changes at run time with ``mtgpu-admin simulate NODE GPU_INDEX --used
SIZE`` (``set_outside_used``). The sum is capped at the card's VRAM, as a real
card cannot report more than it has. Utilisation is the declared share of VRAM,
so a busy simulated card also looks busy.

A job's processes can be made to hold VRAM too (``mtgpu-admin simulate --job ID
--used SIZE``, :meth:`set_process_used`): the card then reports that process with
that use, as NVML's process list would, and the job's measured use replaces what
it declared. The VRAM watchdog reads it like a real card's. A process that has
exited holds nothing.

Indices run on across entries: ``[{type: rtx4090, count: 2}, {type: a100-80gb,
count: 1}]`` gives GPUs 0 and 1 (rtx4090) and 2 (a100-80gb).

An entry with ``mig: [3g.40gb, 2g.20gb, ...]`` is a card in MIG mode, reported as
the NVIDIA probe reports one: the card (never placed whole) and, after all the
cards, its MIG devices, each a GPU with ``parent`` the card, a ``MIG-SIM-...``
UUID that ``CUDA_VISIBLE_DEVICES`` gets, the profile's memory and the type
``TYPE-PROFILE`` (``h100-3g.40gb``). With ``n`` cards, card ``c``'s devices are
numbered ``n + c*8 + s``, ``s`` the first compute slice of the device when the
profiles are laid out in the order written. With a ``device_dir``, a job on a MIG
device gets the card's ``nvidiaC`` and the device's own stand-in capability file
``nvidia-caps/nvidia-capN`` (``N`` its index), as a real one gets its card's
``/dev/nvidiaC`` and its ``/dev/nvidia-caps`` files.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from mtgpu.config import SimulatedGpuSpec
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import VISIBILITY_VARS, GpuProbe, process_uid, run_check_job
from mtgpu.gpuinfo.nvidia import MIG_SLOTS
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess


@dataclass(frozen=True)
class _Device:
    """One simulated GPU: a card, or a MIG device of a card (``parent`` set)."""

    index: int
    spec: SimulatedGpuSpec
    type: str
    vram: int
    uuid: str
    name: str
    parent: int | None = None
    profile: str = ""


def _devices(cards: list[SimulatedGpuSpec], server: str) -> list[_Device]:
    from mtgpu.config.options import mig_profile_vram

    out = [
        _Device(i, s, s.type, s.vram, f"SIM-{server}-{i}", f"Simulated {s.type}") for i, s in enumerate(cards)
    ]
    for c, spec in enumerate(cards):
        slot = 0
        for profile in spec.mig:
            i = len(cards) + c * MIG_SLOTS + slot
            out.append(
                _Device(
                    i,
                    spec,
                    f"{spec.type}-{profile}",
                    mig_profile_vram(profile),
                    f"MIG-SIM-{server}-{i}",
                    f"Simulated {spec.type} MIG {profile}",
                    parent=c,
                    profile=profile,
                )
            )
            slot += int(profile.split("g.")[0])
    return out


class SimulatedProbe(GpuProbe):
    """GPUs that exist only in the configuration. Safe to call from any thread."""

    brand = "simulated"

    def __init__(self, specs: Sequence[SimulatedGpuSpec], server: str = "localhost") -> None:
        super().__init__("simulated")
        self.server = server
        self._cards: list[SimulatedGpuSpec] = [s for s in specs for _ in range(s.count)]
        self._devs = {d.index: d for d in _devices(self._cards, server)}
        self._outside = {
            i: (0 if d.parent is not None or d.spec.mig else d.spec.used) for i, d in self._devs.items()
        }
        self._declared = dict.fromkeys(self._devs, 0)
        # Per device: pid -> (its start time, the VRAM it holds, what its job declared).
        self._held: dict[int, dict[int, tuple[float, int, int]]] = {i: {} for i in self._devs}
        self._lock = threading.Lock()

    def probe(self) -> list[GpuInfo]:
        """The simulated GPUs with their current outside, declared and held use."""
        with self._lock:
            live = {i: self._live(i) for i in self._devs}
            # What jobs use of each device: a process's measured use stands in for
            # what its job declared there.
            own = {
                i: max(0, min(self._declared[i], d.vram) - sum(x for _, _, x in live[i]))
                + sum(m for _, m, _ in live[i])
                for i, d in self._devs.items()
            }
            used = {i: min(d.vram, self._outside[i] + own[i]) for i, d in self._devs.items()}
            for d in self._devs.values():
                if d.parent is not None:
                    used[d.parent] += used[d.index]  # a MIG card's use is its devices'
            gpus = []
            for i, d in self._devs.items():
                busy = sum(
                    min(own[x.index], x.vram) for x in self._devs.values() if x.index == i or x.parent == i
                )
                util = round(100 * busy / d.vram) if d.vram else 0
                gpus.append(
                    GpuInfo(
                        index=i,
                        brand=d.spec.brand,
                        type=d.type,
                        name=d.name,
                        uuid=d.uuid,
                        vram_total=d.vram,
                        vram_used=min(d.vram, used[i]),
                        util=min(100, util),
                        processes=tuple(GpuProcess(pid, process_uid(pid), m) for pid, m, _ in live[i]),
                        mig_mode=True if d.spec.mig else None,
                        visibility_id=d.uuid if d.parent is not None else str(i),
                        parent=d.parent,
                    )
                )
        return self._found(gpus)

    def _live(self, index: int) -> list[tuple[int, int, int]]:
        """(pid, held, declared) of the processes of device ``index`` still running."""
        out = []
        for pid, (started, held, declared) in sorted(self._held[index].items()):
            try:
                alive = psutil.Process(pid).create_time() == started
            except psutil.Error:
                alive = False
            if alive:
                out.append((pid, held, declared))
            else:
                del self._held[index][pid]  # exited: a real card frees its memory too
        return out

    def set_process_used(self, index: int, pid: int, used: int, declared: int = 0) -> None:
        """Make process ``pid`` hold ``used`` bytes of simulated GPU ``index`` (0: none);
        ``declared`` is what its job declared there, which its measured use replaces."""
        spec = self._check_index(index)
        if not 0 <= used <= spec.vram:
            raise GpuProbeError(
                f"simulated GPU {index} has {spec.vram} bytes of VRAM; "
                f"--used must be between 0 and that, not {used}"
            )
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error as exc:
            raise GpuProbeError(f"there is no process {pid} to hold simulated VRAM") from exc
        with self._lock:
            if used:
                self._held[index][pid] = (started, used, declared)
            else:
                self._held[index].pop(pid, None)

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """The stand-in device files of ``indices`` where the entry names a ``device_dir``."""
        out: list[str] = []
        for i in indices:
            d = self._devs.get(i)
            if d is None or not d.spec.device_dir:
                continue
            card = d.index if d.parent is None else d.parent
            want = [f"{d.spec.device_dir}/nvidia{card}"]
            if d.parent is not None:
                want.append(f"{d.spec.device_dir}/nvidia-caps/nvidia-cap{i}")
            out += [n for n in want if n not in out]
        return out

    def _check_index(self, index: int) -> _Device:
        if index not in self._devs:
            if not self._devs:
                raise GpuProbeError("this host has no simulated GPUs; set SIMULATED_GPUS")
            have = sorted(self._devs)
            which = (
                f"{len(have)} (0-{have[-1]})"
                if have == list(range(len(have)))
                else f"{len(have)}: {', '.join(map(str, have))}"
            )
            raise GpuProbeError(f"there is no simulated GPU {index}; this host has {which}")
        return self._devs[index]

    def set_outside_used(self, index: int, used: int) -> None:
        """Set the VRAM taken by work outside MTGPU on simulated GPU ``index``."""
        d = self._check_index(index)
        if d.spec.mig and d.parent is None:
            mine = [str(x.index) for x in self._devs.values() if x.parent == index]
            raise GpuProbeError(
                f"simulated GPU {index} is in MIG mode; set the use of its "
                f"MIG devices instead (GPUs {', '.join(mine)})"
            )
        if not 0 <= used <= d.vram:
            raise GpuProbeError(
                f"simulated GPU {index} has {d.vram} bytes of VRAM; "
                f"--used must be between 0 and that, not {used}"
            )
        with self._lock:
            self._outside[index] = used

    def set_declared(self, index_to_bytes: Mapping[int, int]) -> None:
        """Replace the VRAM declared by placed jobs, per GPU; GPUs not named get 0."""
        for index in index_to_bytes:
            self._check_index(index)
        with self._lock:
            self._declared = {i: max(0, int(index_to_bytes.get(i, 0))) for i in self._devs}

    def outside_used(self, index: int) -> int:
        """The current outside use of simulated GPU ``index``."""
        self._check_index(index)
        return self._outside[index]

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """The simulated brand's real variables, so jobs see what they would on real cards:
        a MIG device by its ``MIG-...`` UUID, a card by its index."""
        env = {"MTGPU_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}
        ids = ",".join(self.visibility_ids(indices))
        brands = {self._devs[i].spec.brand for i in indices if i in self._devs}
        for brand in brands:
            for name in VISIBILITY_VARS.get(brand, ()):
                env[name] = ids
        return env

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """The ids a job started with ``env`` finds in MTGPU_VISIBLE_DEVICES."""
        code = "import os; print(os.environ.get('MTGPU_VISIBLE_DEVICES', ''))"
        out = run_check_job([sys.executable, "-c", code], env).strip()
        return [
            self._devs[int(i)].uuid if i.isdigit() and int(i) in self._devs else f"SIM-{self.server}-{i}"
            for i in out.split(",")
            if i
        ]
