"""Check the NVIDIA probe against the real GPUs of this host, and print what it found.

Run from the repository root::

    python tests/device/check_nvidia.py [--require]

It needs only nvidia-ml-py, pyyaml, psutil and tabulate (no CUDA toolkit: the
checks talk to the driver's libcuda directly). It prints the probe's findings as
JSON, then one PASS/FAIL line per check, and exits 0 when every check passed,
1 when one failed. Without an NVIDIA GPU it prints SKIP and exits 0, or 1 with
``--require`` (for a machine that is supposed to have one).

pytest does not collect this file (its name does not start with ``test_``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mtgpu.config import Options  # noqa: E402
from mtgpu.errors import CommandError, GpuProbeError  # noqa: E402
from mtgpu.gpuinfo.check import OK, check_probe  # noqa: E402
from mtgpu.gpuinfo.nvidia import NvidiaProbe  # noqa: E402
from mtgpu.gpuinfo.sampler import Sampler  # noqa: E402
from mtgpu.proc import run  # noqa: E402

MiB = 1 << 20
HOLD = 256 * MiB

# A child that opens a CUDA context on GPU 0 and holds HOLD bytes until its stdin
# closes, so the probe has a process of ours to find.
_HOLDER = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit"
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), HOLD) == 0, "cuMemAlloc"
print("ready", flush=True)
sys.stdin.read()
""".replace("HOLD", str(HOLD))

results: list[tuple[bool, str]] = []


def check(ok: bool, what: str) -> bool:
    results.append((bool(ok), what))
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
    return bool(ok)


def smi_gpus() -> list[dict] | None:
    """nvidia-smi's own view, to compare with; None if it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = run(
            [exe, "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            timeout=60,
        ).stdout
    except CommandError as exc:
        print(f"NOTE nvidia-smi failed ({exc}); skipping the cross-check")
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]

    def number(text: str) -> int | None:
        return int(text) if text.isdigit() else None  # "[N/A]" on MIG-enabled cards

    return [
        {"index": int(r[0]), "uuid": r[1], "name": r[2], "total_mib": number(r[3]), "used_mib": number(r[4])}
        for r in rows
    ]


def main() -> int:
    require = "--require" in sys.argv[1:]
    probe = NvidiaProbe()
    try:
        gpus = probe.probe()
    except GpuProbeError as exc:
        check(False, f"the NVIDIA probe runs: {exc}")
        return 1
    if not gpus:
        print(f"SKIP no NVIDIA GPU here: {probe.reason or 'NVML found none'}")
        return 1 if require else 0

    check(True, f"the NVIDIA probe found {len(gpus)} GPU(s)")
    for g in gpus:
        check(g.type and g.type != "nvidia", f"GPU {g.index}: {g.name!r} has the type name {g.type!r}")
        check(
            g.uuid.startswith(("GPU-", "MIG-")) and g.visibility_id == g.uuid,
            f"GPU {g.index}: jobs are pointed at it by UUID ({g.uuid})",
        )
        check(
            g.vram_total > 0 and 0 <= g.vram_used <= g.vram_total and 0 <= g.util <= 100,
            f"GPU {g.index}: VRAM {g.vram_used}/{g.vram_total} bytes, util {g.util}% are sane",
        )

    smi = smi_gpus()
    if smi is None:
        print("NOTE no usable nvidia-smi; skipping the cross-check")
    else:
        by_uuid = {s["uuid"]: s for s in smi}
        for g in gpus:
            s = by_uuid.get(g.uuid)
            check(
                s is not None
                and s["name"] == g.name
                and (s["total_mib"] is None or abs(s["total_mib"] - g.vram_total / MiB) <= 1),
                f"GPU {g.index}: nvidia-smi agrees on name and total VRAM ({s})",
            )

    nodes = probe.device_nodes([gpus[0].index])
    check(
        any(n.startswith("/dev/nvidia") and n[len("/dev/nvidia") :].isdigit() for n in nodes)
        and "/dev/nvidiactl" in nodes,
        f"device files for GPU 0: {nodes}",
    )

    # A process of ours on GPU 0 must show up with our UID and at least what it holds.
    # The holder outlives one call, which proc.run is not for, hence Popen here.
    before = {p.pid for p in probe.probe()[0].processes}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus[0].uuid},
    )
    try:
        ready = holder.stdout.readline().strip() == "ready"
        if check(ready, f"a CUDA process (PID {holder.pid}) holds {HOLD // MiB} MiB on GPU 0"):
            after = probe.probe()[0].processes
            mine = [p for p in after if p.pid == holder.pid]
            new = [p for p in after if p.pid not in before and p.used_memory >= HOLD]
            if mine:
                check(
                    mine[0].uid == os.getuid() and mine[0].used_memory >= HOLD,
                    f"the probe lists that process with our UID {os.getuid()} and its memory ({mine[0]})",
                )
            else:
                # In a container NVML reports host PIDs, which this PID namespace cannot see;
                # the daemon runs on the host, where they match.
                check(
                    len(new) == 1,
                    f"the probe lists one new process holding at least "
                    f"{HOLD // MiB} MiB ({new}); its PID differs from ours, so "
                    "this script runs in another PID namespace than the driver",
                )
        else:
            print(holder.stderr.read().strip())
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)

    result = check_probe(NvidiaProbe())
    check(result.visibility == OK, f"a job confined to one GPU sees only it: {result.detail}")

    sampler = Sampler(Options(tenant_home_root="/"), probes=[NvidiaProbe()])
    sampler.sample()  # the first sample starts NVML
    n = 20
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        inv = sampler.sample()
    cpu_ms, wall_ms = (time.process_time() - cpu) * 1000 / n, (time.perf_counter() - wall) * 1000 / n
    share = cpu_ms / 1000 / Options().usage_sample_interval * 100
    check(
        share < 1.0,
        f"one sample costs {cpu_ms:.2f} ms CPU ({wall_ms:.2f} ms wall): "
        f"{share:.3f}% of a core at the default interval",
    )
    sampler.close()

    print(
        json.dumps(
            {
                "node": inv.to_dict(processes=True),
                "nvidia_smi": smi,
                "sample_cpu_ms": round(cpu_ms, 3),
                "sample_wall_ms": round(wall_ms, 3),
            },
            indent=2,
            default=str,
        )
    )
    failed = [what for ok, what in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
