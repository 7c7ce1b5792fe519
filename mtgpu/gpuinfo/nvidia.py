"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

NVML is initialised once and kept open: ``nvmlInit`` costs tens of milliseconds,
the per-sample queries cost microseconds. When a query fails the library is shut
down, so the next sample starts afresh and a GPU that was reset comes back.

Jobs are pointed at GPUs by UUID (``CUDA_VISIBLE_DEVICES=GPU-...``), never by
number: CUDA numbers devices fastest-first unless told otherwise, NVML numbers
them in PCI order, and a UUID means the same card to both.

A card in MIG mode is reported with ``mig_mode=True`` and is never placed whole;
each of its MIG devices (a GPU instance with a compute instance) follows it as a
GPU of its own, with ``parent`` the card's index, its ``MIG-...`` UUID (what
``CUDA_VISIBLE_DEVICES`` takes), its own VRAM and a type naming the profile
(``h100-3g.40gb``). The card's utilisation is not measurable (NVML answers "not
supported"), so it reads 0; where the driver will not report the whole card's
memory either, its VRAM is the sum of its MIG devices.

A MIG device's index is fixed by where it sits on its card: with ``n`` cards,
the device whose first compute slice is ``s`` on card ``c`` is ``n + c*8 + s``. So
it keeps its number while an administrator creates or destroys other instances
(``nvidia-smi mig``), and a job's reservation never moves to another instance.

