"""The sampler: runs every probe and measures the host, every few seconds, in the daemon.

``Sampler(options).sample()`` returns one :class:`NodeInventory`; ``await
sampler.run()`` does so every ``USAGE_SAMPLE_INTERVAL`` seconds in the daemon's
event loop, doing the blocking driver calls in a worker thread, and keeps the
newest in ``sampler.latest``.

GPU numbering is host-wide: probes are asked in a fixed order (NVIDIA, AMD,
Intel, then ``GPU_PROBES`` in file order) and each one's GPUs are numbered after
the ones before. Each probe keeps the widest range it has ever needed, so if a
driver fails for a while the other brands' GPUs keep their numbers and running
jobs' reservations stay right.

Failures never stop the sampler. A probe that raises has its message put in
``NodeInventory.errors`` on every sample (so ``mtgpu-admin nodes`` shows it), but
it is logged only when it first appears or changes, and once more when it clears.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psutil

from mtgpu.config import Options
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.amd import AmdProbe
from mtgpu.gpuinfo.base import GpuProbe
from mtgpu.gpuinfo.command import CommandProbe
from mtgpu.gpuinfo.intel import IntelProbe
from mtgpu.gpuinfo.nvidia import NvidiaProbe
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import GpuInfo, HostUsage, NodeInventory

log = logging.getLogger("mtgpu.gpuinfo")


def builtin_probes() -> list[GpuProbe]:
    """The probes for real hardware every host tries: NVIDIA, AMD, Intel."""
    return [NvidiaProbe(), AmdProbe(), IntelProbe()]


def default_probes(options: Options) -> list[GpuProbe]:
    """The probes the daemon runs: simulated GPUs alone if configured, else real ones.

    Simulated GPUs replace the real probes rather than join them, so a demo or a
    test host never offers its real cards by accident.
    """
    if options.simulated_gpus:
        return [SimulatedProbe(options.simulated_gpus, options.server_name)]
    return builtin_probes() + [CommandProbe(spec) for spec in options.gpu_probes]


def host_usage(disk_path: str) -> HostUsage:
    """CPUs, CPU use since the last call, RAM and the free disk under ``disk_path``."""
    mem = psutil.virtual_memory()
    path = disk_path
    while not os.path.exists(path) and path not in ("", "/"):
        path = os.path.dirname(path)  # homes not created yet: measure the disk they will be on
    disk = psutil.disk_usage(path or "/")
    # "Used" is what is not available: page cache can be dropped, so it does not count.
    return HostUsage(
        cpus=psutil.cpu_count(logical=True) or 1,
        cpu_percent=float(psutil.cpu_percent(interval=None)),
        ram_total=int(mem.total),
        ram_used=int(mem.total - mem.available),
        disk_total=int(disk.total),
        disk_free=int(disk.free),
    )


class Sampler:
    """Measures this host: every probe's GPUs plus CPU, RAM and tenant disk."""

    def __init__(
        self,
        options: Options,
        probes: Sequence[GpuProbe] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        job_of: Callable[[], Callable[[int], str | None] | None] | None = None,
    ) -> None:
        self.options = options
        self.probes: list[GpuProbe] = list(probes) if probes is not None else default_probes(options)
        self.simulated: SimulatedProbe | None = next(
            (p for p in self.probes if isinstance(p, SimulatedProbe)), None
        )
        self.latest: NodeInventory | None = None
        self._clock = clock
        self._spans: dict[int, int] = {}
        self._owners: dict[int, tuple[GpuProbe, int]] = {}
        self._logged: dict[str, str] = {}
        self._unavailable_logged: set[str] = set()
        # The sampler and the VRAM watchdog call the probes from worker threads.
        self._probing = threading.Lock()
        #: Gives, at each sample, which job a process belongs to (the job agent's; None
        #: while there is none); the VRAM held by processes of no job is reported as
        #: each GPU's ``vram_outside``.
        self.job_of = job_of
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    def _read_gpus(self, errors: list[str]) -> list[GpuInfo]:
        gpus: list[GpuInfo] = []
        owners: dict[int, tuple[GpuProbe, int]] = {}
        base = 0
        with self._probing:
            for n, probe in enumerate(self.probes):
                found = self._probe_one(probe, errors)
                for g in found:
                    owners[base + g.index] = (probe, g.index)
                    gpus.append(
                        dataclasses.replace(
                            g, index=base + g.index, parent=None if g.parent is None else base + g.parent
                        )
                    )
                width = max([g.index + 1 for g in found], default=0)
                self._spans[n] = max(self._spans.get(n, 0), width)
                base += self._spans[n]
            self._owners = owners
        job_of = self.job_of() if self.job_of is not None else None
        if job_of is not None:
            gpus = [
                dataclasses.replace(
                    g, vram_outside=sum(p.used_memory for p in g.processes if job_of(p.pid) is None)
                )
                for g in gpus
            ]
        return gpus

    def process_use(self) -> dict[str, GpuInfo]:
        """Every GPU's per-process VRAM use now, keyed by the GPU's UUID (host index
        where a GPU has none), for the VRAM watchdog. Blocking but fast; never raises."""
        return {g.uuid or f"index:{g.index}": g for g in self._read_gpus([])}

    def sample(self) -> NodeInventory:
        """Measure now. Blocking but fast; never raises."""
        errors: list[str] = []
        gpus = self._read_gpus(errors)
        try:
            host = host_usage(self.options.tenant_home_root)
        except Exception as exc:  # noqa: BLE001 - psutil on an odd /proc; report, do not die
            self._report("host", f"cannot measure CPU, RAM or disk: {exc}", errors)
            host = HostUsage(
                cpus=os.cpu_count() or 1, cpu_percent=0.0, ram_total=0, ram_used=0, disk_total=0, disk_free=0
            )
        else:
            self._clear("host")
        inv = NodeInventory(
            name=self.options.server_name,
            gpus=tuple(gpus),
            host=host,
            errors=tuple(errors),
            sampled_at=self._clock(),
            features=self.options.node_features,
        )
        self.latest = inv
        return inv

    def _probe_one(self, probe: GpuProbe, errors: list[str]) -> list[GpuInfo]:
        try:
            found = probe.probe()
        except GpuProbeError as exc:
            self._report(probe.name, str(exc), errors)
            return []
        except Exception as exc:  # noqa: BLE001 - a bug or a library surprise must not stop sampling
            self._report(probe.name, f"{type(exc).__name__}: {exc}", errors, trace=True)
            return []
        self._clear(probe.name)
        if not probe.available and probe.name not in self._unavailable_logged:
            self._unavailable_logged.add(probe.name)
            log.info("no %s GPUs: %s", probe.name, probe.reason)
        return found

    def _report(self, name: str, message: str, errors: list[str], trace: bool = False) -> None:
        errors.append(f"{name}: {message}")
        if self._logged.get(name) != message:
            self._logged[name] = message
            log.error(
                "GPU probe %s failed: %s (reported once; sampling goes on)", name, message, exc_info=trace
            )

    def _clear(self, name: str) -> None:
        if self._logged.pop(name, None) is not None:
            log.warning("GPU probe %s works again", name)

    async def run(self, interval: float | None = None) -> None:
        """Sample every ``interval`` seconds (default ``USAGE_SAMPLE_INTERVAL``) until cancelled."""
        every = interval if interval is not None else self.options.usage_sample_interval
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # sample() does not raise; this guards the loop itself
                log.exception("GPU sampling failed; trying again next interval")
            await asyncio.sleep(max(0.0, every - (loop.time() - started)))

    # -------------------------------------------------- for the job agent

    def _by_probe(self, indices: Sequence[int]) -> dict[int, tuple[GpuProbe, list[int]]]:
        groups: dict[int, tuple[GpuProbe, list[int]]] = {}
        for i in indices:
            if i not in self._owners:
                raise GpuProbeError(
                    f"this host has no GPU {i} in its last sample; run mtgpu-admin nodes to see its GPUs"
                )
            probe, local = self._owners[i]
            groups.setdefault(id(probe), (probe, []))[1].append(local)
        return groups

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """Environment that confines a job to host GPUs ``indices``."""
        env: dict[str, str] = {}
        for probe, local in self._by_probe(indices).values():
            env.update(probe.visibility_env(local))
        return env

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """Device files a container needs for host GPUs ``indices``."""
        out: list[str] = []
        for probe, local in self._by_probe(indices).values():
            out += [n for n in probe.device_nodes(local) if n not in out]
        return out

    def set_declared(self, index_to_bytes: Mapping[int, int]) -> None:
        """Tell simulated GPUs what the placed jobs declared (no-op on real GPUs)."""
        if self.simulated is not None:
            self.simulated.set_declared(index_to_bytes)

    def close(self) -> None:
        """Release every probe's driver library."""
        for probe in self.probes:
            try:
                probe.close()
            except Exception:
                log.debug("closing GPU probe %s failed", probe.name, exc_info=True)
