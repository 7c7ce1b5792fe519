"""``mtgpu-setup gpu-check``: test every GPU probe on this host and say what works.

For each probe (NVIDIA, AMD, Intel, each ``GPU_PROBES`` entry, and the simulated
GPUs if configured) the check:

1. runs the probe and reports whether its library or driver is there, what it
   found, or what is wrong (for a command probe: each schema error by path);
2. runs a tiny job with the visibility environment of ONE device and checks the
   job sees exactly that device and no other.

Step 2 must ask what a job's runtime sees, not what the management library sees,
because only the runtime honours the variable (NVML and amdsmi ignore it):

- NVIDIA: the job loads ``libcuda.so.1`` (the driver API, no toolkit needed),
  calls ``cuInit`` and ``cuDeviceGetCount`` and prints each device's UUID; it must
  print one UUID, the one MTGPU chose.
- AMD: the job counts devices through HIP (``libamdhip64``), which applies
  ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES; it must count one.
- Intel: the job counts Level Zero devices (``libze_loader.so.1``), which is what
  ZE_AFFINITY_MASK filters; it must count one.
- A command probe: the command itself is re-run as the job with its variable set;
  it must report one GPU, with the same UUID when it reports UUIDs. This is why
  the schema asks commands to enumerate through the runtime jobs use.
- Simulated: the job reads ``MTGPU_VISIBLE_DEVICES`` and must find one id.

Where the runtime library is missing the check says "not checked" and why,
rather than guessing. The job runs as the invoking user (root under
mtgpu-setup), so it proves the variable, not a tenant's device permissions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mtgpu.config import Options, format_size
from mtgpu.errors import GpuProbeError
from mtgpu.gpuinfo.base import GpuProbe
from mtgpu.gpuinfo.command import CommandProbe
from mtgpu.gpuinfo.sampler import builtin_probes
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import GpuInfo

OK, FAILED, NOT_CHECKED = "ok", "failed", "not checked"


@dataclass(frozen=True)
class CheckResult:
    """What ``gpu-check`` found for one probe."""

    probe: str
    brand: str
    available: bool
    reason: str  # why the probe is not available ("" if it is)
    gpus: tuple[GpuInfo, ...]
    errors: tuple[str, ...]  # the probe failed or printed bad output
    visibility: str  # OK, FAILED or NOT_CHECKED
    detail: str  # what the one-device job saw, or why it did not run

    @property
    def ok(self) -> bool:
        """No error: an absent brand is fine, a failing one or a leaky mask is not."""
        return not self.errors and self.visibility != FAILED


def all_probes(options: Options) -> list[GpuProbe]:
    """Every probe there is to test: built-in, configured and simulated."""
    probes = builtin_probes() + [CommandProbe(s) for s in options.gpu_probes]
    if options.simulated_gpus:
        probes.append(SimulatedProbe(options.simulated_gpus, options.server_name))
    return probes


def check_probe(probe: GpuProbe) -> CheckResult:
    """Run one probe, then one job confined to its first device."""

    def result(
        visibility: str, detail: str, gpus: Sequence[GpuInfo] = (), errors: Sequence[str] = ()
    ) -> CheckResult:
        return CheckResult(
            probe=probe.name,
            brand=probe.brand,
            available=probe.available,
            reason=probe.reason,
            gpus=tuple(gpus),
            errors=tuple(errors),
            visibility=visibility,
            detail=detail,
        )

    try:
        gpus = probe.probe()
    except GpuProbeError as exc:
        return result(NOT_CHECKED, "the probe failed, so no job was run", errors=[str(exc)])
    except Exception as exc:  # noqa: BLE001 - report the surprise instead of stopping the whole check
        return result(
            NOT_CHECKED, "the probe failed, so no job was run", errors=[f"{type(exc).__name__}: {exc}"]
        )
    if not probe.available:
        return result(NOT_CHECKED, "no devices of this kind here")
    if not gpus:
        return result(NOT_CHECKED, "the probe works but found no GPUs")
    # A card in MIG mode shows CUDA its MIG devices, not itself: check a whole card,
    # else a MIG device (CUDA names it by the card's UUID format, so only the count tells).
    target = next((g for g in gpus if not g.mig_mode), None) or next(
        (g for g in gpus if g.placeable), gpus[0]
    )
    env = probe.visibility_env([target.index])
    shown = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    try:
        seen = probe.visible_devices(env)
    except GpuProbeError as exc:
        return result(NOT_CHECKED, f"the one-device job could not run: {exc}", gpus)
    named = [s for s in seen if s]
    if len(seen) == 1 and (not named or not target.uuid or target.mig_mode or named[0] == target.uuid):
        which = named[0] if named else "one device"
        return result(OK, f"a job with {shown} saw only {which}", gpus)
    return result(
        FAILED,
        f"a job with {shown} saw {len(seen)} devices "
        f"({', '.join(named) or 'unnamed'}); expected only "
        f"{target.uuid or 'one'}. Jobs on this host would not be confined",
        gpus,
    )


def gpu_check(options: Options, probes: Sequence[GpuProbe] | None = None) -> list[CheckResult]:
    """Check every probe (see the module docstring); close each one afterwards."""
    out = []
    for probe in list(probes) if probes is not None else all_probes(options):
        try:
            out.append(check_probe(probe))
        finally:
            probe.close()
    return out


def _gpu_line(g: GpuInfo) -> str:
    mig = f" MIG device of GPU {g.parent}" if g.parent is not None else " MIG" if g.mig_mode else ""
    return (
        f"    GPU {g.index}: {g.type} ({g.name}){mig}, VRAM {format_size(g.vram_used)}"
        f"/{format_size(g.vram_total)}, util {g.util}%"
    )


def format_check(results: Sequence[CheckResult]) -> str:
    """The report ``mtgpu-setup gpu-check`` prints."""
    lines = []
    for r in results:
        if r.errors:
            status = "FAILED"
        elif not r.available:
            status = "absent"
        elif r.visibility == FAILED:
            status = "LEAKS"
        elif r.visibility == OK:
            status = "ok"
        else:
            status = "found" if r.gpus else "none"
        lines.append(f"{r.probe:<16} {status}")
        if not r.available and r.reason:
            lines.append(f"    {r.reason}")
        lines += [f"    error: {e}" for e in r.errors]
        lines += [_gpu_line(g) for g in r.gpus]
        if r.available and not r.errors:
            lines.append(f"    visibility {r.visibility}: {r.detail}")
    bad = [r.probe for r in results if not r.ok]
    lines.append(
        f"all probes usable ({sum(bool(r.gpus) for r in results)} with GPUs)"
        if not bad
        else f"problems: {', '.join(bad)}"
    )
    return "\n".join(lines)