A job on a MIG device needs the card's ``/dev/nvidiaN`` and two capability device
files, ``/dev/nvidia-caps/nvidia-capM``: one for its GPU instance and one for its
compute instance, whose minors ``/proc/driver/nvidia-caps/mig-minors`` lists
(NVIDIA's MIG user guide, "Device Nodes and Capabilities"). Another instance's
capability files are denied to it, which is what keeps it off that instance.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import GpuProbe, existing, process_uid, run_check_job
from mtgpu.gpuinfo.names import mig_type, normalize_type
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess

log = logging.getLogger("mtgpu.gpuinfo")

# NVML return codes (nvml.h) that mean "no NVIDIA GPU here", not "broken".
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_INVALID_ARGUMENT = 2

# Device files every CUDA job needs besides its own /dev/nvidiaN.
_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

#: Index slots each card keeps for its MIG devices (see the module docstring): the
#: cards with MIG (A100, A30, H100, H200, B200) have at most 8 slices.
MIG_SLOTS = 8

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
    except Exception as exc:  # noqa: BLE001 - a broken install can raise more than ImportError
        return None, f"nvidia-ml-py cannot be imported ({type(exc).__name__}: {exc})"
    return pynvml, ""


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as a map of capability to device minor.

    Each line is a capability and the minor of its ``/dev/nvidia-caps/nvidia-capN``;
    ``gpuG`` in a name is the card's minor number (``/dev/nvidiaG``).

    >>> m = parse_mig_minors("config 1\\nmonitor 2\\ngpu0/gi1/access 12\\ngpu0/gi1/ci0/access 13\\n")
    >>> m["gpu0/gi1/access"], m["gpu0/gi1/ci0/access"]
    (12, 13)
    """
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


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
        # MIG device index -> (card minor, GPU instance id, compute instance id).
        self._mig: dict[int, tuple[int, int, int]] = {}

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
                    "reboot is usually needed"
                ) from exc
            self._initialized = True
        try:
            gpus = []
            mig: dict[int, tuple[int, int, int]] = {}
            count = int(nvml.nvmlDeviceGetCount())
            for i in range(count):
                card = self._one(nvml, i)
                gpus.append(card)
                if card.mig_mode:
                    gpus += self._instances(nvml, i, count, card, mig)
            self._mig = mig
        except nvml.NVMLError as exc:
            self._shutdown()
            raise GpuProbeError(
                f"the NVIDIA driver failed while reading the GPUs: {exc}. Run nvidia-smi "
                "to see which GPU is at fault; a lost GPU needs a reset or a reboot"
            ) from exc
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
        return GpuInfo(
            index=i,
            brand="nvidia",
            type=normalize_type("nvidia", name),
            name=name,
            uuid=uuid,
            vram_total=total,
            vram_used=min(used, total),
            util=max(0, min(100, util)),
            processes=self._processes(nvml, handles),
            mig_mode=mig,
            visibility_id=uuid,
        )

    def _instances(
        self, nvml: Any, i: int, count: int, card: GpuInfo, mig: dict[int, tuple[int, int, int]]
    ) -> list[GpuInfo]:
        """The MIG devices of card ``i``, each a GPU (see the module docstring)."""
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        found = []
        for mh in self._mig_handles(nvml, h):
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mh))
            ci = int(nvml.nvmlDeviceGetComputeInstanceId(mh))
            found.append((mh, gi, ci, self._slot(nvml, h, gi, ci)))
        read = [f[3] for f in found]
        slots = [s for s in read if s is not None]
        if len(slots) != len(read) or len(set(slots)) != len(slots) or max(slots, default=0) >= MIG_SLOTS:
            # Placements unreadable (an older driver): number them in NVML's order.
            slots = list(range(len(found)))
        out = []
        for (mh, gi, ci, _), slot in zip(found, slots, strict=True):
            name = _text(nvml.nvmlDeviceGetName(mh))
            uuid = _text(nvml.nvmlDeviceGetUUID(mh))
            mem = nvml.nvmlDeviceGetMemoryInfo(mh)
            total = int(mem.total)
            index = count + i * MIG_SLOTS + slot
            mig[index] = (self._minors[i], gi, ci)
            out.append(
                GpuInfo(
                    index=index,
                    brand="nvidia",
                    type=mig_type(card.type, name),
                    name=name,
                    uuid=uuid,
                    vram_total=total,
                    vram_used=min(int(mem.used), total),
                    util=0,
                    processes=self._processes(nvml, [mh]),
                    mig_mode=True,
                    visibility_id=uuid,
                    parent=i,
                )
            )
        return out

    def _slot(self, nvml: Any, h: Any, gi_id: int, ci_id: int) -> int | None:
        """The first compute slice of a MIG device on its card, or None if unknown.

        A GPU instance's placement starts at a slice of the card and its compute
        instance's at a slice of the GPU instance, so their sum is the device's own
        place: two MIG devices of one card never share it.
        """
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
            start = int(nvml.nvmlGpuInstanceGetInfo(gi).placement.start)
            ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            return start + int(nvml.nvmlComputeInstanceGetInfo(ci).placement.start)
        except (nvml.NVMLError, AttributeError):
            return None

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
            for query in (
                nvml.nvmlDeviceGetComputeRunningProcesses,
                nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for p in self._optional(lambda q=query, h=h: q(h), []):
                    # usedGpuMemory is None where the driver cannot tell.
                    mem = int(p.usedGpuMemory or 0)
                    used[int(p.pid)] = max(used.get(int(p.pid), 0), mem)
        return tuple(
            GpuProcess(pid, process_uid(pid, self.proc_root), mem) for pid, mem in sorted(used.items())
        )

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """``/dev/nvidiaN`` for each GPU, then nvidiactl and the UVM nodes.

        A MIG device adds its card's ``/dev/nvidiaN`` and its GPU and compute
        instances' capability files (see the module docstring).
        """
        own = []
        caps: dict[str, int] | None = None
        for i in indices:
            if i not in self._mig:
                own.append(f"{self.dev_root}/nvidia{self._minors.get(i, i)}")
                continue
            minor, gi, ci = self._mig[i]
            own.append(f"{self.dev_root}/nvidia{minor}")
            if caps is None:
                caps = self._mig_minors()
            for cap in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
                if cap in caps:
                    own.append(f"{self.dev_root}/nvidia-caps/nvidia-cap{caps[cap]}")
                else:
                    log.warning(
                        "MIG device %d: %s is not in %s/driver/nvidia-caps/mig-minors; "
                        "the job will not be able to use it",
                        i,
                        cap,
                        self.proc_root,
                    )
        return existing(own + [f"{self.dev_root}/{n}" for n in _SHARED_NODES])

    def _mig_minors(self) -> dict[str, int]:
        try:
            with open(f"{self.proc_root}/driver/nvidia-caps/mig-minors", encoding="ascii") as f:
                return parse_mig_minors(f.read(1 << 20))
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("cannot read the MIG capability minors: %s", exc)
            return {}

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
