#!/usr/bin/env python3
"""One scheduler, up to a thousand members and thousands of tenants: a simulated load test.

Three real ``mtgpu-server`` voters (one of them the scheduler), each in a network
namespace of its own, plus N simulated members. A simulated member runs the member
code of a real one:

- its own cluster identity: its own Ed25519 host key, signed by the cluster's host CA,
  and its own peer certificate, both derived from ``CLUSTER_KEY`` as a member's are;
- its own SSH server (``mtgpu.sshd.server.start_ssh_server``, peers only), which the
  scheduler dials to dispatch jobs (``job.dispatch``), and its own ``PeerClient``
  connection to the scheduler;
- it joins through ``cluster.join`` (recorded in the replicated member list);
- the real ``Sampler`` with ``SIMULATED_GPUS`` measures it, and the real
  ``ClusterRuntime._report_loop`` sends ``node.report`` every
  ``USAGE_SAMPLE_INTERVAL`` (5 s);
- the real ``Agent`` starts its parts of placed jobs and records starts and ends
  through the replicated log; only the job runner is swapped for a short sleep.

Many simulated members share a worker process (one asyncio loop each; ``--workers``,
2 by default), and the members of one worker share one read-only replica of the
journal (a real PySyncObj read-only member over the SSH transport) instead of
holding one each: the scheduler therefore feeds ``--workers`` read-only replicas, not
N. The agent's fallback poll runs every 2 s instead of 0.2 s (ends arrive through the
runner's end notices, as on a real member).

Tenants (5,000 by default, ``user.add`` through the admin socket) submit through the
simulated members, which relay to the scheduler as any member does (``forward``):
a steady rate of mixed jobs (exclusive, shared and overcommitted GPUs, 1 or 2 GPUs,
CPU-only, arrays of 8 and ``nodes=4`` jobs), then a burst (one array of
``--burst`` tasks). Measured at each size in ``--members`` (the cluster grows from
one size to the next):

- the scheduler's CPU (% of one core, over the steady window) and peak RSS (VmHWM);
- the generator's CPU (the workers and this process) beside it;
- submit->placed and submit->running p50/p99 (sent by the tenant's member -> the
  job record's placed and start times);
- placements per second in the steady window, and jobs started per second in the burst;
- heartbeat lag: a ``node.report``'s round trip, sent -> applied and answered;

and, at the largest size, the time from ``kill -9`` of the scheduler to a new one
and to the first job submitted afterwards running (``--kills N``: N times, the
killed voter restarted between kills; p50, p99 and max). The simulated members see
the new scheduler through their replica and report to it at once, as real ones do
(the real report loop); each holds a connection to every voter (a real member's
replica does), and a tenant's submission is relayed as a member relays it
(``mtgpu.cluster.relay``, with its key).

Run as root from the repository root (about 6 minutes for the defaults):

    /opt/mtgpu-test/bin/python benchmarks/cluster_load.py [--members 100,300,1000]
        [--tenants 5000] [--rate 20] [--steady 20] [--burst 1000] [--workers 2] [--kills 1]
        [--json]

Timings are printed with the machine they ran on; nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

KEY = "load-benchmark-cluster-key-0123456789"
CLUSTER = "load"
#: GPU kinds of the simulated members, by member number.
KINDS = [("a100", "80G"), ("h100", "80G"), ("l40s", "48G"), ("rtx4090", "24G")]
#: (share of submissions, directives); the body is irrelevant: the runner sleeps.
MIX = [
    (0.40, "gpus=1"),
    (0.15, "gpus=2"),
    (0.20, "gpus=1 vram=8G"),
    (0.05, "gpus=1 gpu_mode=overcommit vram=4G"),
    (0.10, "cpus=2 ram=4G"),
    (0.05, "gpus=1 vram=4G array=0-7"),
    (0.05, "nodes=4 gpus=1"),
]
#: How long a simulated job runs (seconds, uniform).
JOB_SECONDS = (5.0, 15.0)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# =================================================================== the worker


class SleepRunner:
    """The job runner of a simulated member: each part sleeps, then completes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from mtgpu.schedd.runner import FinalState, JobResult

        self._final, self._result = FinalState, JobResult
        self.loop = loop
        self.launches: dict[str, Any] = {}
        self.results: dict[str, Any] = {}
        self._read, self._write = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._read.setblocking(False)
        self._write.setblocking(False)

    def start(self, launch: Any) -> None:
        from mtgpu.schedd.runner import JobAlreadyStarted

        if launch.job_id in self.launches:
            raise JobAlreadyStarted(f"job {launch.job_id} already runs here")
        self.launches[launch.job_id] = (launch, time.time())
        self.loop.call_soon_threadsafe(
            self.loop.call_later,
            random.uniform(*JOB_SECONDS),
            self._end,
            launch.job_id,
            self._final.COMPLETED,
        )

    def _end(self, job_id: str, state: Any) -> None:
        got = self.launches.get(job_id)
        if got is None or job_id in self.results:
            return
        launch, began = got
        self.results[job_id] = self._result(
            job_id,
            state,
            0 if state == self._final.COMPLETED else None,
            start_time=began,
            end_time=time.time(),
            term=launch.term,
            attempt=launch.attempt,
        )
        try:
            self._write.send(job_id.encode())
        except OSError:
            pass  # the agent's poll finds it

    def running(self) -> list[str]:
        return [j for j in self.launches if j not in self.results]

    def result(self, job_id: str) -> Any:
        return self.results.get(job_id)

    def poll(self, only: Any = None) -> list[Any]:
        return [r for j, r in list(self.results.items()) if only is None or j in only]

    def ack(self, job_id: str, attempt: int | None = None) -> None:
        got = self.results.get(job_id)
        if got is not None and (attempt is None or got.attempt == attempt):
            self.results.pop(job_id, None)
            self.launches.pop(job_id, None)

    def listen_ends(self) -> socket.socket:
        return self._read

    def cancel(self, job_id: str, grace: float = 10.0, attempt: int | None = None) -> bool:
        if job_id not in self.launches or job_id in self.results:
            return False
        if attempt is not None and self.launch_run(job_id)[1] != attempt:
            return False
        self.loop.call_soon_threadsafe(self._end, job_id, self._final.CANCELLED)
        return True

    def start_interrupted(self, job_id: str, wait: float = 10.0) -> bool:
        return False  # a simulated start is never cut short

    def launch_run(self, job_id: str) -> tuple[int, int]:
        launch = self.launches[job_id][0]
        return launch.term, launch.attempt

    def job_dir(self, job_id: str) -> Path:
        return Path("/nonexistent") / job_id

    def remove(self, job_id: str) -> None:
        pass


