"""AMD GPUs through amdsmi, the ROCm system management library.

``import amdsmi`` does not raise ImportError when ROCm is absent: the Python
package loads ``libamd_smi.so`` at import time and raises KeyError or OSError.
So the import is guarded by ``except Exception``; any failure there means "no AMD
GPUs on this host", never an error.

Visibility: ``ROCR_VISIBLE_DEVICES`` selects devices for the ROCm runtime, and HIP
numbers what is left from 0. So a job on GPUs 2 and 3 gets
``ROCR_VISIBLE_DEVICES=2,3`` and ``HIP_VISIBLE_DEVICES=0,1``; setting both to 2,3
would hide everything. Where amdsmi reports the HIP id of a card that id is used,
so amdsmi's order and the runtime's order cannot disagree.

A card in a compute partition mode other than SPX (DPX, TPX, QPX, CPX) is handled
as a card in MIG mode is: amdsmi shows each partition as a device of its own (its
own render node, HIP id and ``ROCR_VISIBLE_DEVICES`` id), and those are the GPUs,
with a type naming the mode (``mi300x-cpx``) and ``parent`` their card. The card
is added after all the devices, never placed whole. Partitions of one card share
its PCI domain, bus and device and differ in the function (amdsmi puts the
partition id there, see ROCm/rocm-systems#5805), which is how they are grouped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import GpuProbe, existing, process_uid, run_check_job
from mtgpu.gpuinfo.names import normalize_type
from mtgpu.gpuinfo.types import GpuInfo, GpuProcess

log = logging.getLogger("mtgpu.gpuinfo")

# amdsmi status codes (amdsmi.h) that mean "no usable AMD driver", not "broken".
_NO_DRIVER = frozenset({4, 18, 34, 51})  # FAIL_LOAD_MODULE, INIT_ERROR, DRIVER_NOT_LOADED, NO_DRV

# The check job counts devices through HIP, which honours both visibility variables.
_HIP_JOB = r"""
import ctypes, sys
for name in ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"):
    try:
        hip = ctypes.CDLL(name)
        break
    except OSError:
        continue
else:
    sys.exit("libamdhip64 cannot be loaded; is the ROCm HIP runtime installed?")
n = ctypes.c_int(0)
rc = hip.hipGetDeviceCount(ctypes.byref(n))
if rc == 100:  # hipErrorNoDevice: the mask left nothing visible
    print(0)
    sys.exit(0)
if rc:
    sys.exit("hipGetDeviceCount failed with HIP error %d" % rc)
