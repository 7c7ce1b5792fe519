#!/usr/bin/env python3
"""Scheduler benchmark: the real placement and queue code on a synthetic cluster.

What it measures (one core, no I/O):

- **placement decisions**: ``Plan.place`` plus ``Plan.commit`` for jobs taken in queue
  order on a 1,000-member cluster of 8 GPUs each (mixed types, partly busy):
  placements per second, p50/p99/max time of one decision;
- **queue passes**: ``schedule_pass`` over 10,000 and 100,000 pending jobs from 5,000
  tenants, on the cluster as it is and again once it is full: time per pass and per
  examined job, so the cost can be seen not to grow with the queue beyond the jobs
  examined;
- **memory**: peak traced allocation while building the queue and running a pass, and
  the process's peak RSS.

Targets: >= 1,000 placements/s and p99 decision <= 1 ms at 1,000 members.

    python benchmarks/sched_bench.py                 # the defaults above
    python benchmarks/sched_bench.py --pending 10000 --json

Two parts are left for later work, with their flags reserved here:
``--journal`` (submissions journaled through the replicated state) and
``--slurm`` (side by side with the Slurm anchor figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtgpu.schedd.placement import Plan  # noqa: E402
from mtgpu.schedd.queue import PendingQueue, QueuePolicy, schedule_pass  # noqa: E402
from mtgpu.schedd.types import (  # noqa: E402
    Allocation,
    ClusterSnapshot,
    GpuMode,
    GpuSnapshot,
    MemberPlacement,
    NodeSnapshot,
    PendingJob,
    Placement,
    ResourceRequest,
)

G = 1 << 30
NOW = 1_800_000_000.0
#: (brand, type, VRAM, share of members)
GPU_KINDS = [("nvidia", "a100", 80 * G, 0.25), ("nvidia", "h100", 80 * G, 0.15),
             ("nvidia", "l40s", 48 * G, 0.20), ("nvidia", "rtx4090", 24 * G, 0.25),
             ("amd", "mi250", 64 * G, 0.10), ("intel", "max1100", 48 * G, 0.05)]


def build_cluster(n_nodes: int, gpus_per_node: int, seed: int, busy: float = 0.3) -> ClusterSnapshot:
    """A cluster of ``n_nodes`` members; about ``busy`` of the GPUs already hold work."""
    rng = random.Random(seed)
    nodes: list[NodeSnapshot] = []
    running: list[Allocation] = []
    weights = [k[3] for k in GPU_KINDS]
    jid = 0
    for i in range(n_nodes):
        kinds = [rng.choices(GPU_KINDS, weights)[0]]
        if rng.random() < 0.1:  # a tenth of the members mix two types, half and half
            kinds.append(rng.choices(GPU_KINDS, weights)[0])
        cpus = rng.choice((64, 96, 128))
        ram = rng.choice((512, 768, 1024)) * G
        name = f"node{i:04d}"
        gpus = []
        cpus_used = ram_used = 0
        for idx in range(gpus_per_node):
            brand, gtype, vram, _ = kinds[idx * len(kinds) // gpus_per_node]
            holder, shared, committed, used = None, 0, 0, rng.choice((0, 0, 0, 300 << 20))
            members = None
            if rng.random() < busy:
                jid += 1
                c, r = rng.choice((2, 4, 8)), rng.choice((16, 32, 64)) * G
                cpus_used, ram_used = cpus_used + c, ram_used + r
                if rng.random() < 0.6:
                    holder, used, mode, v = f"r{jid}", used + vram // 2, GpuMode.EXCLUSIVE, 0
                else:
                    v = rng.choice((8, 16)) * G
                    shared, committed, used, mode = 1, v, used + v, GpuMode.SHARED
                members = (MemberPlacement(node=name, rank=0, gpu_indices=(idx,), cpus=c, ram=r,
                                           vram_per_gpu=v),)
                end = None if rng.random() < 0.1 else NOW + rng.uniform(60, 48 * 3600)
                running.append(Allocation(Placement(f"r{jid}", mode, members), end))
            gpus.append(GpuSnapshot(index=idx, brand=brand, type=gtype, vram_total=vram, vram_used=used,
                                    vram_committed=committed, exclusive_job=holder, shared_jobs=shared))
        nodes.append(NodeSnapshot(name=name, cpus=cpus, ram_total=ram, gpus=tuple(gpus),
                                  ram_used=ram_used + 8 * G, cpus_committed=cpus_used,
                                  ram_committed=ram_used))
    return ClusterSnapshot(nodes=tuple(nodes), running=tuple(running))


def build_jobs(n_jobs: int, n_tenants: int, n_nodes: int, seed: int) -> list[PendingJob]:
    """A mix of job shapes like a busy GPU cluster's queue."""
    rng = random.Random(seed)
    jobs: list[PendingJob] = []
    types = [k[1] for k in GPU_KINDS]
    array_no = 0
    while len(jobs) < n_jobs:
        r = rng.random()
        kw: dict[str, Any] = {"cpus": rng.choice((1, 2, 4, 8, 16)), "ram": rng.choice((4, 8, 16, 32, 64)) * G}
        if r < 0.35:
            kw.update(gpus=1)
        elif r < 0.50:
            kw.update(gpus=rng.choice((2, 4, 8)))
        elif r < 0.68:
            kw.update(gpus=1, gpu_mode=GpuMode.SHARED, vram=rng.choice((4, 8, 10, 16, 20)) * G)
        elif r < 0.73:
            kw.update(gpus=1, gpu_mode=GpuMode.OVERCOMMIT, vram=rng.choice((4, 8, 16)) * G)
        elif r < 0.85:
            kw.update(gpus=0)
        elif r < 0.90:
            kw.update(gpus=8, nodes=rng.choice((2, 4)))
        elif r < 0.93:
            kw.update(gpus=1, servers=(f"node{rng.randrange(n_nodes):04d}",))
        else:
            kw.update(gpus=rng.choice((1, 2)))
        if kw.get("gpus") and rng.random() < 0.5:
            if rng.random() < 0.5:
                kw["gpu_type"] = rng.choice(types)
            else:
                kw["gpu_brand"] = rng.choice(("nvidia", "nvidia", "amd"))
        req = ResourceRequest(**kw)
        base = PendingJob(job_id=f"j{len(jobs)}", tenant=f"t{rng.randrange(n_tenants)}", request=req,
                          priority=rng.randint(0, 50), submit_time=NOW - rng.uniform(0, 2 * 86400),
                          time_limit=None if rng.random() < 0.1 else rng.choice((600, 3600, 4 * 3600, 86400)))
        if rng.random() < 0.01:  # an array job with a %N limit
            array_no += 1
            aid = f"a{array_no}"
            limit = rng.choice((4, 8, 16))
            for t in range(min(rng.choice((10, 20, 50)), n_jobs - len(jobs))):
                jobs.append(dataclasses.replace(base, job_id=f"{aid}_{t}", array_id=aid, array_task=t,
                                                array_limit=limit))
        else:
            jobs.append(base)
    return jobs


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def bench_placement(snapshot: ClusterSnapshot, jobs: list[PendingJob], decisions: int) -> dict[str, Any]:
    """Time place+commit for jobs in queue order on one plan."""
    queue = PendingQueue()
    for j in jobs:
        queue.add(j)
    t0 = time.perf_counter()
    plan = Plan(snapshot)
    # Indexes are built once per plan (per pass), not per decision: build them up front.
    plan.warm({j.request for j in jobs})
    t_plan = time.perf_counter() - t0
    times: list[float] = []  # wall clock
    cpu: list[float] = []    # this thread's CPU time: the same, less time the OS gave to others
    placed = 0
    clock, cpu_clock = time.perf_counter, time.thread_time
    gc.disable()
    try:
        for job in queue.jobs():
            if len(times) >= decisions:
                break
            c0 = cpu_clock()
            t0 = clock()
            got = plan.place(job, NOW)
            if isinstance(got, Placement):
                plan.commit(got)
                placed += 1
            times.append(clock() - t0)
            cpu.append(cpu_clock() - c0)
    finally:
        gc.enable()
    total = sum(times)
    return {"plan_build_s": round(t_plan, 4), "decisions": len(times), "placed": placed,
            "seconds": round(total, 4),
            "placements_per_s": round(placed / total, 1), "decisions_per_s": round(len(times) / total, 1),
            "p50_ms": round(statistics.median(times) * 1e3, 4), "p99_ms": round(_pct(times, 99) * 1e3, 4),
            "max_ms": round(max(times) * 1e3, 4),
            "cpu_p50_ms": round(statistics.median(cpu) * 1e3, 4), "cpu_p99_ms": round(_pct(cpu, 99) * 1e3, 4)}


