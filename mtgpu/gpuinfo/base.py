"""The GPU probe contract, and the few helpers every probe shares.

A probe is one kind of GPU (NVIDIA, AMD, Intel, a configured command, simulated).
The sampler calls :meth:`GpuProbe.probe` every few seconds; the agent that starts
jobs calls :meth:`GpuProbe.visibility_env` and :meth:`GpuProbe.device_nodes`;
``mtgpu-setup gpu-check`` calls :meth:`GpuProbe.visible_devices`.

The contract, which every implementation keeps:

- ``probe()`` returns the GPUs found, numbered 0..n-1 in the probe's own order
  (the sampler renumbers them host-wide). A missing library or driver is not an
  error: the probe sets ``available = False`` with a ``reason`` and returns ``[]``.
- A driver that is present but failing raises :class:`~mtgpu.errors.GpuProbeError`
  with a message that says what to do. The sampler logs it once, not every
  interval, and keeps sampling the other probes.
- ``probe()`` must be cheap: it runs every ``USAGE_SAMPLE_INTERVAL`` seconds and
  the whole sample must cost well under 1% of one core.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping, Sequence

from mtgpu.errors import CommandError, GpuProbeError
from mtgpu.gpuinfo.types import GpuInfo
from mtgpu.proc import run

# The variables each brand's runtime reads to pick its devices.
VISIBILITY_VARS: Mapping[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "intel": ("ZE_AFFINITY_MASK",),
}
# Any other brand without a configured variable (simulated ones, mostly).
GENERIC_VISIBILITY_VAR = "MTGPU_VISIBLE_DEVICES"


class GpuProbe(abc.ABC):
    """One kind of GPU. Subclasses set ``brand`` and implement :meth:`probe`."""

    brand: str = ""

    def __init__(self, name: str = "") -> None:
        self.name = name or self.brand
        self.available = True
        self.reason = ""
        self.last: dict[int, GpuInfo] = {}

    @abc.abstractmethod
    def probe(self) -> list[GpuInfo]:
        """Measure the GPUs now; see the module docstring for the contract."""

    def visibility_env(self, indices: Sequence[int]) -> dict[str, str]:
        """Environment that makes a job see only the GPUs ``indices`` (probe-local)."""
        ids = ",".join(self.visibility_ids(indices))
        names = VISIBILITY_VARS.get(self.brand, (GENERIC_VISIBILITY_VAR,))
        return {name: ids for name in names}

    def device_nodes(self, indices: Sequence[int]) -> list[str]:
        """Device files a container needs for the GPUs ``indices`` (probe-local)."""
        return []

    def visible_devices(self, env: Mapping[str, str]) -> list[str]:
        """Run a tiny job with ``env`` and return the devices of ours that it sees.

        Each entry is the device's id as the job's runtime names it (a UUID, say),
        or "" where the runtime only counts. ``mtgpu-setup gpu-check`` uses this
        to prove that the visibility variable really confines a job. Raise
        GpuProbeError when it cannot be checked on this host.
        """
        raise GpuProbeError(f"{self.name}: no visibility check exists for this kind of GPU")

    def visibility_ids(self, indices: Sequence[int]) -> list[str]:
        """The ids the runtime understands for ``indices``, from the last probe."""
        out = []
        for i in indices:
            g = self.last.get(i)
            out.append(g.visibility_id if g is not None and g.visibility_id else str(i))
        return out

    def close(self) -> None:  # noqa: B027 - optional: most probes hold nothing to release
        """Release the driver library (the daemon calls this at shutdown)."""

    # ---------------------------------------------------------------- helpers

    def _unavailable(self, reason: str) -> list[GpuInfo]:
        self.available = False
        self.reason = reason
        self.last = {}
        return []

    def _found(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        self.available = True
        self.reason = ""
        self.last = {g.index: g for g in gpus}
        return gpus


def process_uid(pid: int, proc_root: str = "/proc") -> int | None:
    """The real owner of process ``pid``, or None once it has exited.

    The owner of ``/proc/PID`` is the process's effective UID; one ``stat`` is far
    cheaper than parsing ``status`` every few seconds.
    """
    try:
        return os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        return None


def job_env(extra: Mapping[str, str]) -> dict[str, str]:
    """A clean environment for a check job: PATH, locale, library path and ``extra``.

    Starting from nothing matters: an inherited CUDA_VISIBLE_DEVICES would make
    a visibility check pass or fail for the wrong reason.
    """
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    env.update(extra)
    return env


def run_check_job(argv: Sequence[str], env: Mapping[str, str], timeout: float = 60) -> str:
    """Run a check job with a clean environment plus ``env``; return its stdout."""
    try:
        if os.path.basename(argv[0]).startswith("python") and argv[1:2] != ["-I"]:
            argv = [argv[0], "-I", *argv[1:]]  # root's Python: nothing from the cwd
        return run(argv, env=job_env(env), timeout=timeout, cwd="/").stdout
    except CommandError as exc:
        # The argv holds a whole script; what the job said is the useful part.
        said = exc.stderr.strip() or exc.stdout.strip() or str(exc)
        raise GpuProbeError(f"the check job failed: {said}") from exc


def existing(paths: Sequence[str]) -> list[str]:
    """``paths`` that exist, in order and without repeats."""
    seen: list[str] = []
    for p in paths:
        if p not in seen and os.path.exists(p):
            seen.append(p)
    return seen
