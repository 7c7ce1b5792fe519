"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

NVML is initialised once and kept open: ``nvmlInit`` costs tens of milliseconds,
the per-sample queries cost microseconds. When a query fails the library is shut
down, so the next sample starts afresh and a GPU that was reset comes back.

Jobs are pointed at GPUs by UUID (``CUDA_VISIBLE_DEVICES=GPU-...``), never by
number: CUDA numbers devices fastest-first unless told otherwise, NVML numbers
them in PCI order, and a UUID means the same card to both.

A MIG-enabled card is reported as one GPU with ``mig_mode=True``. Its utilisation
is not measurable (NVML answers "not supported"), so it reads 0; where the driver
will not report the whole card's memory either, its VRAM is the sum of its MIG
instances, which is the memory jobs can actually use.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import GpuProbe, existing, process_uid, run_check_job
from mtgpu.gpuinfo.names import normalize_type
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess

# NVML return codes (nvml.h) that mean "no NVIDIA GPU here", not "broken".
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_INVALID_ARGUMENT = 2

# Device files every CUDA job needs besides its own /dev/nvidiaN.
_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

# The check job asks the CUDA driver (libcuda, which honours CUDA_VISIBLE_DEVICES,
# unlike NVML) how many devices it sees, and their UUIDs. Only the driver is
# needed, not a CUDA toolkit or a framework.
_CUDA_JOB = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.exit("libcuda.so.1 cannot be loaded (%s); is the NVIDIA driver installed?" % exc)
rc = cuda.cuInit(0)
if rc == 100:  # CUDA_ERROR_NO_DEVICE: the mask left nothing visible
    sys.exit(0)
if rc:
    sys.exit("cuInit failed with CUDA error %d" % rc)
n = ctypes.c_int(0)
if cuda.cuDeviceGetCount(ctypes.byref(n)):
    sys.exit("cuDeviceGetCount failed")
for i in range(n.value):
    dev = ctypes.c_int(0)
    raw = (ctypes.c_ubyte * 16)()
    if cuda.cuDeviceGet(ctypes.byref(dev), i) or cuda.cuDeviceGetUuid(raw, dev):
        print("")
        continue
    h = bytes(raw).hex()
    print("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
"""


def _load_nvml() -> tuple[Any, str]:
    """Import pynvml, or say why not. Never raises."""
    try:
        import pynvml
    except Exception as exc:  # a broken install can raise more than ImportError
        return None, f"nvidia-ml-py cannot be imported ({type(exc).__name__}: {exc})"
    return pynvml, ""


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


class NvidiaProbe(GpuProbe):
    """NVIDIA GPUs via NVML. ``proc_root``/``dev_root`` exist for tests."""

    brand = "nvidia"

    def __init__(self, *, proc_root: str = "/proc", dev_root: str = "/dev") -> None:
        super().__init__("nvidia")
        self.proc_root = proc_root
        self.dev_root = dev_root
        self._nvml: Any = None
        self._import_error = ""
        self._initialized = False
        self._minors: dict[int, int] = {}

    def probe(self) -> list[GpuInfo]:
        """Measure every NVIDIA GPU; see :class:`~mtgpu.gpuinfo.base.GpuProbe`."""
        if self._nvml is None:
            if self._import_error:  # one import attempt per probe, not one per sample
                return self._unavailable(self._import_error)
            self._nvml, self._import_error = _load_nvml()
            if self._nvml is None:
                return self._unavailable(self._import_error)
        nvml = self._nvml
        if not self._initialized:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                if _code(exc) in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED):
                    return self._unavailable(f"no NVIDIA driver on this host ({exc})")
                raise GpuProbeError(
                    f"the NVIDIA driver is installed but NVML cannot start: {exc}. Run "
                    "nvidia-smi to see the driver's state; after a driver upgrade a "
                    "reboot is usually needed") from exc
            self._initialized = True
        try:
            gpus = [self._one(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            self._shutdown()
            raise GpuProbeError(
                f"the NVIDIA driver failed while reading the GPUs: {exc}. Run nvidia-smi "
                "to see which GPU is at fault; a lost GPU needs a reset or a reboot") from exc
        return self._found(gpus)

    def _one(self, nvml: Any, i: int) -> GpuInfo:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _text(nvml.nvmlDeviceGetName(h))
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        mig = self._optional(lambda: nvml.nvmlDeviceGetMigMode(h)[0] == 1, None)
        total, used = self._memory(nvml, h, bool(mig))
        util = self._optional(lambda: int(nvml.nvmlDeviceGetUtilizationRates(h).gpu), 0)
        minor = self._optional(lambda: int(nvml.nvmlDeviceGetMinorNumber(h)), None)
        self._minors[i] = i if minor is None else minor
        handles = [h] + (self._mig_handles(nvml, h) if mig else [])
        return GpuInfo(index=i, brand="nvidia", type=normalize_type("nvidia", name), name=name,
                       uuid=uuid, vram_total=total, vram_used=min(used, total),
                       util=max(0, min(100, util)), processes=self._processes(nvml, handles),
                       mig_mode=mig, visibility_id=uuid)

    def _optional(self, query: Any, default: Any) -> Any:
        """``query()``, or ``default`` where this card does not support it."""
        try:
            return query()
        except self._nvml.NVMLError as exc:
            if _code(exc) == _NOT_SUPPORTED:
                return default
            raise

    def _memory(self, nvml: Any, h: Any, mig: bool) -> tuple[int, int]:
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            return int(mem.total), int(mem.used)
        except nvml.NVMLError as exc:
            if _code(exc) != _NOT_SUPPORTED:
                raise
        if not mig:
            return 0, 0
        total = used = 0
        for mh in self._mig_handles(nvml, h):
            mem = nvml.nvmlDeviceGetMemoryInfo(mh)
            total += int(mem.total)
            used += int(mem.used)
        return total, used

    def _mig_handles(self, nvml: Any, h: Any) -> list[Any]:
        out = []
        for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j))
            except nvml.NVMLError as exc:
                # Slots without a MIG instance answer "not found".
                if _code(exc) not in (_NOT_FOUND, _INVALID_ARGUMENT):
                    raise
        return out

    def _processes(self, nvml: Any, handles: list[Any]) -> tuple[GpuProcess, ...]:
        used: dict[int, int] = {}
        for h in handles:
            for query in (nvml.nvmlDeviceGetComputeRunningProcesses,
                          nvml.nvmlDeviceGetGraphicsRunningProcesses):
                for p in self._optional(lambda q=query, h=h: q(h), []):
                    # usedGpuMemory is None where the driver cannot tell.
                    mem = int(p.usedGpuMemory or 0)
                    used[int(p.pid)] = max(used.get(int(p.pid), 0), mem)
        return tuple(GpuProcess(pid, process_uid(pid, self.proc_root), mem)
                     for pid, mem in sorted(used.items()))

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """``/dev/nvidiaN`` for each GPU, then nvidiactl and the UVM nodes."""
        own = [f"{self.dev_root}/nvidia{self._minors.get(i, i)}" for i in indices]
        return existing(own + [f"{self.dev_root}/{n}" for n in _SHARED_NODES])

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """UUIDs of the GPUs the CUDA driver shows a job run with ``env``."""
        out = run_check_job([sys.executable, "-c", _CUDA_JOB], env)
        return [line.strip() for line in out.splitlines()]

    def close(self) -> None:
        """Shut NVML down; the next probe starts it again."""
        self._shutdown()

    def _shutdown(self) -> None:
        if self._initialized and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # already broken; starting afresh is all that is left
        self._initialized = False