def bench_queue(snapshot: ClusterSnapshot, jobs: list[PendingJob], policy: QueuePolicy,
                max_passes: int = 50) -> dict[str, Any]:
    """Queue ``jobs`` and run passes as the daemon would, applying each, until one places nothing.

    Reports the first pass (cluster partly free), the last (cluster full: every job
    examined waits) and the time per examined job in each.
    """
    gc.collect()
    t0 = time.perf_counter()
    queue = PendingQueue()
    for j in jobs:
        queue.add(j)
    t_add = time.perf_counter() - t0
    by_id = {j.job_id: j for j in jobs}
    passes = []
    now = NOW
    last = None
    for _ in range(max_passes):
        t0 = time.perf_counter()
        result = schedule_pass(snapshot, queue, now, policy)
        took = time.perf_counter() - t0
        passes.append((took, result))
        if not result.placements:
            last = result
            break
        plan = Plan(snapshot)
        new = []
        for p in result.placements:
            plan.commit(p)
            job = by_id[p.job_id]
            queue.remove(p.job_id)
            end = None if job.time_limit is None else now + job.time_limit
            new.append(Allocation(p, end, job.array_id))
        snapshot = plan.to_snapshot(new)
        now += 10
    (t1, first), (tn, final) = passes[0], passes[-1]
    reasons: dict[str, int] = {}
    for info in final.pending.values():
        reasons[info.reason] = reasons.get(info.reason, 0) + 1
    return {"pending": len(jobs), "queue_build_s": round(t_add, 3), "passes": len(passes),
            "placed_total": sum(len(r.placements) for _, r in passes), "full": last is not None,
            "first_pass_s": round(t1, 4), "first_placed": len(first.placements),
            "first_examined": first.examined,
            "first_us_per_examined": round(t1 / max(1, first.examined) * 1e6, 1),
            "full_pass_s": round(tn, 4), "full_examined": final.examined,
            "full_us_per_examined": round(tn / max(1, final.examined) * 1e6, 1),
            "full_reasons": reasons,
            "reservation": None if final.reservation is None else final.reservation.job_id}


