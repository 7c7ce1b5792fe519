"""The agent part of every member: starts its share of placed jobs as the tenant,
reports how they end, and carries out cancels.

The scheduler journals a placement, then calls :meth:`Agent.dispatch` on each member
in the placement (directly on a standalone host). The agent hands the job to the
:class:`~mtgpu.schedd.runner.Runner`, whose per-job supervisor outlives the daemon;
after a restart the agent re-adopts what still runs and records what ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.gpuinfo.sampler import Sampler
from mtgpu.schedd.jobenv import JobLaunch, JobUser, output_paths
from mtgpu.schedd.jobtable import FINAL_STATES, RUNNING, JobTable, spec_from_dict
from mtgpu.schedd.runner import SPEC, EarlierRunActive, JobAlreadyStarted, JobResult, Runner

log = logging.getLogger("mtgpu.agent")

Replicate = Callable[..., Awaitable[Any]]
UserLookup = Callable[[str, int], Awaitable[JobUser]]
#: Grace period (SIGTERM, then SIGKILL) for a part whose job the scheduler gave up on.
STOP_GRACE = 5.0
#: How often the agent looks for ended jobs without being told.
POLL_INTERVAL = 0.2
#: After an end notice, how long to wait for others before recording them together.
END_BATCH = 0.02
#: Parts this member starts at once (each forks a supervisor).
STARTS_AT_ONCE = 4


def member_of(job: dict[str, Any], node: str) -> dict[str, Any] | None:
    for m in (job.get("placement") or {}).get("members", []):
        if m["node"] == node:
            return m
    return None


def launch_for(job: dict[str, Any], user: JobUser, *, node: str = "", member: dict[str, Any] | None = None,
               sampler: Sampler | None = None, cpus: tuple[int, ...] = (), master_addr: str = "",
               term: int = 0, env: dict[str, str] | None = None) -> JobLaunch:
    """The runner's description of this member's part of ``job``."""
    spec = spec_from_dict(job["spec"])
    members = (job.get("placement") or {}).get("members", [])
    gpus = tuple(member["gpu_indices"]) if member else ()
    return JobLaunch(
        job_id=job["job_id"], user=user, script=spec.script, workdir=job["workdir"],
        name=job["name"], array_task_id=job.get("array_task"), array_job_id=job.get("array_id"),
        stdout=spec.output, stderr=spec.error,
        gpu_env=sampler.visibility_env(list(gpus)) if sampler and gpus else {},
        gpu_indices=gpus,
        device_nodes=tuple(sampler.device_nodes(list(gpus))) if sampler and gpus else (),
        cpus=cpus, ram=spec.request.ram or None, time_limit=spec.time_limit,
        node_rank=member["rank"] if member else 0, nnodes=max(1, len(members)),
        nodelist=tuple(m["node"] for m in members) or (node,), node_name=node,
        master_addr=master_addr, submit_dir=job["workdir"], term=term, env=env or {},
        attempt=job.get("requeues", 0))


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` here, or None."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


def job_output_paths(job: dict[str, Any], user: JobUser) -> tuple[str, str]:
    """Where the job's stdout and stderr go (as ``mt-job show`` reports them)."""
    out, err, _ = output_paths(launch_for(job, user))
    return out, err


