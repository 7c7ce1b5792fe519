#!/usr/bin/env python3
"""Replay benchmark: a 1,000-member cluster's steady-state traffic through the real code.

The recording is made once, deterministically from ``--seed`` (only this generator is
in the repository; the file is written to ``--recording`` or a temporary directory):

- **reports**: every member's ``node.report`` request line as its report loop sends
  it, every ``USAGE_SAMPLE_INTERVAL`` (5 s, each member at its own phase), with 8
  GPUs (a100, h100, l40s or rtx4090, as ``cluster_load.py``'s members); RAM, CPU and
  the sample time change in every report, and about a third of a member's GPUs
  report new VRAM and utilisation figures each time (the rest the same as before,
  which the scheduler's report reader keeps);
- **submissions**: ``--rate`` a second (Poisson), each a tenant's ``job.submit`` as a
  member relays it to the scheduler (``forward``), with ``cluster_load.py``'s mix
  (40 % ``gpus=1``, 15 % ``gpus=2``, 20 % shared 8G, 5 % overcommit, 10 % CPU only,
  5 % arrays of 8, 5 % ``nodes=4``) from 5,000 tenants;
- **ends**: each submission's parts end (COMPLETED) 5-15 s after it is placed, as the
  members' agents record them;
- **passes**: where the scheduler's loop would run a placement pass: 10 ms after a
  submission (``SUBMIT_QUIET``), at most one every ``MIN_PASS_INTERVAL`` (0.1 s), and
  once a second otherwise (the loop's wake-up), so the count of passes is part of the
  recording, not of the machine that replays it.

The replay runs in this process, on one asyncio loop, through the daemon's own parts:
a one-member PySyncObj ``StateStore`` (journal fsynced, in a temporary STATE_DIR) with
the daemon's consumers and the cluster's member list holding the 1,000 members, the
real ``Scheduler``, a real ``ClusterRuntime`` (not started: no SSH) whose
``node.report`` handler feeds the scheduler as the daemon wires it, and the real API
``Dispatcher`` with the job operations, the cluster operations and the leader
forwarding middleware. Each member has its own peer channel: the request lines go
through ``serve_lines`` (the daemon's JSON-lines server) on an in-memory stream, as
they would arrive from SSH. Passes are the scheduler's ``run_pass``; the starts it
sends go through the real ``StartBatcher`` (the request line is encoded, the member's
answer decoded); each member then records its part's start (``JobTable.started``) and
later its end (``JobTable.part_ended``) through the store, as its agent does.

Events are replayed one after the other, as fast as they go (the recording's clock
orders them; nothing sleeps), and each is awaited to its end (a submission until it is
committed and answered, a pass until its placements are committed and its starts
sent). The CPU of each kind of event is the process's own (``getrusage(RUSAGE_SELF)``,
user + system, every thread: PySyncObj's tick thread, the job-file parsers) across the
events of that kind; the event loop's own thread time (``time.thread_time``) is given
beside it. The process is pinned to one CPU (``--no-pin``: not). Each figure is also
given scaled to a reference speed (see ``Calibration``: on a shared machine the same
work takes more or less CPU time as the neighbours change). Figures: CPU-seconds per
1,000 reports, per 1,000 submissions and per placement pass (its snapshot, placement,
the commit of its placements and the sending of its starts); the members' starts
per 1,000 parts and their ends per 1,000 end events (every part of one submission:
log entries applied on the scheduler).

    python benchmarks/replay.py                       # 1,000 members, 60 s of traffic
    python benchmarks/replay.py --json
    python benchmarks/replay.py --members 20 --seconds 5 --warmup 2   # a quick one

Nothing here is asserted in tests except that every recorded event is replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import logging
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Bumped when the generator's output changes (a cached recording is made again).
FORMAT = 1
G = 1 << 30
#: GPU kinds of the members, by member number (as cluster_load.py's): type, VRAM.
KINDS = [("a100", 80 * G), ("h100", 80 * G), ("l40s", 48 * G), ("rtx4090", 24 * G)]
GPUS = 8
#: (share of submissions, directives): cluster_load.py's mix.
MIX = [
    (0.40, "gpus=1"),
    (0.15, "gpus=2"),
    (0.20, "gpus=1 vram=8G"),
    (0.05, "gpus=1 gpu_mode=overcommit vram=4G"),
    (0.10, "cpus=2 ram=4G"),
    (0.05, "gpus=1 vram=4G array=0-7"),
    (0.05, "nodes=4 gpus=1"),
]
#: How long a job runs after it is placed (seconds, uniform), as cluster_load.py's.
JOB_SECONDS = (5.0, 15.0)
TENANTS = 5000
TENANT_UID0 = 20000
#: The scheduler's own member: a voter without GPUs that reports to itself.
SCHEDULER = "sched"


# ====================================================================== recording


def _member_name(i: int) -> str:
    return f"m{i:04d}"


def _report_args(rng: random.Random, name: str, kind: int, gpu_state: list[tuple[int, int]], t: float) -> Any:
    gtype, vram = KINDS[kind]
    gpus = []
    for idx in range(GPUS):
        if rng.random() < 0.35:  # this card's figures moved since the last report
            busy = rng.random() < 0.4
            gpu_state[idx] = (
                rng.randrange(vram // 4, vram) // (1 << 20) * (1 << 20) if busy else 300 << 20,
                rng.randrange(20, 100) if busy else 0,
            )
        used, util = gpu_state[idx]
        gpus.append(
            {
                "index": idx,
                "brand": "nvidia",
                "type": gtype,
                "vram_total": vram,
                "vram_used": used,
                "util": util,
                "jobs": [],
                "name": f"Simulated {gtype}",
                "uuid": f"SIM-{name}-{idx}",
                "mig_mode": None,
            }
        )
    return {
        "name": name,
        "state": "up",
        "cpus": 128,
        "ram_total": 1024 * G,
        "ram_used": rng.randrange(8 * G, 200 * G),
        "gpus": gpus,
        "cpu_percent": round(rng.uniform(0, 60), 1),
        "disk_total": 4 << 40,
        "disk_free": rng.randrange(1 << 40, 4 << 40),
        "errors": [],
        "sampled_at": round(1_800_000_000.0 + t, 3),
        "features": [],
    }


def generate(args: argparse.Namespace) -> Iterator[bytes]:
    """The recording's lines: a header, the members, then the events in time order.

    An event line is a JSON object (``t``: seconds from the start of the measured
    window, negative in the warm-up; ``k``: its kind) and, for what arrives on a peer
    channel, a tab and the request line exactly as the member sends it.
    """
    from mtgpu.schedd.scheduler import MIN_PASS_INTERVAL, SUBMIT_QUIET

    rng = random.Random(args.seed)
    n, interval = args.members, args.interval
    t0, t1 = -float(args.warmup), float(args.seconds)
    yield _j(
        {
            "k": "header",
            "format": FORMAT,
            "members": n,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "rate": args.rate,
            "interval": interval,
            "seed": args.seed,
        }
    )
    for i in range(n):
        yield _j({"k": "member", "name": _member_name(i), "address": f"10.{i >> 8}.{i & 255}.1:22"})
    events: list[tuple[float, int, bytes]] = []  # (t, order, line)
    seq = 0

    def add(t: float, head: dict[str, Any], line: bytes | None = None) -> None:
        nonlocal seq
        seq += 1
        head = {"t": round(t, 6), **head}
        events.append((head["t"], seq, _j(head) + (b"\t" + line if line is not None else b"")))

    rids = [0] * n
    # Reports: each member at its own phase; the first one of each before the warm-up
    # (the members have reported once when the recording starts).
    for i in range(n):
        name, kind = _member_name(i), i % len(KINDS)
        mrng = random.Random(f"{args.seed}:{name}")
        state = [(300 << 20, 0)] * GPUS
        t = t0 - interval + mrng.uniform(0, interval)
        while t < t1:
            rids[i] += 1
            req = {
                "op": "node.report",
                "args": {"inventory": _report_args(mrng, name, kind, state, t)},
                "id": rids[i],
            }
            add(t, {"k": "report", "m": name}, _j(req))
            t += interval * mrng.uniform(0.98, 1.02)  # the sampler's own time drifts a little
    # Submissions, their ends, and the passes they ask for.
    shares = [s for s, _ in MIX]
    t = t0
    subs: list[float] = []
    while True:
        t += rng.expovariate(args.rate)
        if t >= t1:
            break
        directives = rng.choices([d for _, d in MIX], shares)[0]
        k = len(subs)
        m = rng.randrange(n)
        tenant = rng.randrange(TENANTS)
        rids[m] += 1
        script = f"#!/bin/bash\n#MTGPU {directives} cpus=1 ram=1G time=30m\npython train.py --run {k}\n"
        if "cpus=2" in directives:
            script = f"#!/bin/bash\n#MTGPU {directives} time=30m\npython prep.py --shard {k}\n"
        req = {
            "op": "forward",
            "args": {
                "op": "job.submit",
                "args": {
                    "script": script,
                    "workdir": f"/home/t{tenant}/work",
                    "token": f"{rng.getrandbits(128):032x}",
                },
                "caller": {"name": f"t{tenant}", "uid": TENANT_UID0 + tenant, "admin": False},
            },
            "id": rids[m],
        }
        tasks = 8 if "array=" in directives else 1
        add(t, {"k": "submit", "m": _member_name(m), "n": k, "tasks": tasks}, _j(req))
        subs.append(t)
    # Passes: SUBMIT_QUIET after a submission, MIN_PASS_INTERVAL apart, and at least
    # once a second (the loop wakes up every second without a kick).
    passes: list[float] = []
    last = t0
    i = 0
    t = t0
    while True:
        nxt_sub = subs[i] if i < len(subs) else float("inf")
        due = max(nxt_sub + SUBMIT_QUIET, last + MIN_PASS_INTERVAL)
        due = min(due, last + 1.0)
        if due >= t1:
            break
        passes.append(due)
        last = due
        while i < len(subs) and subs[i] <= due:
            i += 1
    for p in passes:
        add(p, {"k": "pass"})
    # Ends: a job is placed by the first pass after its submission; its parts end
    # JOB_SECONDS later (if that is inside the recording).
    import bisect

    for k, ts in enumerate(subs):
        j = bisect.bisect_right(passes, ts)
        if j >= len(passes):
            continue
        end = passes[j] + rng.uniform(*JOB_SECONDS)
        if end < t1:
            add(end, {"k": "end", "n": k})
    events.sort()
    for _, _, line in events:
        yield line


def _j(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def record(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Write the recording to ``path`` (gzip'd JSON lines); its size and digest."""
    h = hashlib.sha256()
    lines = 0
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wb", compresslevel=3) as f:
        for line in generate(args):
            f.write(line + b"\n")
            h.update(line + b"\n")
            lines += 1
    os.replace(tmp, path)
    return {"path": str(path), "lines": lines, "bytes": path.stat().st_size, "sha256": h.hexdigest()[:16]}