def measure_memory(snapshot: ClusterSnapshot, jobs: list[PendingJob], policy: QueuePolicy) -> float:
    """Peak traced allocation (MB) while queueing ``jobs`` and running one pass (timed apart)."""
    gc.collect()
    tracemalloc.start()
    queue = PendingQueue()
    for j in jobs:
        queue.add(j)
    schedule_pass(snapshot, queue, NOW, policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return round(peak / 2**20, 1)


# ---------------------------------------------------------------- reserved for later work


def bench_journaled_submission(args: argparse.Namespace) -> dict[str, Any]:
    """RESERVED: submissions journaled through the replicated state (with mtgpu/state).

    To be added with the replicated state: submit ``args.pending`` jobs through the
    state's asynchronous calls and measure submissions/s and journal size.
    """
    raise NotImplementedError("--journal is added together with the replicated state")


def compare_with_slurm(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """RESERVED: set these results beside the Slurm anchor figures.

    To be added later: read the anchor's results and print the matching rows side by side.
    """
    raise NotImplementedError("--slurm comparison is not written yet")


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--tenants", type=int, default=5000)
    ap.add_argument("--pending", default="10000,100000", help="comma-separated queue sizes")
    ap.add_argument("--decisions", type=int, default=20000, help="placement decisions to time")
    ap.add_argument("--busy", type=float, default=0.3, help="share of GPUs already holding work")
    ap.add_argument("--max-examined", type=int, default=QueuePolicy().max_examined)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--journal", action="store_true", help="(reserved) journaled submissions")
    ap.add_argument("--slurm", action="store_true", help="(reserved) compare with the Slurm anchor")
    args = ap.parse_args(argv)
    if args.journal or args.slurm:
        ap.error("--journal and --slurm are reserved for later work and not implemented yet")
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sizes = [int(s) for s in args.pending.split(",") if s]
    t0 = time.perf_counter()
    snapshot = build_cluster(args.nodes, args.gpus_per_node, args.seed, args.busy)
    build_s = time.perf_counter() - t0
    all_jobs = build_jobs(max(sizes), args.tenants, args.nodes, args.seed + 1)
    policy = QueuePolicy(max_examined=args.max_examined)
    results: dict[str, Any] = {
        "cluster": {"nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node,
                    "running": len(snapshot.running), "build_s": round(build_s, 3)},
        "placement": bench_placement(snapshot, all_jobs[:max(sizes)], args.decisions),
        "queue": [bench_queue(snapshot, all_jobs[:n], policy) for n in sizes],
        "peak_traced_mb": {n: measure_memory(snapshot, all_jobs[:n], policy) for n in sizes},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "python": sys.version.split()[0],
    }
    p = results["placement"]
    results["targets"] = {"placements_per_s>=1000": p["placements_per_s"] >= 1000,
                          "p99_decision_ms<=1": p["p99_ms"] <= 1.0}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0 if all(results["targets"].values()) else 1


def _print(r: dict[str, Any]) -> None:
    c, p = r["cluster"], r["placement"]
    print(f"cluster: {c['nodes']} members, {c['gpus']} GPUs, {c['running']} running allocations "
          f"(built in {c['build_s']} s); Python {r['python']}")
    print(f"placement: plan and indexes built in {p['plan_build_s']} s; {p['decisions']} decisions, {p['placed']} placed in {p['seconds']} s -> "
          f"{p['placements_per_s']} placements/s ({p['decisions_per_s']} decisions/s); "
          f"decision p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms, max {p['max_ms']} ms "
          f"(CPU time: p50 {p['cpu_p50_ms']} ms, p99 {p['cpu_p99_ms']} ms)")
    for q in r["queue"]:
        print(f"queue {q['pending']:>7} pending (built in {q['queue_build_s']} s): {q['passes']} passes, "
              f"{q['placed_total']} placed; first pass {q['first_pass_s']} s ({q['first_placed']} placed, "
              f"{q['first_examined']} examined, {q['first_us_per_examined']} us each); "
              f"pass on the full cluster {q['full_pass_s']} s ({q['full_examined']} examined, "
              f"{q['full_us_per_examined']} us each, reasons {q['full_reasons']}, "
              f"reservation for {q['reservation']}); "
              f"peak traced {r['peak_traced_mb'][q['pending']]} MB")
    print(f"peak RSS {r['peak_rss_mb']} MB; targets: " +
          ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["targets"].items()))


if __name__ == "__main__":
    sys.exit(main())
