"""What node sampling costs: CPU seconds per sample and the share of one core it implies.

Run from the repository root::

    python benchmarks/sampler_cost.py [--samples N] [--gpus N]

It samples a host with simulated GPUs through the real psutil path (CPU, RAM,
disk of TENANT_HOME_ROOT), directly and through the daemon's asyncio loop, and
times the DRM fdinfo scan the Intel probe adds on hosts with Intel GPUs. The
target is under 1% of one core at the default USAGE_SAMPLE_INTERVAL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtgpu.config import Options, SimulatedGpuSpec  # noqa: E402
from mtgpu.gpuinfo import drmclients  # noqa: E402
from mtgpu.gpuinfo.sampler import Sampler  # noqa: E402

GiB = 1 << 30


def cpu_per_call(fn, n: int) -> float:
    """CPU seconds (all threads of this process) per call of ``fn``."""
    fn()  # warm up: imports, first psutil call
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def cpu_per_loop_sample(sampler: Sampler, n: int) -> float:
    """CPU seconds per sample when the daemon's loop drives the sampler (to_thread included)."""

    async def main() -> float:
        task = asyncio.create_task(sampler.run(interval=0.0))
        while sampler.latest is None:
            await asyncio.sleep(0.001)
        first = sampler.latest.sampled_at  # the clock counts samples
        start = time.process_time()
        while sampler.latest.sampled_at - first < n:
            await asyncio.sleep(0.001)
        used = time.process_time() - start
        done = sampler.latest.sampled_at - first
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return used / done

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    interval = Options().usage_sample_interval
    opts = Options(
        server_name="bench",
        tenant_home_root="/",
        simulated_gpus=(SimulatedGpuSpec("h100", args.gpus, 80 * GiB, used=GiB),),
    )
    counter = iter(range(1, 10**9))
    sampler = Sampler(opts, clock=lambda: float(next(counter)))
    sampler.set_declared({i: 20 * GiB for i in range(args.gpus)})

    direct = cpu_per_call(sampler.sample, args.samples)
    looped = cpu_per_loop_sample(sampler, args.samples)
    scan = cpu_per_call(lambda: drmclients.scan("/proc"), max(20, args.samples // 50))
    nprocs = sum(1 for p in os.listdir("/proc") if p.isdigit())

    def line(what: str, seconds: float) -> str:
        return (
            f"{what:<44} {seconds * 1000:8.3f} ms CPU/sample   {seconds / interval * 100:7.4f} % of one core"
        )

    print(
        f"interval {interval:g} s (USAGE_SAMPLE_INTERVAL default), {args.gpus} simulated GPUs, "
        f"{args.samples} samples, {os.cpu_count()} CPUs"
    )
    print(line("sample() (simulated GPUs + psutil)", direct))
    print(line("run() loop (asyncio.to_thread + sample)", looped))
    print(line(f"Intel fdinfo scan of /proc ({nprocs} processes)", scan))
    print(line("worst case: loop + Intel scan", looped + scan))
    print("target: under 1 % of one core:", "met" if (looped + scan) / interval < 0.01 else "NOT met")


if __name__ == "__main__":
    main()