class SimMember:
    """One simulated member: identity, SSH server, peer link, sampler, reports, agent."""

    def __init__(self, worker: Worker, index: int) -> None:
        from mtgpu.config.options import SimulatedGpuSpec, replace

        self.worker = worker
        self.name = f"sim{index:04d}"
        kind, vram = KINDS[index % len(KINDS)]
        from mtgpu.config import parse_size

        state = Path(worker.root) / self.name
        state.mkdir(parents=True, exist_ok=True)
        self.options = replace(
            worker.base,
            server_name=self.name,
            state_dir=str(state),
            run_dir=str(state),
            ssh_listen=(worker.address, 0),
            simulated_gpus=(SimulatedGpuSpec(type=kind, count=8, vram=parse_size(vram)),),
        )
        self.report_rtts: list[tuple[float, float]] = []

    async def start(self) -> None:
        from mtgpu.api.dispatcher import Dispatcher
        from mtgpu.api.jobs import dispatch_op, rendezvous_op
        from mtgpu.cluster.runtime import ClusterRuntime
        from mtgpu.config.options import replace
        from mtgpu.gpuinfo.sampler import Sampler
        from mtgpu.schedd.agent import Agent
        from mtgpu.schedd.jobenv import JobUser
        from mtgpu.sshd.limits import Penalties
        from mtgpu.sshd.server import start_ssh_server

        w = self.worker
        self.identity = w.identity
        self.dispatcher = Dispatcher()
        # Its own SSH server first, on a port the kernel picks: the address it joins with.
        # Kept across join attempts: a join that timed out here may have been recorded
        # with this address, and the scheduler dials what it recorded.
        if getattr(self, "server", None) is None:
            self.penalties = Penalties(self.options.ssh_penalty_failures, self.options.ssh_penalty_seconds)
            self.server = await start_ssh_server(self, None)
        port = self.server.sockets[0].getsockname()[1]
        o = self.options = replace(
            self.options, ssh_listen=(w.address, port), cluster_advertise=f"{w.address}:{port}"
        )
        self.sampler = Sampler(o)
        self.last_inv = self.sample()
        self.runtime = ClusterRuntime(o, w.identity, lambda: self.last_inv)
        self.runtime.leader = w.leader  # type: ignore[method-assign]
        self.runtime.addresses.update(w.voter_addresses)
        self.peers = self.runtime.peers
        call = self.peers.call

        async def timed_call(target: str, op: str, /, **kw: Any) -> Any:
            t0 = time.perf_counter()
            r = await call(target, op, **kw)
            if op == "node.report":
                self.report_rtts.append((time.time(), time.perf_counter() - t0))
            return r

        self.peers.call = timed_call  # type: ignore[method-assign]

        async def user_for(name: str, uid: int) -> JobUser:
            return JobUser(name, uid, uid, "/tmp", "/bin/sh")

        self.agent = Agent(
            self.name,
            w.jobs,
            SleepRunner(asyncio.get_running_loop()),
            self.sampler,
            w.replicate,
            user_for,
            address=w.address,
        )

        # As the daemon's: the job from the replica, then the agent.
        self.dispatcher.register("job.dispatch", dispatch_op(w.jobs, self.agent.dispatch))
        self.dispatcher.register("job.rendezvous", rendezvous_op(self.agent.rendezvous_port))
        try:
            await self.peers.call(
                w.leader() or "m1",
                "cluster.join",
                name=self.name,
                address=o.cluster_advertise,
                score=1.0,
                timeout=60,
            )
        except Exception:
            self.peers.close()
            raise
        self.agent.start()
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._sample_loop()),
            loop.create_task(self.runtime._report_loop()),
            loop.create_task(self._hold_voters()),
        ]

    async def _hold_voters(self) -> None:
        """Keep a connection to every voter, as a real member's replica does (it dials
        each voter for its read-only Raft channel, on this same peer client): so a new
        scheduler is already connected to, not dialed by every member at once."""
        await asyncio.sleep(random.uniform(0, 2.0))
        while True:
            for voter in self.worker.voter_addresses:
                try:
                    await self.peers.connection(voter)
                except Exception:  # noqa: BLE001 - a dead voter: dialed again next round
                    pass
            await asyncio.sleep(1.0)

    async def peer_session(self, process: Any, name: str) -> None:
        """A channel from another member: only ``mtgpu-peer`` (the scheduler's calls)."""
        from mtgpu.api.dispatcher import Caller
        from mtgpu.api.unix import serve_lines

        if process.subsystem == "mtgpu-peer":
            await serve_lines(
                process.stdin, process.stdout, self.dispatcher, Caller(f"mtgpu-peer.{name}", 0, True, "peer")
            )
        else:
            process.exit(1)

    def sample(self) -> Any:
        import dataclasses

        inv = self.sampler.sample()
        return dataclasses.replace(inv, host=dataclasses.replace(inv.host, cpus=64))

    async def _sample_loop(self) -> None:
        await asyncio.sleep(random.uniform(0, self.options.usage_sample_interval))
        while True:
            self.last_inv = self.sample()
            await asyncio.sleep(self.options.usage_sample_interval)


