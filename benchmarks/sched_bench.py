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

``--journal`` adds submissions through the real journaled state path:

- in this process (one core): ``JobTable.submit`` through a ``StateStore`` (PySyncObj,
  a cluster of one, journal in a temporary STATE_DIR, the daemon's consumers), with
  records built as the ``job.submit`` op builds them, 1 / 32 / 256 awaited at once,
  each awaited until its commit is acknowledged; then the journal is reopened as
  after a restart, and the job table's memory is traced;
- through a running daemon (root): the per-call cost of ``mt-job submit`` (Python, and
  the C fast path ``mtgpu/cli/fastjob.c``) as a tenant, then ``job.submit`` over the
  API socket from 1 or 16 connections, pipelined or not, with the daemon on one core.

Target: >= 1,000 submissions/s accepted and journaled (Slurm's published figure).

``--slurm`` (root, about 8 minutes) installs Debian's slurm-wlm if needed, runs it with
the anchor recipe (``benchmarks/slurm/``), then MTGPU, and times the same CLI work
through both in one run: sequential ``sbatch`` against ``mt-job submit``, submit->start
latency on an idle node, and a 1,000-task array to completion; see ``slurm_ref.py``.

    python benchmarks/sched_bench.py                 # the defaults above
    python benchmarks/sched_bench.py --pending 10000 --json
    python benchmarks/sched_bench.py --no-core --journal          # root for the API part
    python benchmarks/sched_bench.py --no-core --slurm            # root

Timings are printed with the machine they ran on; nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
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
GPU_KINDS = [
    ("nvidia", "a100", 80 * G, 0.25),
    ("nvidia", "h100", 80 * G, 0.15),
    ("nvidia", "l40s", 48 * G, 0.20),
    ("nvidia", "rtx4090", 24 * G, 0.25),
    ("amd", "mi250", 64 * G, 0.10),
    ("intel", "max1100", 48 * G, 0.05),
]


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
                members = (
                    MemberPlacement(node=name, rank=0, gpu_indices=(idx,), cpus=c, ram=r, vram_per_gpu=v),
                )
                end = None if rng.random() < 0.1 else NOW + rng.uniform(60, 48 * 3600)
                running.append(Allocation(Placement(f"r{jid}", mode, members), end))
            gpus.append(
                GpuSnapshot(
                    index=idx,
                    brand=brand,
                    type=gtype,
                    vram_total=vram,
                    vram_used=used,
                    vram_committed=committed,
                    exclusive_job=holder,
                    shared_jobs=shared,
                )
            )
        nodes.append(
            NodeSnapshot(
                name=name,
                cpus=cpus,
                ram_total=ram,
                gpus=tuple(gpus),
                ram_used=ram_used + 8 * G,
                cpus_committed=cpus_used,
                ram_committed=ram_used,
            )
        )
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
        base = PendingJob(
            job_id=f"j{len(jobs)}",
            tenant=f"t{rng.randrange(n_tenants)}",
            request=req,
            priority=rng.randint(0, 50),
            submit_time=NOW - rng.uniform(0, 2 * 86400),
            time_limit=None if rng.random() < 0.1 else rng.choice((600, 3600, 4 * 3600, 86400)),
        )
        if rng.random() < 0.01:  # an array job with a %N limit
            array_no += 1
            aid = f"a{array_no}"
            limit = rng.choice((4, 8, 16))
            for t in range(min(rng.choice((10, 20, 50)), n_jobs - len(jobs))):
                jobs.append(
                    dataclasses.replace(
                        base, job_id=f"{aid}_{t}", array_id=aid, array_task=t, array_limit=limit
                    )
                )
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
    cpu: list[float] = []  # this thread's CPU time: the same, less time the OS gave to others
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
    return {
        "plan_build_s": round(t_plan, 4),
        "decisions": len(times),
        "placed": placed,
        "seconds": round(total, 4),
        "placements_per_s": round(placed / total, 1),
        "decisions_per_s": round(len(times) / total, 1),
        "p50_ms": round(statistics.median(times) * 1e3, 4),
        "p99_ms": round(_pct(times, 99) * 1e3, 4),
        "max_ms": round(max(times) * 1e3, 4),
        "cpu_p50_ms": round(statistics.median(cpu) * 1e3, 4),
        "cpu_p99_ms": round(_pct(cpu, 99) * 1e3, 4),
    }


def bench_queue(
    snapshot: ClusterSnapshot, jobs: list[PendingJob], policy: QueuePolicy, max_passes: int = 50
) -> dict[str, Any]:
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
    return {
        "pending": len(jobs),
        "queue_build_s": round(t_add, 3),
        "passes": len(passes),
        "placed_total": sum(len(r.placements) for _, r in passes),
        "full": last is not None,
        "first_pass_s": round(t1, 4),
        "first_placed": len(first.placements),
        "first_examined": first.examined,
        "first_us_per_examined": round(t1 / max(1, first.examined) * 1e6, 1),
        "full_pass_s": round(tn, 4),
        "full_examined": final.examined,
        "full_us_per_examined": round(tn / max(1, final.examined) * 1e6, 1),
        "full_reasons": reasons,
        "reservation": None if final.reservation is None else final.reservation.job_id,
    }


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


# ------------------------------------------------------- journaled submissions

#: Job files like the ones tenants send; parsed once, as the API would, into records.
JOB_FILES = [
    (
        "#!/bin/bash\n#MTGPU gpus=1 cpus=8 ram=32G time=4h name=train\n#SBATCH --output=logs/%x-%j.out\n"
        "source ~/venv/bin/activate\ntorchrun --nproc-per-node=1 train.py --config configs/base.yaml --epochs 20\n"
    ),
    (
        "#!/bin/bash\n#MTGPU gpus=nvidia:1 vram=10G cpus=2 ram=8G name=eval priority=20\n"
        "python eval.py --checkpoint runs/last.pt --split val\n"
    ),
    (
        "#!/bin/bash\n#SBATCH --job-name=prep\n#SBATCH --cpus-per-task=4\n#SBATCH --mem=16G\n#SBATCH --time=30\n"
        "python preprocess.py --in /data/raw --out /data/shards\n"
    ),
    "#!/bin/bash\n#MTGPU cpus=1 ram=1G\necho hello from $MTGPU_JOB_ID\n",
    (
        "#!/bin/bash\n#MTGPU gpus=2 cpus=16 ram=64G nodes=1 time=1d name=finetune requeue=yes\n"
        "export NCCL_DEBUG=WARN\ntorchrun --nproc-per-node=2 finetune.py --lr 3e-5 --batch 64\n"
    ),
]


def journal_records(n: int, seed: int) -> list[tuple[dict[str, Any], list[int] | None, str]]:
    """``n`` submissions as the API builds them: (record, array tasks or None, token)."""
    import uuid

    from mtgpu.jobspec import spec_to_dict
    from mtgpu.schedd.jobfile import expand_array, parse_job_file

    rng = random.Random(seed)
    parsed = []
    for i, text in enumerate(JOB_FILES):
        spec = parse_job_file(text, default_workdir=f"/home/t{i}/project")
        parsed.append(spec)
    out = []
    for _ in range(n):
        spec = parsed[rng.randrange(len(parsed))]
        user = f"t{rng.randrange(500)}"
        tasks = None
        if rng.random() < 0.01:  # now and then a small array, as one entry
            spec = dataclasses.replace(spec, array="0-9")
            tasks = expand_array(spec)
        record = {
            "user": user,
            "uid": 20000 + int(user[1:]),
            "name": spec.name,
            "spec": spec_to_dict(spec),
            "workdir": spec.workdir,
        }
        out.append((record, tasks, uuid.uuid4().hex))
    return out


def _journal_bytes(state_dir: str) -> int:
    """The journal's logical length (PySyncObj grows the file ahead of its contents)."""
    import struct

    path = Path(state_dir) / "raft.journal"
    try:
        with open(path, "rb") as f:
            head = f.read(40)
        return struct.unpack_from("<I", head, 36)[0]
    except (OSError, struct.error):
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def journal_memory(records: list[tuple[dict[str, Any], list[int] | None, str]]) -> dict[str, Any]:
    """Memory the job table holds for ``records`` (applied directly, traced by tracemalloc)."""
    from mtgpu.schedd.jobtable import JobTable

    gc.collect()
    tracemalloc.start()
    table = JobTable()
    for record, tasks, token in records:
        table.submit(record, tasks, NOW, token, _doApply=True)
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "submissions": len(records),
        "job_records": len(table.jobs),
        "mb": round(held / 2**20, 1),
        "bytes_per_record": held // max(1, len(table.jobs)),
    }


async def _journal_level(
    records: list[tuple[dict[str, Any], list[int] | None, str]], concurrency: int, state_dir: str
) -> dict[str, Any]:
    """Submit ``records`` through a fresh StateStore, ``concurrency`` awaited at once."""
    from mtgpu.accounts.registry import Registry
    from mtgpu.schedd.jobtable import JobTable
    from mtgpu.state.store import StateStore

    table = JobTable()
    store = StateStore("bench-node", [Registry((20000, 29999)), table], state_dir)
    try:
        await store.wait_ready()
        lat: list[float] = []
        it = iter(records)
        clock = time.perf_counter

        async def worker() -> None:
            for record, tasks, token in it:
                t0 = clock()
                await store.call(table.submit, record, tasks, time.time(), token)
                lat.append(clock() - t0)

        c0 = time.process_time()
        t0 = clock()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = clock() - t0
        cpu = time.process_time() - c0
        n = len(lat)
        assert table.next_id == n + 1, "every submission got its own id"
        return {
            "concurrency": concurrency,
            "submissions": n,
            "jobs": len(table.jobs),
            "seconds": round(took, 3),
            "per_s": round(n / took, 1),
            "cpu_s": round(cpu, 3),
            "cpu_ms_each": round(cpu / n * 1e3, 3),
            "ack_p50_ms": round(statistics.median(lat) * 1e3, 3),
            "ack_p99_ms": round(_pct(lat, 99) * 1e3, 3),
            "ack_max_ms": round(max(lat) * 1e3, 1),
            "journal_bytes": _journal_bytes(state_dir),
            # PySyncObj compacts its log past logCompactionMinEntries (20,000 in
            # make_conf): it writes a full dump of the state and empties the journal.
            "compacted": (Path(state_dir) / "raft.dump").exists(),
            "dump_bytes": _size(Path(state_dir) / "raft.dump"),
        }
    finally:
        store.close()


async def _journal_replay(state_dir: str, expect: int) -> dict[str, Any]:
    """Reopen a journal as a restarted daemon would and check every job is back."""
    from mtgpu.accounts.registry import Registry
    from mtgpu.schedd.jobtable import JobTable
    from mtgpu.state.store import StateStore

    t0 = time.perf_counter()
    table = JobTable()
    store = StateStore("bench-node", [Registry((20000, 29999)), table], state_dir)
    try:
        await store.wait_ready(timeout=120)
        deadline = time.monotonic() + 120
        while len(table.jobs) < expect and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return {"jobs": len(table.jobs), "expected": expect, "seconds": round(time.perf_counter() - t0, 3)}
    finally:
        store.close()


def bench_journaled_submission(args: argparse.Namespace) -> dict[str, Any]:
    """Submissions journaled through the real replicated state, in this process.

    A :class:`~mtgpu.state.store.StateStore` (PySyncObj, a cluster of one, journal in a
    temporary STATE_DIR) with the daemon's consumers (user registry and job table).
    Each submission is ``JobTable.submit`` of a record built as the ``job.submit`` API
    op builds it, awaited until PySyncObj acknowledges the commit; ``concurrency``
    submissions are in flight at once, as concurrent API requests would be. Each
    level starts from an empty journal; the last one is then reopened, as after a
    restart, to check that every job comes back.
    """
    import shutil
    import tempfile

    levels = [int(c) for c in str(args.journal_concurrency).split(",") if c]
    out: dict[str, Any] = {"levels": []}
    base = tempfile.mkdtemp(prefix="mtgpu-journal-")
    try:
        last_dir, last_n = "", 0
        for i, c in enumerate(levels):
            n = min(args.journal_n, args.journal_seq_n) if c == 1 else args.journal_n
            records = journal_records(n, args.seed + 10 + i)
            state_dir = os.path.join(base, f"level{i}")
            gc.collect()
            out["levels"].append(asyncio.run(_journal_level(records, c, state_dir)))
            del records
            last_dir, last_n = state_dir, out["levels"][-1]["jobs"]
        if last_dir:
            out["replay"] = asyncio.run(_journal_replay(last_dir, last_n))
        out["memory"] = journal_memory(journal_records(args.journal_n, args.seed + 10))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    best = max(lv["per_s"] for lv in out["levels"])
    out["best_per_s"] = best
    return out


def bench_api_submission(args: argparse.Namespace) -> dict[str, Any]:
    """``job.submit`` through the API socket of a running daemon (needs root)."""
    import slurm_ref

    return slurm_ref.api_socket_bench(args)


def compare_with_slurm(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Slurm and MTGPU side by side on this machine, in this run (needs root)."""
    import slurm_ref

    return slurm_ref.compare(args)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    ap.add_argument("--no-core", action="store_true", help="skip the placement and queue measurements")
    j = ap.add_argument_group("--journal: submissions through the replicated state")
    j.add_argument(
        "--journal",
        action="store_true",
        help="time JobTable.submit through a StateStore in this process, then job.submit "
        "through a running daemon's API socket (that part needs root)",
    )
    j.add_argument("--journal-n", type=int, default=20000, help="submissions per concurrency level")
    j.add_argument(
        "--journal-seq-n", type=int, default=2000, help="submissions when one at a time (concurrency 1)"
    )
    j.add_argument(
        "--journal-concurrency", default="1,32,256", help="submissions awaited at once, comma-separated"
    )
    j.add_argument("--no-api", action="store_true", help="skip the API-socket part")
    j.add_argument("--api-n", type=int, default=5000, help="submissions per API-socket level")
    j.add_argument(
        "--api-clients",
        default="1x1,16x1,16x8",
        help="API-socket levels: CONNECTIONSxIN_FLIGHT_EACH, comma-separated",
    )
    sl = ap.add_argument_group("--slurm: Slurm and MTGPU side by side (needs root; about 8 minutes)")
    sl.add_argument(
        "--slurm",
        action="store_true",
        help="install and run Slurm (Debian's slurm-wlm) with the anchor recipe, then MTGPU, "
        "and time the same CLI work through both",
    )
    sl.add_argument("--slurm-conf", choices=("tuned", "stock"), default="tuned")
    sl.add_argument("--slurm-n", type=int, default=500, help="sequential CLI submissions")
    sl.add_argument("--lat-n", type=int, default=30, help="submit->start samples")
    sl.add_argument(
        "--python-n",
        type=int,
        default=100,
        help="sequential submissions with the Python mt-job (about 10 a second with jobs running)",
    )
    sl.add_argument("--array", type=int, default=1000, help="array tasks")
    sl.add_argument(
        "--sim-cpus",
        type=int,
        default=32,
        help="MTGPU host's SIMULATED_CPUS (Slurm's 'over' partition runs 32 at once)",
    )
    ap.add_argument("--out", help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    import slurm_ref

    machine = slurm_ref.machine_info()
    results: dict[str, Any] = {"machine": machine, "python": sys.version.split()[0]}
    targets: dict[str, bool] = {}
    if not args.json:
        print(f"machine: {slurm_ref.machine_line(machine)}", flush=True)
    all_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    pinned = not args.no_pin and hasattr(os, "sched_setaffinity")
    if pinned:
        os.sched_setaffinity(0, {min(all_cpus)})
        results["pinned_cpu"] = min(all_cpus)

    if not args.no_core:
        sizes = [int(s) for s in args.pending.split(",") if s]
        t0 = time.perf_counter()
        snapshot = build_cluster(args.nodes, args.gpus_per_node, args.seed, args.busy)
        build_s = time.perf_counter() - t0
        all_jobs = build_jobs(max(sizes), args.tenants, args.nodes, args.seed + 1)
        policy = QueuePolicy(max_examined=args.max_examined)
        results.update(
            {
                "cluster": {
                    "nodes": args.nodes,
                    "gpus": args.nodes * args.gpus_per_node,
                    "running": len(snapshot.running),
                    "build_s": round(build_s, 3),
                },
                "placement": bench_placement(snapshot, all_jobs[: max(sizes)], args.decisions),
                "queue": [bench_queue(snapshot, all_jobs[:n], policy) for n in sizes],
                "peak_traced_mb": {n: measure_memory(snapshot, all_jobs[:n], policy) for n in sizes},
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
        del snapshot, all_jobs
        p = results["placement"]
        targets.update(
            {
                "placements_per_s>=1000": p["placements_per_s"] >= 1000,
                "p99_decision_ms<=1": p["p99_ms"] <= 1.0,
            }
        )
        if not args.json:
            _print(results)

    if args.journal:
        results["journal"] = bench_journaled_submission(args)
        targets["journaled_submissions_per_s>=1000 (in process)"] = results["journal"]["best_per_s"] >= 1000
        if not args.json:
            _print_journal(results["journal"], pinned)
        if pinned:
            os.sched_setaffinity(0, all_cpus)  # the daemon and its clients get the machine back
        if not args.no_api:
            results["api_socket"] = bench_api_submission(args)
            if "skipped" not in results["api_socket"]:
                targets["api_submissions_per_s>=1000 (daemon on one core)"] = (
                    results["api_socket"]["best_per_s"] >= 1000
                )
            if not args.json:
                _print_api(results["api_socket"])

    if args.slurm:
        if pinned:
            os.sched_setaffinity(0, all_cpus)  # Slurm and MTGPU both get every core
        cmp_ = compare_with_slurm(results, args)
        results["slurm"] = cmp_
        for r in cmp_["table"]:
            if r["target"] is not None:
                targets[f"{r['metric']} >= {r['target']:g}x Slurm"] = bool(r["met"])
        if not args.json:
            slurm_ref.print_comparison(cmp_)

    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    results["targets"] = targets
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        print(
            f"\npeak RSS of this process {results['peak_rss_mb']} MB; targets: "
            + (", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in targets.items()) or "none measured")
        )
    return 0 if all(targets.values()) else 1


def _print_journal(j: dict[str, Any], pinned: bool) -> None:
    where = "one core (this process, PySyncObj's thread included, pinned)" if pinned else "unpinned"
    print(
        f"journaled submissions in process ({where}): JobTable.submit through a StateStore "
        "(PySyncObj, cluster of one, fresh journal per level), each awaited until its commit is acknowledged"
    )
    for lv in j["levels"]:
        print(
            f"  {lv['concurrency']:>4} in flight: {lv['submissions']} submissions in {lv['seconds']} s -> "
            f"{lv['per_s']} /s; ack p50 {lv['ack_p50_ms']} ms, p99 {lv['ack_p99_ms']} ms, "
            f"max {lv['ack_max_ms']} ms; CPU {lv['cpu_ms_each']} ms each; {lv['jobs']} job records; "
            + (
                f"log compacted during the run (full dump {lv['dump_bytes'] / 2**20:.1f} MB, "
                f"journal left {lv['journal_bytes'] / 2**20:.1f} MB)"
                if lv["compacted"]
                else f"journal {lv['journal_bytes'] / 2**20:.1f} MB "
                f"({lv['journal_bytes'] // max(1, lv['submissions'])} B each)"
            )
        )
    if "replay" in j:
        r = j["replay"]
        print(
            f"  reopened the last journal as after a restart: {r['jobs']} of {r['expected']} jobs back "
            f"in {r['seconds']} s"
        )
    m = j["memory"]
    print(
        f"  memory held by the job table: {m['mb']} MB for {m['job_records']} job records from "
        f"{m['submissions']} submissions ({m['bytes_per_record']} B each, traced)"
    )


def _print_api(a: dict[str, Any]) -> None:
    if "skipped" in a:
        print(f"API socket: skipped ({a['skipped']})")
        return
    print(
        f"job.submit through a running daemon's API socket, as a tenant ({a['pinning']}); every job "
        "queues behind a running one, so each submission also wakes a scheduling pass"
    )
    for lv in a["levels"]:
        print(
            f"  {lv['connections']:>3} connection(s) x {lv['depth']} in flight: {lv['submissions']} "
            f"submissions ({lv['errors']} refused) in {lv['seconds']} s -> {lv['per_s']} /s; "
            f"answer p50 {lv['p50_ms']} ms, p99 {lv['p99_ms']} ms, max {lv['max_ms']} ms; "
            f"daemon CPU {lv['daemon_cpu_s']} s"
            + (f"; first refusal: {lv['first_error']}" if lv.get("first_error") else "")
        )
    if a.get("cli"):
        print(
            "  one CLI call per process, sequential, as the tenant in one session (nothing runs meanwhile):"
        )
        for c in a["cli"]:
            print(
                f"    {c['command']:<42} {c['calls']:>4} calls: {c['ms_per_call']:8.2f} ms each -> "
                f"{c['per_s']}/s" + (f" ({c['failed']} failed)" if c["failed"] else "")
            )
    d = a.get("daemon", {})
    print(
        f"  daemon at the end: RSS {d.get('rss_mb')} MB (peak {d.get('hwm_mb')} MB), CPU {d.get('cpu_s')} s"
    )


def _print(r: dict[str, Any]) -> None:
    c, p = r["cluster"], r["placement"]
    print(
        f"cluster: {c['nodes']} members, {c['gpus']} GPUs, {c['running']} running allocations "
        f"(built in {c['build_s']} s); Python {r['python']}"
    )
    print(
        f"placement: plan and indexes built in {p['plan_build_s']} s; {p['decisions']} decisions, {p['placed']} placed in {p['seconds']} s -> "
        f"{p['placements_per_s']} placements/s ({p['decisions_per_s']} decisions/s); "
        f"decision p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms, max {p['max_ms']} ms "
        f"(CPU time: p50 {p['cpu_p50_ms']} ms, p99 {p['cpu_p99_ms']} ms)"
    )
    for q in r["queue"]:
        print(
            f"queue {q['pending']:>7} pending (built in {q['queue_build_s']} s): {q['passes']} passes, "
            f"{q['placed_total']} placed; first pass {q['first_pass_s']} s ({q['first_placed']} placed, "
            f"{q['first_examined']} examined, {q['first_us_per_examined']} us each); "
            f"pass on the full cluster {q['full_pass_s']} s ({q['full_examined']} examined, "
            f"{q['full_us_per_examined']} us each, reasons {q['full_reasons']}, "
            f"reservation for {q['reservation']}); "
            f"peak traced {r['peak_traced_mb'][q['pending']]} MB"
        )
    print(f"peak RSS after the placement and queue runs {r['peak_rss_mb']} MB")


if __name__ == "__main__":
    sys.exit(main())
