"""Simulated GPUs (``SIMULATED_GPUS``), for tests, demos and capacity planning.

A simulated GPU's measured VRAM use is what MTGPU's own placed jobs declared
(``set_declared``, called by the daemon) plus ``used``: work outside MTGPU, which
an admin changes at run time with ``mtgpu-admin simulate NODE GPU_INDEX --used
SIZE`` (``set_outside_used``). The sum is capped at the card's VRAM, as a real
card cannot report more than it has. Utilisation is the declared share of VRAM,
so a busy simulated card also looks busy.

Indices run on across entries: ``[{type: rtx4090, count: 2}, {type: a100-80gb,
count: 1}]`` gives GPUs 0 and 1 (rtx4090) and 2 (a100-80gb).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence

from mtgpu.config import SimulatedGpuSpec
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import VISIBILITY_VARS, GpuProbe, run_check_job
from mtgpu.gpuinfo.types import GpuInfo


class SimulatedProbe(GpuProbe):
    """GPUs that exist only in the configuration. Safe to call from any thread."""

    brand = "simulated"

    def __init__(self, specs: Sequence[SimulatedGpuSpec], server: str = "localhost") -> None:
        super().__init__("simulated")
        self.server = server
        self._cards: list[SimulatedGpuSpec] = [s for s in specs for _ in range(s.count)]
        self._outside = [s.used for s in self._cards]
        self._declared = [0] * len(self._cards)
        self._lock = threading.Lock()

    def probe(self) -> list[GpuInfo]:
        """The simulated GPUs with their current outside and declared use."""
        with self._lock:
            gpus = []
            for i, spec in enumerate(self._cards):
                declared = min(self._declared[i], spec.vram)
                util = round(100 * declared / spec.vram) if spec.vram else 0
                gpus.append(GpuInfo(
                    index=i, brand=spec.brand, type=spec.type, name=f"Simulated {spec.type}",
                    uuid=f"SIM-{self.server}-{i}", vram_total=spec.vram,
                    vram_used=min(spec.vram, self._outside[i] + self._declared[i]),
                    util=util, processes=(), mig_mode=None, visibility_id=str(i)))
        return self._found(gpus)

    def _check_index(self, index: int) -> SimulatedGpuSpec:
        if not 0 <= index < len(self._cards):
            raise GpuProbeError(f"there is no simulated GPU {index}; this host has "
                                f"{len(self._cards)} (0-{len(self._cards) - 1})" if self._cards
                                else "this host has no simulated GPUs; set SIMULATED_GPUS")
        return self._cards[index]

    def set_outside_used(self, index: int, used: int) -> None:
        """Set the VRAM taken by work outside MTGPU on simulated GPU ``index``."""
        spec = self._check_index(index)
        if not 0 <= used <= spec.vram:
            raise GpuProbeError(f"simulated GPU {index} has {spec.vram} bytes of VRAM; "
                                f"--used must be between 0 and that, not {used}")
        with self._lock:
            self._outside[index] = used

    def set_declared(self, index_to_bytes: Mapping[int, int]) -> None:
        """Replace the VRAM declared by placed jobs, per GPU; GPUs not named get 0."""
        for index in index_to_bytes:
            self._check_index(index)
        with self._lock:
            self._declared = [max(0, int(index_to_bytes.get(i, 0))) for i in range(len(self._cards))]

    def outside_used(self, index: int) -> int:
        """The current outside use of simulated GPU ``index``."""
        self._check_index(index)
        return self._outside[index]

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """The simulated brand's real variables, so jobs see what they would on real cards."""
        ids = ",".join(str(i) for i in indices)
        brands = {self._cards[i].brand for i in indices if 0 <= i < len(self._cards)}
        env = {"MTGPU_VISIBLE_DEVICES": ids}
        for brand in brands:
            for name in VISIBILITY_VARS.get(brand, ()):
                env[name] = ids
        return env

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """The ids a job started with ``env`` finds in MTGPU_VISIBLE_DEVICES."""
        code = "import os; print(os.environ.get('MTGPU_VISIBLE_DEVICES', ''))"
        out = run_check_job([sys.executable, "-c", code], env).strip()
        return [f"SIM-{self.server}-{i}" for i in out.split(",") if i]