def load(
    path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple[dict[str, Any], bytes | None]], str]:
    """(header, members, events, digest) of a recording."""
    h = hashlib.sha256()
    header: dict[str, Any] = {}
    members, events = [], []
    with gzip.open(path, "rb") as f:
        for raw in f:
            h.update(raw)
            line = raw.rstrip(b"\n")
            head, tab, rest = line.partition(b"\t")
            obj = json.loads(head)
            kind = obj["k"]
            if kind == "header":
                header = obj
            elif kind == "member":
                members.append(obj)
            else:
                events.append((obj, rest if tab else None))
    return header, members, events, h.hexdigest()[:16]


# ========================================================================= replay


#: What one calibration slice takes at the reference speed (CPU-seconds): the
#: normalised figures are CPU-seconds on a CPU that runs the slice in this time.
CAL_REF = 0.001
#: A slice: decoding and encoding a report line this many times (about half of it)...
CAL_ROUNDS = 12
#: ... and reading this many of a thousand members' reports, in a shuffled order.
CAL_TOUCH = 80
#: Slices whose median gives the current speed.
CAL_WINDOW = 9


class Calibration:
    """The CPU's speed as this process sees it now, from a fixed piece of work.

    On a shared machine the same instructions take more or less CPU time as the
    other tenants of the core change (their caches, SMT siblings, the host's clock):
    replays of one recording differed by up to 40 % on the 2-vCPU VM, their median
    event as much as their mean. A slice of fixed work (decoding a member's report
    line and reading its GPU entries into tuples: stdlib and this file only, so that
    no change to MTGPU changes it) runs before every placement pass; each event's
    CPU time is scaled by ``CAL_REF`` over the median of the last ``CAL_WINDOW``
    slices. The raw figures are reported beside the scaled ones."""

    def __init__(self) -> None:
        from collections import deque

        rng = random.Random(0)
        self.line = _j(
            {"op": "node.report", "args": {"inventory": _report_args(rng, "cal", 0, [(0, 0)] * GPUS, 0.0)}}
        )
        # A working set the size of the scheduler's (a thousand members' reports), so
        # that the slice meets the caches the replay meets, not only the core.
        self.heap = [
            _report_args(rng, f"c{i:04d}", i % len(KINDS), [(300 << 20, 0)] * GPUS, 0.0) for i in range(1000)
        ]
        self.order = list(range(len(self.heap)))
        rng.shuffle(self.order)
        self.pos = 0
        self.recent: deque[float] = deque(maxlen=CAL_WINDOW)
        self.slices: list[float] = []

    def slice(self) -> float:
        t0 = time.thread_time()
        for _ in range(CAL_ROUNDS):
            d = json.loads(self.line)["args"]["inventory"]
            json.dumps(d, separators=(",", ":"))
        free = 0
        for _ in range(CAL_TOUCH):
            inv = self.heap[self.order[self.pos]]
            self.pos = (self.pos + 1) % len(self.order)
            gpus = tuple(
                (int(g["index"]), str(g["type"]), int(g["vram_total"]), int(g["vram_used"]))
                for g in inv["gpus"]
            )
            seen = {g[0]: g for g in gpus}
            free += sum(g[2] - g[3] for g in sorted(seen.values(), key=lambda g: (g[3], -g[0])))
        took = time.thread_time() - t0
        self.recent.append(took)
        self.slices.append(took)
        return took

    def factor(self) -> float:
        v = sorted(self.recent)
        return CAL_REF / v[len(v) // 2] if v else 1.0


class Channel:
    """One member's peer channel to the scheduler, in memory: request lines go in,
    the daemon's ``serve_lines`` answers them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = asyncio.StreamReader(limit=1 << 22)
        self.waiting: asyncio.Future[bytes] | None = None
        self.loop = loop

    # the writer's side, for serve_lines
    def write(self, data: bytes) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def ask(self, line: bytes) -> dict[str, Any]:
        self.waiting = self.loop.create_future()
        self.reader.feed_data(line + b"\n")
        answer = await self.waiting
        return json.loads(answer)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sys() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


class Host:
    """What the job operations and leader forwarding ask of the daemon (mtgpu.server's
    Daemon answers the same): its options, job table, scheduler and store."""

    def __init__(self, options: Any, jobs: Any, store: Any) -> None:
        self.options = options
        self.jobs = jobs
        self.store = store
        self.scheduler: Any = None

    async def replicate(self, method: Any, *args: Any, timeout: float = 30.0) -> Any:
        return await self.store.call(method, *args, timeout=timeout)

    def home_of(self, caller: Any) -> str | None:
        return f"/home/{caller.name}"

    def job_user(self, name: str, uid: int) -> Any:
        from mtgpu.schedd.jobenv import JobUser

        return JobUser(name, uid, uid, f"/home/{name}", "/bin/bash")

    async def job_image(self, user: str, uid: int, ref: str) -> dict[str, Any]:
        raise RuntimeError("no containers in the replay")

    def check_in_touch(self) -> None:
        from mtgpu.errors import ApiError

        if self.store.out_of_touch_since() is not None:
            raise ApiError("cut off", "no_leader")

    async def _leadership(self, leader: bool) -> None:
        return None


async def replay(path: Path, state_dir: str) -> dict[str, Any]:
    from mtgpu.accounts.registry import Registry
    from mtgpu.api import cluster as cluster_api
    from mtgpu.api import jobs as job_api
    from mtgpu.api.dispatcher import Caller, Dispatcher
    from mtgpu.api.unix import serve_lines
    from mtgpu.cluster.coordinator import Coordinator
    from mtgpu.cluster.identity import ClusterIdentity
    from mtgpu.cluster.lease import lease_seconds
    from mtgpu.cluster.runtime import ClusterRuntime
    from mtgpu.cluster.starts import StartBatcher
    from mtgpu.config.options import Options
    from mtgpu.config.options import replace as opt_replace
    from mtgpu.jobstate import PENDING, RUNNING
    from mtgpu.schedd.drains import Drains
    from mtgpu.schedd.jobtable import JobTable
    from mtgpu.schedd.scheduler import Scheduler
    from mtgpu.server import SETTLE_MAX, _SchedulerSide
    from mtgpu.state.audit import AuditLog
    from mtgpu.state.store import LEADER_FALLBACK, StateStore

    loop = asyncio.get_running_loop()
    header, members, events, digest = load(path)
    options = opt_replace(
        Options(source=""),
        cluster_mode="cluster",
        cluster_id="replay",
        cluster_key="replay-benchmark-cluster-key-0123456789",
        server_name=SCHEDULER,
        state_dir=state_dir,
        ssh_listen=("127.0.0.1", 22),
        usage_sample_interval=float(header["interval"]),
    )
    o = options
    identity = ClusterIdentity.derive(o.cluster_id, o.cluster_key)
    jobs = JobTable()
    registry = Registry(o.tenant_uid_range)
    drains = Drains()
    audit = AuditLog()
    host = Host(options, jobs, None)
    side = _SchedulerSide(host)  # type: ignore[arg-type]  # the narrow side the daemon gives the runtime
    rt = ClusterRuntime(
        o,
        identity,
        lambda: None,
        drains=drains,
        on_report=side.report,
        grant=side.grant,
        unreported=side.unreported,
        replica_digest=jobs.digest,
    )
    store = StateStore(SCHEDULER, [registry, jobs, drains, audit, rt.members], state_dir)
    host.store = rt.store = store
    try:
        await store.wait_ready(timeout=60)
        rt.coordinator = Coordinator(
            SCHEDULER,
            store.sync,
            rt.members,
            host.replicate,
            rt.score,
            grace=o.cluster_voter_grace,
            report_window=3 * o.usage_sample_interval + 5,
        )
        # The member list: the scheduler and every member, joined before the recording.
        now = time.time()
        await store.call(rt.members.upsert, SCHEDULER, "127.0.0.1:22", 1.0, "voter", now)
        for at in range(0, len(members), 200):
            await asyncio.gather(
                *(
                    store.call(rt.members.upsert, m["name"], m["address"], 0.5, "readonly", now)
                    for m in members[at : at + 200]
                )
            )
        for m in members:
            rt.addresses[m["name"]] = m["address"]

        started: list[tuple[str, str, int, list[dict[str, Any]]]] = []  # (job, member, attempt, gpus)
        dispatch_lines = [0, 0]  # requests, bytes

        async def peer_call(member: str, op: str, timeout: float = 0, **args: Any) -> Any:
            """What PeerClient.call does on the scheduler's side: the request line
            encoded, the member's answer decoded (its work is the replay's starts)."""
            from mtgpu import jsonl

            line = jsonl.encode({"op": op, "args": args, "id": dispatch_lines[0]})
            dispatch_lines[0] += 1
            dispatch_lines[1] += len(line)
            for jid in args["jobs"]:
                rec = jobs.record(jid)
                if rec is None:
                    continue
                mem = rec.member_on(member)
                gpus = [
                    {"index": i, "uuid": f"SIM-{member}-{i}", "type": "", "brand": "nvidia"}
                    for i in (mem.gpu_indices if mem else ())
                ]
                started.append((jid, member, args["attempts"].get(jid, rec.attempt), gpus))
            answer = jsonl.encode(
                {"id": dispatch_lines[0], "ok": True, "result": {"started": list(args["jobs"])}}
            )
            return jsonl.result(json.loads(answer))

        batcher = StartBatcher(peer_call)

        async def dispatch(job: Any, term: int) -> None:
            await asyncio.gather(
                *(batcher.start(node, job.job_id, term, job.attempt, 0) for node in job.nodes)
            )

        sched = Scheduler(
            jobs,
            host.replicate,
            dispatch,
            term=lambda: int(store.status().get("term") or 0),
            aging_per_hour=o.priority_aging,
            drains=drains,
            members=lambda: rt.members.members,
            own_name=SCHEDULER,
            state_current=lambda: True,
            grace=min(o.cluster_lost_after, SETTLE_MAX),
            lost_after=o.cluster_lost_after,
            lease=lease_seconds(o.cluster_lost_after, o.cluster_fence_grace),
            takeover_wait=LEADER_FALLBACK,
        )
        host.scheduler = sched
        # Running, as on the leader, but its passes are the recording's: the loop that
        # would time them itself is not started (the scheduler has no other way to
        # run a pass on demand while it counts as running).
        sched.started_at = sched.clock()
        sched.lease_started = sched.lease_clock()
        sched.rebuild()
        sched._task = loop.create_future()  # type: ignore[assignment]

        d = Dispatcher()
        job_api.register(d, host)
        cluster_api.register(d, rt)
        d.use(cluster_api.leader_forwarding(rt, host))

        async def no_start(job: Any, term: int, port: int) -> None:
            raise RuntimeError("the scheduler runs no jobs in the replay")

        cluster_api.register_relayed(d, jobs, no_start, lambda: 0)
        d.started()

        channels: dict[str, Channel] = {}
        serving = []
        for m in members:
            ch = channels[m["name"]] = Channel(loop)
            caller = Caller(f"mtgpu-peer.{m['name']}", 0, True, "peer")
            serving.append(loop.create_task(serve_lines(ch.reader, ch, d, caller)))

        # ---------------------------------------------------------------- the events
        kinds = ("report", "submit", "pass", "start", "end")
        cpu = {k: 0.0 for k in kinds}
        scaled = {k: 0.0 for k in kinds}  # CPU at the reference speed (Calibration)
        system = {k: 0.0 for k in kinds}  # of cpu, in the kernel
        cal = Calibration()
        cal_cpu = 0.0
        for _ in range(CAL_WINDOW):
            cal.slice()
        each: dict[str, list[float]] = {k: [] for k in kinds}  # per event, measured window
        thread = {k: 0.0 for k in kinds}
        count = {k: 0 for k in kinds}
        warm_count = {k: 0 for k in kinds}
        refused: dict[str, int] = {}
        job_of: dict[int, tuple[str, int]] = {}  # submission -> (job id, tasks)
        deferred: list[str] = []  # tasks whose end came while they still waited
        placed = 0
        end_parts = 0

        async def apply_starts() -> None:
            batch = list(started)
            started.clear()
            await asyncio.gather(
                *(
                    store.call(jobs.started, jid, node, time.time(), att, gpus)
                    for jid, node, att, gpus in batch
                )
            )
            count["start"] += len(batch)

        async def end_tasks(ids: list[str]) -> int:
            calls = []
            for tid in ids:
                rec = jobs.record(tid)
                if rec is None:
                    continue
                if rec.state == PENDING:
                    deferred.append(tid)
                    continue
                if rec.state != RUNNING:
                    continue
                for node in rec.nodes:
                    used = {
                        "signal": None,
                        "cpu_user": 61.5,
                        "cpu_system": 2.25,
                        "max_rss": 2 << 30,
                        "memory_peak": 3 << 30,
                    }
                    calls.append(
                        store.call(
                            jobs.part_ended,
                            tid,
                            node,
                            rec.term or 0,
                            "COMPLETED",
                            0,
                            "",
                            time.time(),
                            rec.attempt,
                            used,
                        )
                    )
            await asyncio.gather(*calls)
            return len(calls)

        def ids_of(n: int) -> list[str]:
            jid, tasks = job_of[n]
            return [jid] if tasks == 1 else [f"{jid}_{i}" for i in range(tasks)]

        measured = False
        total0 = thread0 = wall0 = 0.0
        replayed = 0
        for head, line in events:
            if not measured and head["t"] >= 0:
                measured = True
                warm_count = dict(count)
                cal.slices.clear()
                cal_cpu = 0.0
                for k in kinds:
                    cpu[k] = thread[k] = scaled[k] = system[k] = 0.0
                    count[k] = 0
                placed = end_parts = 0
                total0, thread0, wall0 = _cpu(), time.thread_time(), time.perf_counter()
            kind = head["k"]
            if kind == "pass":
                c0 = _cpu()
                cal.slice()
                cal_cpu += _cpu() - c0
            speed = cal.factor()
            c0, th0, s0 = _cpu(), time.thread_time(), _sys()
            if kind == "report":
                ans = await channels[head["m"]].ask(line or b"")
                if not ans.get("ok"):
                    refused[ans.get("code", "?")] = refused.get(ans.get("code", "?"), 0) + 1
            elif kind == "submit":
                ans = await channels[head["m"]].ask(line or b"")
                if ans.get("ok"):
                    job_of[head["n"]] = (ans["result"]["job_id"], head["tasks"])
                else:
                    refused[ans.get("code", "?")] = refused.get(ans.get("code", "?"), 0) + 1
            elif kind == "pass":
                placed += await sched.run_pass(wait=True)
            elif kind == "end":
                if head["n"] in job_of:
                    end_parts += await end_tasks(ids_of(head["n"]))
            else:
                raise ValueError(f"unknown event {kind!r}")
            took = _cpu() - c0
            cpu[kind] += took
            scaled[kind] += took * speed
            system[kind] += _sys() - s0
            if measured:
                each[kind].append(took)
            thread[kind] += time.thread_time() - th0
            count[kind] += 1
            replayed += 1
            if started:  # the members record the parts the pass started
                c0, th0, s0 = _cpu(), time.thread_time(), _sys()
                await apply_starts()
                system["start"] += _sys() - s0
                cpu["start"] += _cpu() - c0
                scaled["start"] += (_cpu() - c0) * speed
                thread["start"] += time.thread_time() - th0
            if deferred and kind == "pass":  # ends that came before their job was placed
                again, deferred[:] = list(deferred), []
                c0, th0, s0 = _cpu(), time.thread_time(), _sys()
                end_parts += await end_tasks(again)
                system["end"] += _sys() - s0
                cpu["end"] += _cpu() - c0
                scaled["end"] += (_cpu() - c0) * speed
                thread["end"] += time.thread_time() - th0
        total = _cpu() - total0
        total_thread = time.thread_time() - thread0
        wall = time.perf_counter() - wall0
        for t in serving:
            t.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        await batcher.close()
        return {
            "recording": {
                **{k: header[k] for k in ("members", "seconds", "warmup", "rate", "interval", "seed")},
                "sha256": digest,
            },
            "events": len(events),
            "replayed": replayed,
            "warmup_events": warm_count,
            "counts": count,
            "placed": placed,
            "parts_ended": end_parts,
            "ends_left_pending": len(deferred),
            "refused": refused,
            "jobs": len(jobs.jobs),
            "dispatch_requests": dispatch_lines[0],
            "cpu_s": {k: round(v, 4) for k, v in cpu.items()},
            "scaled_cpu_s": {k: round(v, 4) for k, v in scaled.items()},
            "system_cpu_s": {k: round(v, 4) for k, v in system.items()},
            "calibration": {
                "slices": len(cal.slices),
                "cpu_s": round(cal_cpu, 4),
                "slice_ms": _spread(cal.slices) if cal.slices else {},
            },
            # Per event (the process's CPU, ms): the median and the mean of the events
            # below the 95th percentile (GC, a preemption's cold caches: the noise).
            "event_ms": {k: _spread(v) for k, v in each.items() if v},
            "loop_thread_s": {k: round(v, 4) for k, v in thread.items()},
            "total_cpu_s": round(total, 3),
            "total_loop_thread_s": round(total_thread, 3),
            "unattributed_cpu_s": round(total - sum(cpu.values()) - cal_cpu, 4),
            "wall_s": round(wall, 2),
        }
    finally:
        store.close()


def _spread(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    cut = v[: max(1, int(len(v) * 0.95))]
    return {
        "median": round(v[len(v) // 2] * 1e3, 4),
        "p95": round(v[min(len(v) - 1, int(len(v) * 0.95))] * 1e3, 4),
        "mean_below_p95": round(sum(cut) / len(cut) * 1e3, 4),
        "mean": round(sum(v) / len(v) * 1e3, 4),
    }


def figures(r: dict[str, Any], key: str = "cpu_s") -> dict[str, float]:
    """CPU-seconds per 1,000 reports, per 1,000 submissions, per pass, per 1,000 parts."""
    c, n = r[key], r["counts"]

    def per(k: str, unit: int) -> float:
        return round(c[k] / n[k] * unit, 4) if n[k] else float("nan")

    return {
        "per_1000_reports": per("report", 1000),
        "per_1000_submissions": per("submit", 1000),
        "per_pass": per("pass", 1),
        "per_1000_starts": per("start", 1000),
        "per_1000_end_events": per("end", 1000),
    }


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return f"{cpu or platform.processor()}, {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured traffic (recording seconds)")
    ap.add_argument("--warmup", type=float, default=15.0, help="traffic replayed before the measurement")
    ap.add_argument("--rate", type=float, default=20.0, help="submissions a second")
    ap.add_argument("--interval", type=float, default=5.0, help="a member's report interval (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--recording", help="the recording (gzip'd JSON lines): made if missing, else replayed as it is"
    )
    ap.add_argument("--record-only", action="store_true", help="write the recording and stop")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    ap.add_argument("--cpu", type=int, help="the CPU to pin to (default: the last one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("mtgpu").setLevel(logging.WARNING)

    tmp = tempfile.mkdtemp(prefix="mtgpu-replay-")
    try:
        path = Path(args.recording) if args.recording else Path(tmp) / "recording.jsonl.gz"
        made = None
        if not path.exists():
            t0 = time.perf_counter()
            made = record(args, path)
            made["seconds"] = round(time.perf_counter() - t0, 2)
            if not args.json:
                print(
                    f"# recorded {made['lines']} lines, {made['bytes'] / 2**20:.1f} MiB in {made['seconds']} s: {path}",
                    file=sys.stderr,
                )
        if args.record_only:
            return 0
        pinned = None
        every = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        if not args.no_pin and every:
            # One CPU for every thread (the loop, PySyncObj's tick, the parsers): the
            # GIL passes between threads on one CPU, not across two.
            pinned = args.cpu if args.cpu is not None else max(every)
            os.sched_setaffinity(0, {pinned})
        t0 = time.perf_counter()
        try:
            r = asyncio.run(replay(path, str(Path(tmp) / "state")))
        finally:
            if pinned is not None:
                os.sched_setaffinity(0, every)
        r["pinned_cpu"] = pinned
        r["run_wall_s"] = round(time.perf_counter() - t0, 2)
        r["figures"] = figures(r)
        r["scaled_figures"] = figures(r, "scaled_cpu_s")
        r["machine"] = machine()
        if made is not None:
            r["recorded"] = made
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        f, n, sc = r["figures"], r["counts"], r["scaled_figures"]
        print(
            f"replay {r['recording']['members']} members, {r['recording']['seconds']:g} s "
            f"[{r['recording']['sha256']}], CPU-s (scaled): {n['report']} reports "
            f"{f['per_1000_reports']:.3f} ({sc['per_1000_reports']:.3f})/1000, "
            f"{n['submit']} submissions {f['per_1000_submissions']:.3f} ({sc['per_1000_submissions']:.3f})/1000, "
            f"{n['pass']} passes {f['per_pass'] * 1e3:.2f} ({sc['per_pass'] * 1e3:.2f}) ms each "
            f"({r['placed']} placed), {n['start']} starts {f['per_1000_starts']:.3f}/1000, "
            f"{r['parts_ended']} part ends in {n['end']} events {f['per_1000_end_events']:.3f}/1000; "
            f"total {r['total_cpu_s']:.2f} CPU-s ({r['unattributed_cpu_s']:+.3f} between events), "
            f"calibration slice median {r['calibration']['slice_ms'].get('median', 0):.3f} ms; "
            f"replay {r['wall_s']:.1f} s wall, whole run {r['run_wall_s']:.1f} s; {r['machine']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