class Agent:
    """Runs this member's share of jobs."""

    def __init__(self, node: str, table: JobTable, runner: Runner, sampler: Sampler,
                 replicate: Replicate, user_for: UserLookup, *, address: str = "127.0.0.1",
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.table = table
        self.runner = runner
        self.sampler = sampler
        self.replicate = replicate
        self.user_for = user_for
        self.address = address
        #: A member's address (host) by name, for MASTER_ADDR; the daemon sets it in a cluster.
        self.address_of: Callable[[str], str | None] = lambda name: None
        self.clock = clock
        self.cores: dict[str, tuple[int, ...]] = {}
        #: The term each part here was started with (a requeued job gets a new one).
        self.terms: dict[str, tuple[int, int]] = {}
        self._cancelling: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._ends: Any = None
        self._ended: set[str] = set()
        self._wake = asyncio.Event()
        self.on_change: Callable[[], None] = lambda: None
        #: Containerized jobs: gets the image here and makes the part's ``podman run``
        #: (the workspaces layer sets it); called with the job, the launch and a
        #: progress reporter, returns the launch to start.
        self.prepare_container: Callable[..., Awaitable[JobLaunch]] | None = None
        #: Variables this member gives every job of a tenant (where their podman keeps
        #: its storage here); the job's own and the scheduler's come after.
        self.job_env: Callable[[JobUser], Mapping[str, str]] | None = None
        #: Parts getting their image before they start, by job id.
        self.preparing: dict[str, asyncio.Task[None]] = {}
        self._starts: asyncio.Semaphore | None = None

    # ------------------------------------------------------------ dispatch

    def _pick_cores(self, job_id: str, n: int) -> tuple[int, ...]:
        """The least-used cores, so jobs share cores only when CPUs are overcommitted."""
        total = os.cpu_count() or 1
        use = [0] * total
        for cs in self.cores.values():
            for c in cs:
                if c < total:
                    use[c] += 1
        order = sorted(range(total), key=lambda c: (use[c], c))
        picked = tuple(sorted(order[:max(1, min(n, total))]))
        self.cores[job_id] = picked
        return picked

    async def dispatch(self, job: dict[str, Any], term: int) -> None:
        """Start this member's part of a placed job."""
        member = member_of(job, self.node)
        if member is None:
            raise RuntimeError(f"job {job['job_id']} has no part on {self.node}")
        user = await self.user_for(job["user"], job["uid"])
        cpus = self._pick_cores(job["job_id"], member["cpus"])
        members = job["placement"]["members"]
        master = members[0]["node"]
        master_addr = self.address if master == self.node else (self.address_of(master) or master)
        env = dict(self.job_env(user)) if self.job_env is not None else {}
        if len(members) > 1 and (ifname := interface_of(self.address)):
            # gloo and NCCL pick an interface from the hostname otherwise (often
            # loopback), and the parts on other members cannot reach it.
            env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
        launch = launch_for(job, user, node=self.node, member=member, sampler=self.sampler,
                            cpus=cpus, term=term, master_addr=master_addr, env=env)
        self.terms[job["job_id"]] = (term, job.get("requeues", 0))
        if job.get("container"):
            # The image may take a while to arrive: the part starts when it is here,
            # and the dispatch does not wait for it.
            jid = job["job_id"]
            if jid not in self.preparing:
                self.preparing[jid] = asyncio.get_running_loop().create_task(
                    self._prepare_and_start(job, launch))
            return
        await self._start(job, launch)

    async def _prepare_and_start(self, job: dict[str, Any], launch: JobLaunch) -> None:
        jid, term, attempt = job["job_id"], launch.term, launch.attempt
        last = [0.0]

        async def progress(text: str) -> None:
            now = time.monotonic()
            if now - last[0] < 0.5 and not text.startswith(("streamed", "loading")):
                return
            last[0] = now
            try:
                await self.replicate(self.table.set_progress, jid, self.node, text)
            except Exception:  # noqa: BLE001 - progress is only shown
                log.debug("progress of %s not recorded", jid, exc_info=True)

        try:
            if self.prepare_container is None:
                raise RuntimeError("containerized jobs need container workspaces on this member")
            launch = await self.prepare_container(job, launch, progress)
            await self._start(job, launch)
        except asyncio.CancelledError:
            self.cores.pop(jid, None)
            raise
        except Exception as exc:  # noqa: BLE001 - the job fails with the reason
            log.warning("job %s could not start here: %s", jid, exc)
            self.cores.pop(jid, None)
            self.terms.pop(jid, None)
            await self.replicate(self.table.part_ended, jid, self.node, term, "FAILED", None,
                                 f"the job could not start on {self.node}: {exc}", self.clock(),
                                 attempt)
            self.on_change()
        finally:
            self.preparing.pop(jid, None)

    async def _start(self, job: dict[str, Any], launch: JobLaunch) -> None:
        if self._starts is None:
            self._starts = asyncio.Semaphore(STARTS_AT_ONCE)
        try:
            try:
                async with self._starts:
                    await asyncio.to_thread(self.runner.start, launch)
            except EarlierRunActive:
                # Requeued and placed here again while the earlier run goes on (this
                # member was lost meanwhile): stop that run first.
                await self._stop_earlier_run(job["job_id"])
                async with self._starts:
                    await asyncio.to_thread(self.runner.start, launch)
        except JobAlreadyStarted:
            log.warning("job %s was already started here; not starting it twice", job["job_id"])
            return
        except Exception:
            self.cores.pop(job["job_id"], None)
            raise
        self._declare()
        await self.replicate(self.table.started, job["job_id"], self.node, self.clock())

    async def _stop_earlier_run(self, jid: str) -> None:
        log.info("stopping the earlier run of job %s here before starting it again", jid)
        await asyncio.to_thread(self.runner.cancel, jid, STOP_GRACE)
        deadline = time.monotonic() + STOP_GRACE + 15
        while self.runner.result(jid) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    def _declare(self) -> None:
        """Tell simulated GPUs what the jobs placed on them declared."""
        declared: dict[int, int] = {}
        for jid in list(self.cores):  # the jobs started here and not ended
            j = self.table.get(jid)
            m = member_of(j, self.node) if j is not None and j["state"] == RUNNING else None
            if m is None:
                continue
            for i in m["gpu_indices"]:
                declared[i] = declared.get(i, 0) + m["vram_per_gpu"]
        self.sampler.set_declared(declared)

    # ---------------------------------------------------------------- loop

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        # Supervisors say when a job has ended (runner.listen_ends); polling stays the
        # fallback for a lost message and for ends while no daemon listened.
        self._ends = self.runner.listen_ends()
        if self._ends is not None:
            loop.add_reader(self._ends.fileno(), self._on_end)
        self._task = loop.create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for task in list(self.preparing.values()):  # started again after a restart
            await cancel_and_wait(task)
        if self._ends is not None:
            asyncio.get_running_loop().remove_reader(self._ends.fileno())
            self._ends.close()
            self._ends = None

    def _on_end(self) -> None:
        assert self._ends is not None
        try:
            while data := self._ends.recv(256):
                self._ended.add(data.decode(errors="replace"))
        except OSError:
            pass  # drained
        self._wake.set()

    async def _loop(self) -> None:
        await self._adopt()
        last_full = 0.0
        while True:
            # A full look at every running job now and then; in between, only at the
            # jobs whose supervisors said they ended.
            full = time.monotonic() - last_full >= POLL_INTERVAL
            ids, self._ended = (None if full else self._ended), set()
            if full:
                last_full = time.monotonic()
            try:
                await self.tick(ids)
            except Exception:  # noqa: BLE001 - keep watching jobs whatever one did
                log.exception("agent tick failed")
            try:
                left = max(0.0, POLL_INTERVAL - (time.monotonic() - last_full))
                await asyncio.wait_for(self._wake.wait(), left)
                await asyncio.sleep(END_BATCH)  # let a burst of ends arrive together
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def _adopt(self) -> None:
        """After a restart: jobs the table says run here but no supervisor knows."""
        known = set(await asyncio.to_thread(self.runner.running))
        for jid in known:
            # Every live supervisor is watched; those whose job the scheduler gave up
            # on meanwhile (lost member, requeue, cancel) are stopped by the next tick.
            self.cores.setdefault(jid, ())
            self.terms[jid] = await asyncio.to_thread(self.runner.launch_run, jid)
        for j in list(self.table.active()):
            if j["state"] != RUNNING or member_of(j, self.node) is None:
                continue
            if j["job_id"] in known:
                self.cores[j["job_id"]] = ()
                log.info("re-adopted job %s", j["job_id"])
                continue
            if self.runner.result(j["job_id"]) is None and j.get("start_time") is None \
                    and not (self.runner.job_dir(j["job_id"]) / SPEC).exists():
                # Placed but never started (the daemon died in between): start it now.
                try:
                    await self.dispatch(j, j.get("term") or 0)
                except Exception as exc:  # noqa: BLE001
                    await self.replicate(self.table.finish, j["job_id"], "FAILED", None,
                                         f"could not start after a restart: {exc}", self.clock())
            elif self.runner.result(j["job_id"]) is None:
                await self.replicate(self.table.finish, j["job_id"], "NODE_FAIL", None,
                                     f"its supervisor on {self.node} is gone", self.clock())
        self._declare()

    async def tick(self, ended: set[str] | None = None) -> None:
        """Record ended jobs (all, or those in ``ended``) and carry out cancels."""
        results = await asyncio.to_thread(self.runner.poll, ended)
        # Each record waits on a commit: a burst of ends (an array) commits side by side.
        await asyncio.gather(*(self._record(r) for r in results))
        for jid in list(self.cores):  # the jobs started here and not ended
            j = self.table.get(jid)
            why = self._given_up(jid, j)
            prep = self.preparing.get(jid)
            if prep is not None and (why or (j is not None and j.get("cancel_requested"))):
                # Still getting its image: nothing runs yet, so nothing to signal.
                prep.cancel()
                self.preparing.pop(jid, None)
                self.cores.pop(jid, None)
                self.terms.pop(jid, None)
                if not why and j is not None:
                    await self.replicate(self.table.finish, jid, "CANCELLED", None,
                                         j.get("reason") or "cancelled", self.clock())
                continue
            if prep is not None:
                continue
            if why and jid not in self._cancelling:
                self._cancelling.add(jid)
                log.info("stopping job %s here: %s", jid, why)
                await asyncio.to_thread(self.runner.cancel, jid, STOP_GRACE)
                continue
            if (j is not None and j["state"] == RUNNING and j.get("cancel_requested")
                    and j["job_id"] not in self._cancelling and member_of(j, self.node)):
                self._cancelling.add(j["job_id"])
                ok = await asyncio.to_thread(self.runner.cancel, j["job_id"])
                if not ok and self.runner.result(j["job_id"]) is None:
                    await self.replicate(self.table.finish, j["job_id"], "CANCELLED", None,
                                         j.get("reason") or "cancelled", self.clock())

    def _given_up(self, jid: str, j: dict[str, Any] | None) -> str:
        """Why this member's part of ``jid`` must stop although it was not cancelled
        (the scheduler ended, requeued or moved the job, e.g. while this member was
        lost, or another part failed); empty when it should go on."""
        if j is None:
            return "the job is no longer known"
        if j["state"] in FINAL_STATES:
            return f"the job has ended ({j['state']}: {j.get('reason') or 'no reason given'})"
        if j["state"] != RUNNING:
            return "the job was requeued"
        if member_of(j, self.node) is None:
            return "the job runs elsewhere now"
        mine = self.terms.get(jid)
        now = (j.get("term") or 0, j.get("requeues", 0))
        if mine and mine[0] and now[0] and now != mine:
            return (f"the job was placed again (term {now[0]}, attempt {now[1]}; this part is "
                    f"of term {mine[0]}, attempt {mine[1]})")
        return ""

    async def _record(self, r: JobResult) -> None:
        j = self.table.get(r.job_id)
        self.cores.pop(r.job_id, None)
        self.terms.pop(r.job_id, None)
        self._cancelling.discard(r.job_id)
        if j is not None and j["state"] not in FINAL_STATES:
            reason = r.reason
            if r.signal and not reason:
                reason = f"killed by signal {r.signal}"
            await self.replicate(self.table.part_ended, r.job_id, self.node, r.term, str(r.state),
                                 r.exit_code, reason, r.end_time or self.clock(), r.attempt)
        self.runner.ack(r.job_id)
        self._declare()
        self.on_change()