print(n.value)
"""


def _load_amdsmi() -> tuple[Any, str]:
    """Import amdsmi, or say why not. Never raises.

    A failed import prints its complaint on stdout, which would corrupt a CLI's
    ``--json`` output, so it is captured and kept for the debug log.
    """
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            import amdsmi
    except Exception as exc:  # noqa: BLE001 - KeyError or OSError when ROCm is absent, see above
        log.debug("import amdsmi failed: %s %s", exc, said.getvalue().strip())
        return None, f"amdsmi cannot be loaded ({type(exc).__name__}: {exc}); ROCm is not installed"
    return amdsmi, ""


def _say(exc: BaseException) -> str:
    # amdsmi's messages span lines ("Error code:\n\t34 | ..."); logs want one.
    return " ".join(str(exc).split())


def _int(value: Any, default: int = 0) -> int:
    # amdsmi writes "N/A" where a value is not available.
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _cards_of_partitions(gpus: list[GpuInfo], bdfs: dict[int, str]) -> list[GpuInfo]:
    """``gpus`` with each partitioned card added after them, its partitions under it."""
    cards: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        if g.index in bdfs:
            bdf = bdfs[g.index]
            cards.setdefault(bdf.rsplit(".", 1)[0] if bdf else f"#{g.index}", []).append(g)
    out = [g for g in gpus if g.index not in bdfs]
    added = []
    for n, parts in enumerate(cards.values()):
        index = len(gpus) + n
        first = parts[0]
        out += [dataclasses.replace(p, parent=index) for p in parts]
        total = sum(p.vram_total for p in parts)
        added.append(
            GpuInfo(
                index=index,
                brand="amd",
                type=first.type.rsplit("-", 1)[0],
                name=first.name,
                uuid=first.uuid,
                vram_total=total,
                vram_used=min(total, sum(p.vram_used for p in parts)),
                util=round(sum(p.util for p in parts) / len(parts)),
                mig_mode=True,
                visibility_id="",
            )
        )
    return sorted(out + added, key=lambda g: g.index)


class AmdProbe(GpuProbe):
    """AMD GPUs via amdsmi. ``sysfs_root``/``proc_root``/``dev_root`` exist for tests."""

    brand = "amd"

    def __init__(self, *, sysfs_root: str = "/sys", proc_root: str = "/proc", dev_root: str = "/dev") -> None:
        super().__init__("amd")
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.dev_root = dev_root
        self._smi: Any = None
        self._load_error = ""
        self._liberr: Any = ()
        self._initialized = False
        self._renders: dict[int, list[str]] = {}

    def probe(self) -> list[GpuInfo]:
        """Measure every AMD GPU; see :class:`~mtgpu.gpuinfo.base.GpuProbe`."""
        if self._smi is None:
            # One import attempt per probe: ROCm does not appear while the daemon runs.
            if self._load_error:
                return self._unavailable(self._load_error)
            self._smi, self._load_error = _load_amdsmi()
            if self._smi is None:
                return self._unavailable(self._load_error)
            self._liberr = getattr(self._smi, "AmdSmiLibraryException", ())
        smi = self._smi
        error = getattr(smi, "AmdSmiException", Exception)
        if not self._initialized:
            try:
                smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            except error as exc:
                if _int(getattr(exc, "err_code", None), -1) in _NO_DRIVER:
                    return self._unavailable(f"no AMD GPU driver on this host ({_say(exc)})")
                raise GpuProbeError(
                    f"amdsmi cannot start: {_say(exc)}. Run amd-smi to see the driver's state "
                    "(is the amdgpu module loaded?)"
                ) from exc
            self._initialized = True
        try:
            bdfs: dict[int, str] = {}
            gpus = [self._one(smi, i, h, bdfs) for i, h in enumerate(smi.amdsmi_get_processor_handles())]
        except error as exc:
            self._shutdown()
            raise GpuProbeError(
                f"the AMD driver failed while reading the GPUs: {_say(exc)}. Run amd-smi to see "
                "which GPU is at fault"
            ) from exc
        return self._found(_cards_of_partitions(gpus, bdfs))

    def _one(self, smi: Any, i: int, h: Any, bdfs: dict[int, str]) -> GpuInfo:
        name = str(self._optional(lambda: smi.amdsmi_get_gpu_asic_info(h)["market_name"], "AMD GPU"))
        uuid = str(self._optional(lambda: smi.amdsmi_get_gpu_device_uuid(h), ""))
        total, used = self._memory(smi, h)
        activity = self._optional(lambda: smi.amdsmi_get_gpu_activity(h), {})
        util = _int(activity.get("gfx_activity"))
        partition = str(self._optional(lambda: smi.amdsmi_get_gpu_compute_partition(h), ""))
        enum = self._optional(lambda: smi.amdsmi_get_gpu_enumeration_info(h), {})
        hip_id = enum.get("hip_id")
        bdf = str(self._optional(lambda: smi.amdsmi_get_gpu_device_bdf(h), ""))
        self._renders[i] = self._render_nodes(bdf, enum.get("drm_render"))
        split = partition.upper() not in ("SPX", "") if partition else None
        kind = normalize_type("amd", name)
        if split:
            bdfs[i] = bdf
            kind = f"{kind}-{partition.lower()}"
        return GpuInfo(
            index=i,
            brand="amd",
            type=kind,
            name=name,
            uuid=uuid,
            vram_total=total,
            vram_used=min(used, total),
            util=max(0, min(100, util)),
            processes=self._processes(smi, h),
            mig_mode=split,
            visibility_id=str(hip_id if isinstance(hip_id, int) else i),
            parent=-1 if split else None,
        )

    def _optional(self, query: Any, default: Any) -> Any:
        """``query()``, or ``default`` where this card or amdsmi version lacks it."""
        try:
            return query()
        except (AttributeError, KeyError):
            return default  # an older amdsmi without this call or field
        except self._liberr as exc:
            # NOT_SUPPORTED (2), NOT_YET_IMPLEMENTED (3), NO_PERM (10): not an error.
            if _int(getattr(exc, "err_code", None), -1) in (2, 3, 10):
                return default
            raise

    def _memory(self, smi: Any, h: Any) -> tuple[int, int]:
        try:
            vram = smi.AmdSmiMemoryType.VRAM
            return (
                int(smi.amdsmi_get_gpu_memory_total(h, vram)),
                int(smi.amdsmi_get_gpu_memory_usage(h, vram)),
            )
        except (AttributeError, self._liberr):
            pass
        # amdsmi_get_gpu_vram_usage reports MiB (uint32 fields in amdsmi.h).
        usage = self._optional(lambda: smi.amdsmi_get_gpu_vram_usage(h), {})
        return _int(usage.get("vram_total")) << 20, _int(usage.get("vram_used")) << 20

    def _processes(self, smi: Any, h: Any) -> tuple[GpuProcess, ...]:
        out: dict[int, int] = {}
        for p in self._optional(lambda: smi.amdsmi_get_gpu_process_list(h), []):
            if not isinstance(p, dict):
                # amdsmi 6.0 returned process handles; the details are a second call.
                p = self._optional(lambda p=p: smi.amdsmi_get_gpu_process_info(h, p), {})
            pid = _int(p.get("pid"), -1)
            if pid < 0:
                continue
            mem = _int((p.get("memory_usage") or {}).get("vram_mem"), _int(p.get("mem")))
            out[pid] = max(out.get(pid, 0), mem)
        return tuple(
            GpuProcess(pid, process_uid(pid, self.proc_root), mem) for pid, mem in sorted(out.items())
        )

    def _render_nodes(self, bdf: str, minor: Any) -> list[str]:
        if isinstance(minor, int):
            return [f"{self.dev_root}/dri/renderD{minor}"]
        drm = os.path.join(self.sysfs_root, "bus/pci/devices", bdf.lower(), "drm")
        try:
            names = sorted(n for n in os.listdir(drm) if n.startswith(("renderD", "card")))
        except OSError:
            return []
        return [f"{self.dev_root}/dri/{n}" for n in names]

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """ROCR selects the cards; HIP then numbers them 0..n-1 (see module docstring)."""
        return {
            "ROCR_VISIBLE_DEVICES": ",".join(self.visibility_ids(indices)),
            "HIP_VISIBLE_DEVICES": ",".join(str(n) for n in range(len(indices))),
        }

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """``/dev/kfd`` and each GPU's DRM nodes under ``/dev/dri``."""
        own = [n for i in indices for n in self._renders.get(i, [])]
        return existing([f"{self.dev_root}/kfd"] + own)

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """One "" per device HIP shows a job run with ``env`` (HIP only counts)."""
        out = run_check_job([sys.executable, "-c", _HIP_JOB], env).strip()
        if not out.isdigit():
            raise GpuProbeError(f"the HIP check job printed {out!r}, not a device count")
        return [""] * int(out)

    def close(self) -> None:
        """Shut amdsmi down; the next probe starts it again."""
        self._shutdown()

    def _shutdown(self) -> None:
        if self._initialized and self._smi is not None:
            try:
                self._smi.amdsmi_shut_down()
            except Exception:  # noqa: BLE001 - already broken; starting afresh is all that is left
                pass
        self._initialized = False