class Worker:
    """A process holding many simulated members, driven by JSON lines on stdin."""

    def __init__(self, setup: dict[str, Any]) -> None:
        from mtgpu.cluster.identity import ClusterIdentity
        from mtgpu.config import load_text

        self.setup = setup
        self.root = setup["root"]
        self.address = setup["address"]
        self.voter_addresses: dict[str, str] = setup["voters"]
        self.base = load_text(json.dumps(setup["config"]))
        self.identity = ClusterIdentity.derive(CLUSTER, KEY)
        self.members: list[SimMember] = []
        self.tenants: list[list[Any]] = json.loads(Path(setup["tenants"]).read_text())
        self.submitted: dict[str, float] = {}  # job id -> sent (epoch)
        self.store: Any = None

    # ------------------------------------------------------------- the replica

    async def open_replica(self) -> None:
        """One read-only replica of the journal for this worker's members."""
        from mtgpu.accounts.registry import Registry
        from mtgpu.cluster.members import Members
        from mtgpu.cluster.peers import PeerClient
        from mtgpu.cluster.transport import SshRaftTransport
        from mtgpu.schedd.drains import Drains
        from mtgpu.schedd.jobtable import JobTable
        from mtgpu.state.audit import AuditLog
        from mtgpu.state.store import StateStore

        name = f"replica{self.setup['worker']}"
        state = Path(self.root) / name
        state.mkdir(parents=True, exist_ok=True)
        from mtgpu.sshd.server import ensure_host_keys

        ensure_host_keys(str(state))
        self.replica_peers = PeerClient(self.identity, name, str(state), self.voter_addresses.get)
        self.jobs = JobTable()
        self.member_list = Members()
        consumers = [Registry(self.base.tenant_uid_range), self.jobs, Drains(), AuditLog(), self.member_list]
        transport = SshRaftTransport(
            asyncio.get_running_loop(), name, self.replica_peers.open_raft, readonly=True
        )
        self.store = StateStore(
            None, consumers, str(state), peers=list(self.voter_addresses), transport_factory=transport.attach
        )
        await self.store.wait_ready(timeout=120)

    async def replicate(self, method: Any, *args: Any, timeout: float = 30.0) -> Any:
        return await self.store.call(method, *args, timeout=timeout)

    def leader(self) -> str | None:
        leader = self.store.sync._getLeader() if self.store is not None else None
        return getattr(leader, "id", None)

    # --------------------------------------------------------------- commands

    async def add(self, indices: list[int]) -> dict[str, Any]:
        gate = asyncio.Semaphore(16)
        t0 = time.perf_counter()
        errors: list[str] = []

        async def one(i: int) -> None:
            async with gate:
                m = SimMember(self, i)
                for attempt in range(5):
                    try:
                        await m.start()
                        self.members.append(m)
                        return
                    except Exception as exc:  # noqa: BLE001 - retried, then reported
                        if attempt == 0:
                            first = f"{type(exc).__name__}: {exc}"
                        if attempt == 4:
                            errors.append(f"{m.name}: {exc} (first: {first})")
                        await asyncio.sleep(1)

        await asyncio.gather(*(one(i) for i in indices))
        return {"members": len(self.members), "seconds": time.perf_counter() - t0, "errors": errors[:5]}

    async def _submit(self, script: str, errors: list[str] | None = None) -> str | None:
        """One tenant's submission with its key, relayed by a random member as a
        member's ``forward`` relays it (following the leader through a failover)."""
        import secrets

        from mtgpu.cluster.relay import relay

        member = random.choice(self.members)
        name, uid = random.choice(self.tenants)
        sent = time.time()
        try:
            r = await relay(
                member.peers,
                self.leader,
                "job.submit",
                {"script": script, "workdir": "/tmp", "token": secrets.token_hex(16)},
                {"name": name, "uid": uid, "admin": False},
            )
        except Exception as exc:  # noqa: BLE001 - counted as lost
            if errors is not None:
                errors.append(f"{time.time() - sent:.2f} s to {self.leader()}: {type(exc).__name__}: {exc}")
            return None
        self.submitted[r["job_id"]] = sent
        return r["job_id"]

    async def steady(self, rate: float, seconds: float) -> dict[str, Any]:
        """Submit ``rate`` jobs a second (per this worker) for ``seconds``."""
        self.submitted = {}
        for m in self.members:
            m.report_rtts = []
        t0 = time.monotonic()
        tasks = []
        k = 0
        weights = [w for w, _ in MIX]
        while (now := time.monotonic()) - t0 < seconds:
            due = int((now - t0) * rate)
            while k < due:
                d = random.choices(MIX, weights)[0][1]
                tasks.append(
                    asyncio.ensure_future(
                        self._submit(f"#!/bin/bash\n#MTGPU {d} cpus=2 ram=4G time=10m\nsleep 10\n")
                    )
                )
                k += 1
            await asyncio.sleep(0.01)
        ids = await asyncio.gather(*tasks)
        return {"submitted": len(ids), "failed": sum(i is None for i in ids)}

    def _tasks(
        self, job_id: str, arrays: dict[str, list[dict[str, Any]]] | None = None
    ) -> list[dict[str, Any]]:
        j = self.jobs.get(job_id)
        if j is not None:
            return [j]
        if arrays is not None:
            return arrays.get(job_id, [])
        return self.jobs.tasks_of(job_id)

    def _arrays(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for j in list(self.jobs.jobs.values()):
            if j.get("array_id"):
                out.setdefault(j["array_id"], []).append(j)
        return out

    async def stats(self, wait: float) -> dict[str, Any]:
        """Latencies of the last steady window's jobs (waiting for them to start)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            arrays = self._arrays()
            if all(t.get("start_time") for jid in self.submitted for t in self._tasks(jid, arrays)):
                break
            await asyncio.sleep(0.25)
        placed, running, placed_at, unstarted = [], [], [], 0
        arrays = self._arrays()
        for jid, sent in self.submitted.items():
            for t in self._tasks(jid, arrays):
                if t.get("placed_time"):
                    placed.append(t["placed_time"] - sent)
                    placed_at.append(t["placed_time"])
                if t.get("start_time"):
                    running.append(t["start_time"] - sent)
                else:
                    unstarted += 1
        rtts = [r for m in self.members for _, r in m.report_rtts]
        return {
            "placed": placed,
            "running": running,
            "placed_at": placed_at,
            "unstarted": unstarted,
            "reports": rtts,
        }

    async def burst(self, n: int, wait: float) -> dict[str, Any]:
        self.submitted = {}
        jid = None
        while jid is None:
            jid = await self._submit(
                f"#!/bin/bash\n#MTGPU array=0-{n - 1} gpus=1 vram=2G cpus=1 ram=1G time=10m\nsleep 10\n"
            )
        sent = self.submitted[jid]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            tasks = self._tasks(jid)
            if len(tasks) >= n and all(t.get("start_time") for t in tasks):
                break
            await asyncio.sleep(0.1)
        tasks = self._tasks(jid)
        starts = sorted(t["start_time"] for t in tasks if t.get("start_time"))
        placed = sorted(t["placed_time"] for t in tasks if t.get("placed_time"))
        return {"sent": sent, "starts": starts, "placed": placed}

    async def probe(self, wait: float) -> dict[str, Any]:
        """Submit a job every 0.25 s until one runs: the time from this call to then."""
        t0 = time.time()
        ids: list[str] = []
        accepted: float | None = None  # the first submission acknowledged
        errors: list[tuple[float, str]] = []  # (sent after the kill, why it failed)
        pending: list[tuple[float, asyncio.Future[str | None], list[str]]] = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            why: list[str] = []
            script = "#!/bin/bash\n#MTGPU gpus=1\nsleep 1\n"
            pending.append((time.time() - t0, asyncio.ensure_future(self._submit(script, why)), why))
            await asyncio.sleep(0.25)
            # A submission answered later than the next one is sent still counts.
            for item in [p for p in pending if p[1].done()]:
                pending.remove(item)
                sent_after, task, why = item
                if task.result():
                    ids.append(task.result())
                    if accepted is None:
                        accepted = time.time() - t0
                else:
                    errors.append((round(sent_after, 2), "; ".join(why)))
            for jid in ids:
                j = self.jobs.get(jid)
                if j is not None and j.get("start_time"):
                    return {
                        "running_after": j["start_time"] - t0,
                        "accepted_after": accepted,
                        "placed_after": (j.get("placed_time") or t0) - t0,
                        "submitted_after": self.submitted[jid] - t0,
                        "refused": len(errors),
                        "refusals": errors[:3] + errors[-3:] if len(errors) > 6 else errors,
                    }
        states = [(self.jobs.get(jid) or {}).get("state", "not in the replica") for jid in ids[-5:]]
        return {
            "running_after": None,
            "accepted": len(ids),
            "refused": len(errors),
            "refusals": errors[:3] + errors[-3:] if len(errors) > 6 else errors,
            "last_states": states,
            "replica_leader": self.leader(),
        }

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        await self.open_replica()
        print(json.dumps({"ready": True}), flush=True)
        while line := await reader.readline():
            cmd = json.loads(line)
            op = cmd.pop("cmd")
            if op == "quit":
                break
            out = await getattr(self, op)(**cmd)
            print(json.dumps(out), flush=True)


def worker_main(setup_path: str) -> int:
    import logging

    import mtgpu.schedd.agent as agent_module

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Ends come through the runner's notices; the fallback poll of every member's
    # agent (0.2 s) would cost the generator more than the members' real work.
    agent_module.POLL_INTERVAL = 2.0
    setup = json.loads(Path(setup_path).read_text())
    asyncio.run(Worker(setup).serve())
    return 0


# =================================================================== the driver


def leader_of(hosts: list[Any]) -> str | None:
    from mtgpu_testing import agreed_scheduler

    return agreed_scheduler(hosts, timeout=30)


def register_tenants(host: Any, n: int, path: Path) -> float:
    """``user.add`` ``n`` tenants through the admin socket, 8 connections at once."""
    import asyncssh

    keys = [
        asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip() for _ in range(n)
    ]
    out: list[list[Any]] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def work(part: range) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(host.run_dir / "api.sock"))
        f = s.makefile("rb")
        for i in part:
            req = {"op": "user.add", "args": {"name": f"t{i:05d}", "keys": [keys[i]]}, "id": i}
            s.sendall(json.dumps(req).encode() + b"\n")
            ans = json.loads(f.readline())
            if not ans.get("ok"):
                raise RuntimeError(f"user.add t{i:05d}: {ans}")
            with lock:
                out.append([ans["result"]["name"], ans["result"]["uid"]])
        s.close()

    failed: list[BaseException] = []

    def guarded(part: range) -> None:
        try:
            work(part)
        except BaseException as exc:  # noqa: BLE001 - reported below, and the run stops
            failed.append(exc)

    threads = [threading.Thread(target=guarded, args=(range(k, n, 8),)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if failed:
        raise RuntimeError(f"{len(failed)} of 8 registration connections failed; the first: {failed[0]}")
    path.write_text(json.dumps(out))
    return time.perf_counter() - t0


class WorkerProc:
    def __init__(self, k: int, setup: dict[str, Any], root: Path) -> None:
        path = root / f"worker{k}.json"
        path.write_text(json.dumps({**setup, "worker": k}))
        from mtgpu_testing import python_env

        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(root / f"worker{k}.log", "ab"),  # noqa: SIM115
            env=python_env(),
            text=True,
        )
        assert json.loads(self.proc.stdout.readline()).get("ready")  # type: ignore[union-attr]

    def send(self, cmd: str, **args: Any) -> None:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def answer(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("a worker died; see its log")
        return json.loads(line)


def all_do(
    workers: list[WorkerProc], cmd: str, per: list[dict[str, Any]] | None = None, **args: Any
) -> list[dict[str, Any]]:
    for k, w in enumerate(workers):
        w.send(cmd, **(per[k] if per else args))
    return [w.answer() for w in workers]


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def system_seconds(pid: int) -> float:
    """The CPU time ``pid`` spent in the kernel (its system calls: sends, fsyncs)."""
    import psutil

    try:
        return float(psutil.Process(pid).cpu_times().system)
    except psutil.Error:
        return 0.0


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def server_pid(host: Any) -> int:
    import psutil

    # Host.proc is nsenter/unshare/sh; the daemon is the python process below it.
    for child in psutil.Process(host.proc.pid).children(recursive=True):
        if "mtgpu.server" in " ".join(child.cmdline()):
            return child.pid
    return host.proc.pid


def current_leader(hosts: list[Any]) -> Any:
    while (name := leader_of(hosts)) is None:
        time.sleep(0.2)
    return next(h for h in hosts if h.config["SERVER_NAME"] == name)


def measure(
    workers: list[WorkerProc], hosts: list[Any], members: int, args: argparse.Namespace
) -> dict[str, Any]:
    gen = [w.proc.pid for w in workers] + [os.getpid()]
    time.sleep(2 * 5 + 1)  # two report rounds at the new size
    leader = current_leader(hosts)
    leader_pid = server_pid(leader)

    def spy(part: str) -> subprocess.Popen[bytes] | None:
        # The scheduler's stacks over one part of the run (py-spy, raw), when asked.
        if not args.profile:
            return None
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        return subprocess.Popen(
            [
                exe,
                "record",
                "-p",
                str(leader_pid),
                "-r",
                "50",
                "-f",
                "raw",
                *(["--gil"] if args.profile_gil else []),
                "-o",
                str(Path(args.profile) / f"scheduler-{members}-{part}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(p: subprocess.Popen[bytes] | None) -> None:
        if p is not None:
            p.send_signal(signal.SIGINT)
            p.wait(30)

    spying = spy("steady")
    c0, g0, w0 = cpu_seconds([leader_pid]), cpu_seconds(gen), time.monotonic()
    k0 = system_seconds(leader_pid)
    per = args.rate / len(workers)
    t_start = time.time()
    sent = all_do(workers, "steady", rate=per, seconds=args.steady)
    moved = current_leader(hosts) is not leader
    c1, g1, w1 = cpu_seconds([leader_pid]), cpu_seconds(gen), time.monotonic()
    k1 = system_seconds(leader_pid)
    stop(spying)
    st = all_do(workers, "stats", wait=60.0)
    placed = [x for s in st for x in s["placed"]]
    running = [x for s in st for x in s["running"]]
    placed_at = [x for s in st for x in s["placed_at"] if x <= t_start + args.steady]
    reports = [x for s in st for x in s["reports"]]
    time.sleep(max(JOB_SECONDS) + 2)  # the steady jobs end: the burst has free capacity
    before_burst = current_leader(hosts)
    others = [server_pid(h) for h in hosts if h is not leader]
    spying = spy("burst")
    b0 = (
        cpu_seconds([leader_pid]),
        cpu_seconds(gen),
        cpu_seconds(others),
        time.monotonic(),
        [cpu_seconds([w.proc.pid]) for w in workers],
    )
    bursts = all_do(workers[:1], "burst", n=args.burst, wait=180.0)[0]
    b1 = (
        cpu_seconds([leader_pid]),
        cpu_seconds(gen),
        cpu_seconds(others),
        time.monotonic(),
        [cpu_seconds([w.proc.pid]) for w in workers],
    )
    stop(spying)
    burst_wall = b1[3] - b0[3]
    starts = bursts["starts"]
    steady = {k: sum(a[k] for a in sent) for k in ("submitted", "failed")}
    burst_rate = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else float("nan")
    return {
        "members": members,
        "scheduler_cpu_pct": 100 * (c1 - c0) / (w1 - w0),
        "scheduler_system_cpu_pct": 100 * (k1 - k0) / (w1 - w0),
        "generator_cpu_pct": 100 * (g1 - g0) / (w1 - w0),
        "scheduler_peak_rss_mib": peak_rss(leader_pid) / (1 << 20),
        "jobs": len(placed),
        "unstarted": sum(s["unstarted"] for s in st),
        "placed_p50_s": pct(placed, 50),
        "placed_p99_s": pct(placed, 99),
        "running_p50_s": pct(running, 50),
        "running_p99_s": pct(running, 99),
        "placements_per_s": len(placed_at) / args.steady,
        "burst_tasks_started": len(starts),
        "burst_started_per_s": burst_rate,
        "burst_all_running_s": (starts[-1] - bursts["sent"]) if starts else float("nan"),
        "burst_all_placed_s": (bursts["placed"][-1] - bursts["sent"]) if bursts["placed"] else float("nan"),
        "burst_first_running_s": (starts[0] - bursts["sent"]) if starts else float("nan"),
        # CPU over the burst call (submission to the last start seen, polled every 0.1 s).
        "burst_scheduler_cpu_pct": 100 * (b1[0] - b0[0]) / burst_wall,
        "burst_generator_cpu_pct": 100 * (b1[1] - b0[1]) / burst_wall,
        "burst_other_voters_cpu_pct": 100 * (b1[2] - b0[2]) / burst_wall,
        # Each worker process (one Python thread each: near 100 % it is the bottleneck).
        "burst_worker_cpu_pct": [100 * (y - x) / burst_wall for x, y in zip(b0[4], b1[4], strict=True)],
        "report_p50_ms": 1000 * pct(reports, 50),
        "report_p99_ms": 1000 * pct(reports, 99),
        "reports": len(reports),
        "submissions": steady["submitted"],
        "submissions_failed": steady["failed"],
        # The scheduler role moved during the steady window (its CPU is then partial).
        "scheduler_moved": moved,
        "scheduler_moved_in_burst": current_leader(hosts) is not before_burst,
    }


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", default="100,300,1000", help="simulated members, sizes in order")
    ap.add_argument("--tenants", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=20.0, help="submissions per second (steady)")
    ap.add_argument("--steady", type=float, default=20.0, help="seconds of steady submissions")
    ap.add_argument("--burst", type=int, default=1000, help="tasks in the burst array")
    ap.add_argument("--workers", type=int, default=2, help="processes for the simulated members")
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument(
        "--kills",
        type=int,
        default=1,
        help="kill -9 of the scheduler this many times at the largest size (the killed voter is "
        "restarted between kills)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="record the scheduler's stacks with py-spy into DIR; keep the logs there",
    )
    ap.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: sample only the thread holding the GIL (where Python computes; "
        "without it, threads waiting for the GIL or in a system call count too)",
    )
    args = ap.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)  # before py-spy writes there
    sizes = [int(x) for x in args.members.split(",")]

    # A SIGTERM (``timeout``) still stops the voters and removes the namespaces; a
    # second one (``pkill`` reaching ``timeout`` too, which passes it on) is ignored
    # so that it cannot cut that cleanup short.
    def _terminated(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, _terminated)
    from mtgpu_testing import Host, Network

    root = Path(tempfile.mkdtemp(prefix="mtgpu-load-", dir="/tmp"))
    net = Network()
    common = {
        "CLUSTER_MODE": "cluster",
        "CLUSTER_ID": CLUSTER,
        "CLUSTER_KEY": KEY,
        "SIMULATED_CPUS": 64,
        "SIMULATED_GPUS": [{"type": "a100", "count": 8, "vram": "80G"}],
        # Room for every tenant: the default range holds 10,000, and a range ends at
        # 33767 at most (each tenant's 65,536 subordinate IDs come from its UID).
        "TENANT_UID_RANGE": "20000-29999"
        if args.tenants < 9_000
        else f"{33767 - args.tenants - 1_000}-33767",
        "SSH_MAX_STARTUPS": 2000,
        # Every simulated member dials the voters from the one address of the workers.
        "SSH_MAX_CONNECTIONS_PER_SOURCE": 10000,
        "SSH_PENALTY_FAILURES": 100000,
    }
    hosts = [net.add(Host(dict(common), name=f"m{i}")) for i in range(1, 4)]
    for h in hosts:
        h.config["CLUSTER_PEERS"] = [f"{o.address}:{o.port}" for o in hosts if o is not h]
        h.write_config()
    workers: list[WorkerProc] = []
    rows: list[dict[str, Any]] = []
    failover: dict[str, Any] = {}
    try:
        threads = [threading.Thread(target=h.start, kwargs={"timeout": 120}) for h in hosts]
        [t.start() for t in threads]
        [t.join() for t in threads]
        if any(h.proc is None or h.proc.poll() is not None for h in hosts):
            raise RuntimeError("a member did not start; see the messages above")
        while (name := leader_of(hosts)) is None:
            time.sleep(0.2)
        leader = next(h for h in hosts if h.config["SERVER_NAME"] == name)
        secs = register_tenants(leader, args.tenants, root / "tenants.json")
        print(f"# {args.tenants} tenants registered in {secs:.1f} s", file=sys.stderr)
        setup = {
            "root": str(root),
            "address": f"10.213.{net.subnet}.1",
            "voters": {h.config["SERVER_NAME"]: f"{h.address}:{h.port}" for h in hosts},
            "tenants": str(root / "tenants.json"),
            "config": {k: v for k, v in common.items() if k != "SIMULATED_GPUS"}
            | {"CLUSTER_PEERS": [f"{h.address}:{h.port}" for h in hosts]},
        }
        workers = [WorkerProc(k, setup, root) for k in range(args.workers)]
        have = top = 0  # members joined; indices used
        for size in sizes:
            new, top = list(range(top, size)), size
            per = [{"indices": new[k :: len(workers)]} for k in range(len(workers))]
            t0 = time.perf_counter()
            got = all_do(workers, "add", per=per)
            print(
                f"# {size} members up in {time.perf_counter() - t0:.1f} s "
                f"({sum(g['members'] for g in got)} joined; {[g['errors'] for g in got]})",
                file=sys.stderr,
            )
            have = sum(g["members"] for g in got)
            row = measure(workers, hosts, size, args)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        if not args.no_failover:
            new_s: list[float] = []
            running_s: list[float | None] = []
            for k in range(args.kills):
                while (name := leader_of(hosts)) is None:
                    time.sleep(0.1)
                victim = next(h for h in hosts if h.config["SERVER_NAME"] == name)
                survivors = [h for h in hosts if h is not victim]
                t0 = time.time()
                victim.stop(signal.SIGKILL)
                workers[0].send("probe", wait=120.0)
                new = None
                while new is None or new == name:
                    time.sleep(0.05)
                    new = leader_of(survivors)
                new_s.append(time.time() - t0)
                got = workers[0].answer()
                running_s.append(got["running_after"])
                print(f"# kill {k + 1}: new scheduler {new_s[-1]:.2f} s, first job: {got}", file=sys.stderr)
                if k + 1 < args.kills:
                    rejoin(victim)
            failover["new_scheduler_s"] = new_s
            failover["first_job_running_s"] = running_s
            failover["members"] = have
        machine = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t")
        cores = os.cpu_count()
        if args.json:
            print(
                json.dumps(
                    {
                        "rows": rows,
                        "failover": failover,
                        "machine": machine,
                        "cores": cores,
                        "tenants": args.tenants,
                        "rate": args.rate,
                    },
                    indent=1,
                )
            )
        else:
            print_table(rows, failover, args, machine, cores)
        return 0
    finally:
        for w in workers:
            try:
                w.send("quit")
                w.proc.wait(10)
            except Exception:  # noqa: BLE001
                w.proc.kill()
        if args.profile:
            for h in hosts:
                shutil.copy(h.log_path, Path(args.profile) / f"{h.config['SERVER_NAME']}.log")
            for k in range(len(workers)):
                shutil.copy(root / f"worker{k}.log", Path(args.profile) / f"worker{k}.log")
        for h in hosts:
            h.cleanup()
        net.close()
        shutil.rmtree(root, ignore_errors=True)


def spread(values: list[float]) -> str:
    """One figure as it is; several as p50 / p99 / max."""
    if len(values) == 1:
        return f"{values[0]:.2f} s"
    return f"p50 {pct(values, 50):.2f} s, p99 {pct(values, 99):.2f} s, max {max(values):.2f} s"


def rejoin(victim: Any) -> None:
    """Start a killed voter again and wait until it is back in the cluster, with a
    scheduler elected and the members reporting to it."""
    victim.start(timeout=120)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = victim.api("cluster.status")
        if st.get("ok") and st["result"].get("scheduler"):
            voters = [m for m in st["result"]["members"] if m.get("role") in ("voter", "scheduler")]
            if len(voters) >= 3 and all(m["state"] == "up" for m in voters):
                break
        time.sleep(0.2)
    time.sleep(2)


def print_table(
    rows: list[dict[str, Any]],
    failover: dict[str, Any],
    args: argparse.Namespace,
    machine: str,
    cores: int | None,
) -> None:
    from tabulate import tabulate

    head = [
        "members",
        "sched CPU %",
        "gen CPU %",
        "sched RSS MiB",
        "jobs",
        "placed p50/p99 s",
        "running p50/p99 s",
        "placed/s",
        "burst started/s",
        "report p50/p99 ms",
    ]
    table = [
        [
            r["members"],
            f"{r['scheduler_cpu_pct']:.0f}",
            f"{r['generator_cpu_pct']:.0f}",
            f"{r['scheduler_peak_rss_mib']:.0f}",
            r["jobs"],
            f"{r['placed_p50_s']:.2f} / {r['placed_p99_s']:.2f}",
            f"{r['running_p50_s']:.2f} / {r['running_p99_s']:.2f}",
            f"{r['placements_per_s']:.0f}",
            f"{r['burst_started_per_s']:.0f} ({r['burst_tasks_started']} in "
            f"{r['burst_all_running_s']:.1f} s)",
            f"{r['report_p50_ms']:.0f} / {r['report_p99_ms']:.0f}",
        ]
        for r in rows
    ]
    print(
        f"# cluster_load: 3 voters + simulated members, {args.tenants} tenants, "
        f"{args.rate:g} submissions/s for {args.steady:g} s, burst array of {args.burst}"
    )
    print(tabulate(table, head, tablefmt="github"))
    if failover:
        news, runs = failover["new_scheduler_s"], failover["first_job_running_s"]
        ran = [r for r in runs if r is not None]
        kills = f"{len(news)} kill -9 of the scheduler" if len(news) > 1 else "kill -9 of the scheduler"
        print(
            f"failover at {failover['members']} members, {kills} -> new scheduler "
            + spread(news)
            + ", first job submitted afterwards running "
            + (spread(ran) if ran else "never")
            + (
                f" ({len(runs) - len(ran)} of {len(runs)} kills: no job ran within 120 s)"
                if len(ran) < len(runs)
                else ""
            )
        )
    for r in rows:
        if r.get("scheduler_moved") or r.get("scheduler_moved_in_burst"):
            where = "steady window" if r.get("scheduler_moved") else "burst"
            print(
                f"note: at {r['members']} members the scheduler role moved to another voter "
                f"during the {where} (an election)"
            )
    for r in rows:
        print(
            f"steady at {r['members']} members: scheduler {r['scheduler_cpu_pct']:.0f}% of one core, "
            f"{r.get('scheduler_system_cpu_pct', 0):.0f}% of it in the kernel"
        )
    for r in rows:
        total = r["burst_scheduler_cpu_pct"] + r["burst_generator_cpu_pct"] + r["burst_other_voters_cpu_pct"]
        per = r.get("burst_worker_cpu_pct") or []
        print(
            f"burst at {r['members']} members: scheduler {r['burst_scheduler_cpu_pct']:.0f}%, "
            f"generator {r['burst_generator_cpu_pct']:.0f}% (workers "
            f"{', '.join(f'{w:.0f}%' for w in per)}), the other two voters "
            f"{r['burst_other_voters_cpu_pct']:.0f}% of one core"
            + (
                f" (together {total:.0f}% of the {cores} cores' {100 * cores}%: the machine is "
                "the bottleneck)"
                if cores and total > 0.9 * 100 * cores
                else ""
            )
            + (
                "; a worker near 100 % of its one thread: the generator is the bottleneck"
                if per and max(per) > 85
                else ""
            )
        )
    busy = [
        r["members"]
        for r in rows
        if r["generator_cpu_pct"] + r["scheduler_cpu_pct"] > 0.9 * 100 * (cores or 1)
    ]
    if busy:
        print(
            f"note: at {busy} members the generator and the scheduler together used over 90% of "
            f"the {cores} cores: the generator is the bottleneck there"
        )
    print(f"machine: {machine}, {cores} cores")


if __name__ == "__main__":
    sys.exit(main())
