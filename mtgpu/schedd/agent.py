"""The agent part of every member: starts its share of placed jobs as the tenant,
reports how they end, and carries out cancels.

The scheduler journals a placement, then calls :meth:`Agent.dispatch` on each member
in the placement (directly on a standalone host). The agent hands the job to the
:class:`~mtgpu.schedd.runner.Runner`, whose per-job supervisor outlives the daemon;
after a restart the agent re-adopts what still runs and records what ended.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES, StateError
from mtgpu.gpuinfo.sampler import Sampler
from mtgpu.jobspec import MemberPlacement
from mtgpu.jobstate import CANCELLED, FAILED, FINAL_STATES, NODE_FAIL, RUNNING
from mtgpu.schedd.cgroups import job_cgroup_name
from mtgpu.schedd.jobenv import (
    DEFAULT_RENDEZVOUS_PORTS,
    JobLaunch,
    JobUser,
    array_shape,
    output_paths,
    pick_rendezvous_port,
)
from mtgpu.schedd.jobfile import parse_array, parse_signal
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.netns import interface_of, job_net
from mtgpu.schedd.runner import SPEC, EarlierRunActive, JobAlreadyStarted, JobResult, Runner
from mtgpu.schedd.vramwatch import JobProcesses, JobShare, VramStop, share_of
from mtgpu.state.codec import JobRecord

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
#: How long a job's end, or a start after a restart, whose commit failed (a leader
#: change) is retried (seconds).
RECORD_RETRY = 120.0


def warning_signal(text: str | None) -> dict[str, Any]:
    """The launch fields of sbatch's --signal (as :func:`~mtgpu.schedd.jobfile.parse_signal` reads it)."""
    if not text:
        return {}
    sig, before, batch = parse_signal(text)
    return {"warn_signal": sig, "warn_before": before, "warn_batch_only": batch}


@functools.lru_cache(maxsize=256)
def _array_shape(spec: str) -> tuple[int, int, int, int] | None:
    """An array's shape, once per array spec (an array has up to 100000 tasks)."""
    return array_shape(parse_array(spec)[0])


def launch_for(
    job: JobRecord,
    user: JobUser,
    *,
    node: str = "",
    member: MemberPlacement | None = None,
    sampler: Sampler | None = None,
    cpus: tuple[int, ...] = (),
    master_addr: str = "",
    term: int = 0,
    env: dict[str, str] | None = None,
    master_port: int = 0,
    member_addrs: tuple[str, ...] = (),
    tools_dir: str = "",
    api_socket: str = "",
) -> JobLaunch:
    """The runner's description of this member's part of ``job``."""
    spec = job.spec
    members = job.members
    gpus = member.gpu_indices if member else ()
    submitted = job.submit
    return JobLaunch(
        job_id=job.job_id,
        user=user,
        script=spec.script,
        script_args=tuple(submitted.get("args", ())),
        workdir=job.workdir,
        name=job.name,
        array_task_id=job.array_task,
        array_job_id=job.array_id,
        numeric_id=job.numeric_id or "",
        stdout=spec.output,
        stderr=spec.error,
        gpu_env=sampler.visibility_env(list(gpus)) if sampler and gpus else {},
        gpu_indices=gpus,
        device_nodes=tuple(sampler.device_nodes(list(gpus))) if sampler and gpus else (),
        cpus=cpus,
        # --mem=0 (ram 0): the member's whole RAM, which the placement gave the job.
        ram=spec.request.ram or (member.ram if member and member.ram else None),
        time_limit=spec.time_limit,
        node_rank=member.rank if member else 0,
        nnodes=max(1, len(members)),
        nodelist=tuple(m.node for m in members) or (node,),
        node_name=node,
        master_addr=master_addr,
        master_port=master_port,
        member_addrs=member_addrs,
        submit_dir=job.workdir,
        term=term,
        env={**submitted.get("env", {}), **(env or {})},
        umask=submitted.get("umask"),
        rlimits=dict(submitted.get("rlimits", {})),
        array_shape=_array_shape(spec.array) if spec.array and job.array_task is not None else None,
        open_append=spec.open_mode == "append",
        **warning_signal(spec.signal),
        ntasks=spec.ntasks,
        ntasks_per_node=spec.ntasks_per_node,
        cpus_per_task=spec.cpus_per_task,
        attempt=job.attempt,
        output_cluster=job.log_cluster,
        gpu_mode=str(job.placement.gpu_mode) if job.placement is not None else "",
        vram=member.vram_per_gpu if member else 0,
        gpu_vram_total=_smallest_total(sampler, gpus),
        tools_dir=tools_dir,
        api_socket=api_socket,
    )


def _smallest_total(sampler: Sampler | None, gpus: tuple[int, ...]) -> int:
    """The smallest total VRAM of host GPUs ``gpus`` in the last sample (0: unknown)."""
    inv = sampler.latest if sampler is not None else None
    totals = [g.vram_total for i in gpus if inv is not None and (g := inv.gpu(i)) is not None]
    return min(totals) if totals and len(totals) == len(gpus) else 0


def gpus_held(sampler: Sampler | None, gpus: list[int]) -> list[dict[str, Any]]:
    """The GPUs ``gpus`` (host indices) as a job's record keeps them: index, UUID and
    type from the last sample (what accounting reports GPU-hours by)."""
    if not gpus:
        return []
    inv = sampler.latest if sampler is not None else None
    out = []
    for i in gpus:
        g = inv.gpu(i) if inv is not None else None
        out.append(
            {
                "index": i,
                "uuid": g.uuid if g else "",
                "type": g.type if g else "",
                "brand": g.brand if g else "",
            }
        )
    return out


def result_usage(r: JobResult) -> dict[str, Any]:
    """What a member's part used and how it ended, beyond its state (the job's record
    keeps it per member): the signal that ended it, CPU time and peak memory."""
    return {
        "signal": r.signal,
        "cpu_user": r.cpu_user,
        "cpu_system": r.cpu_system,
        "max_rss": r.max_rss,
        "memory_peak": r.memory_peak,
    }


def job_output_paths(job: JobRecord, user: JobUser) -> tuple[str, str]:
    """Where the job's stdout and stderr go (as ``mt-job show`` reports them)."""
    out, err, _ = output_paths(launch_for(job, user))
    return out, err


class Agent:
    """Runs this member's share of jobs."""

    def __init__(
        self,
        node: str,
        table: JobTable,
        runner: Runner,
        sampler: Sampler,
        replicate: Replicate,
        user_for: UserLookup,
        *,
        address: str = "127.0.0.1",
        clock: Callable[[], float] = time.time,
        address_of: Callable[[str], str | None] | None = None,
        tools_dir: str = "",
        api_socket: str = "",
        on_change: Callable[[], None] | None = None,
        prepare_container: Callable[..., Awaitable[JobLaunch]] | None = None,
        job_env: Callable[[JobUser], Mapping[str, str]] | None = None,
        rendezvous_ports: tuple[int, int] = DEFAULT_RENDEZVOUS_PORTS,
        job_network: bool = False,
    ) -> None:
        self.node = node
        #: Whether multi-member jobs run in their tenant's namespace on a job network
        #: of their own (TENANT_NETWORK: private; see netns.JobNet), not the host's.
        self.job_network = job_network
        self.table = table
        self.runner = runner
        self.sampler = sampler
        self.replicate = replicate
        self.user_for = user_for
        self.address = address
        #: A member's address (host) by name, for MASTER_ADDR; the daemon gives it in a cluster.
        self.address_of: Callable[[str], str | None] = address_of or (lambda name: None)
        #: The tenants' commands (srun, mt-job) and the API socket, for jobs' PATH and
        #: MTGPU_API_SOCKET; the daemon gives them.
        self.tools_dir = tools_dir
        self.api_socket = api_socket
        self.clock = clock
        self.cores: dict[str, tuple[int, ...]] = {}
        #: The (term, attempt) each part here was started with: a requeued job started
        #: again is a new attempt, and what was asked of an earlier one (its stop, its
        #: end) never reaches it.
        self.terms: dict[str, tuple[int, int]] = {}
        #: (job id, attempt) of the parts asked to stop.
        self._cancelling: set[tuple[str, int | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._ends: Any = None
        self._ended: set[str] = set()
        self._wake = asyncio.Event()
        #: Set once the jobs of an earlier daemon are adopted (start()): a start asked
        #: for meanwhile waits for it, so that a job whose start the earlier daemon
        #: left half done is started once, by one of the two, and not taken as started.
        self._adopted: asyncio.Event | None = None
        self.on_change: Callable[[], None] = on_change or (lambda: None)
        #: Containerized jobs: gets the image here and makes the part's ``podman run``
        #: (the workspaces layer's); called with the job, the launch and a
        #: progress reporter, returns the launch to start.
        self.prepare_container = prepare_container
        #: Variables this member gives every job of a tenant (where their podman keeps
        #: its storage here); the job's own and the scheduler's come after.
        self.job_env = job_env
        #: Parts getting their image before they start, by job id.
        self.preparing: dict[str, asyncio.Task[None]] = {}
        self._starts: asyncio.Semaphore | None = None
        #: RENDEZVOUS_PORTS: where rendezvous ports of jobs with rank 0 here come from.
        self.rendezvous_ports = rendezvous_ports
        self._old_runs_checked = 0.0

    def use_rendezvous_ports(self, ports: tuple[int, int]) -> None:
        """RENDEZVOUS_PORTS changed (a reload): jobs started from now on take theirs there."""
        self.rendezvous_ports = ports

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
        picked = tuple(sorted(order[: max(1, min(n, total))]))
        self.cores[job_id] = picked
        return picked

    def rendezvous_port(self) -> int:
        """A rendezvous port for a job whose rank 0 runs here: random from
        ``RENDEZVOUS_PORTS`` and free here now (raises JobError if none is)."""
        return pick_rendezvous_port(self.rendezvous_ports)

    async def dispatch(self, job: JobRecord, term: int, rendezvous_port: int = 0) -> None:
        """Start this member's part of a placed job. ``rendezvous_port``: the port the
        rank-0 member picked (a multi-member job); this member picks it if it is rank 0
        and none was given."""
        if self._adopted is not None and not self._adopted.is_set():
            await self._adopted.wait()
        await self._dispatch(job, term, rendezvous_port)

    async def _dispatch(self, job: JobRecord, term: int, rendezvous_port: int = 0) -> None:
        member = job.member_on(self.node)
        if member is None:
            raise RuntimeError(f"job {job.job_id} has no part on {self.node}")
        jid = job.job_id
        if self.terms.get(jid) == (term, job.attempt) and (jid in self.cores or jid in self.preparing):
            # This part is started (or starting) here already: asked again. A start
            # whose record was lost (to a leader change, which the scheduler was told)
            # is recorded now; one still starting records itself.
            if jid not in self.preparing:
                await self._record_start(job, job.attempt)
            return
        user = await self.user_for(job.user, job.uid)
        cpus = self._pick_cores(jid, member.cpus)
        members = job.members
        master = members[0].node
        master_addr = self.address if master == self.node else (self.address_of(master) or master)
        env = dict(self.job_env(user)) if self.job_env is not None else {}
        member_addrs: tuple[str, ...] = ()
        if len(members) > 1 and self.job_network:
            # The ranks meet on the job's own network, in their tenant's namespace.
            plan = job_net(jid)
            master_addr = plan.address(0)
            env.update(GLOO_SOCKET_IFNAME=plan.dev, NCCL_SOCKET_IFNAME=plan.dev)
            member_addrs = tuple(
                self.address if m.node == self.node else (self.address_of(m.node) or m.node) for m in members
            )
        elif len(members) > 1 and (ifname := interface_of(self.address)):
            # gloo and NCCL pick an interface from the hostname otherwise (often
            # loopback), and the parts on other members cannot reach it.
            env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
        port = rendezvous_port or (self.rendezvous_port() if master == self.node else 0)
        launch = launch_for(
            job,
            user,
            node=self.node,
            member=member,
            sampler=self.sampler,
            cpus=cpus,
            term=term,
            master_addr=master_addr,
            env=env,
            master_port=port,
            member_addrs=member_addrs,
            tools_dir=self.tools_dir,
            api_socket=self.api_socket,
        )
        self.terms[jid] = (term, job.attempt)
        if job.container:
            # The image may take a while to arrive: the part starts when it is here,
            # and the dispatch does not wait for it.
            if jid not in self.preparing:
                self.preparing[jid] = asyncio.get_running_loop().create_task(
                    self._prepare_and_start(job, launch)
                )
            return
        await self._start(job, launch)

    async def _prepare_and_start(self, job: JobRecord, launch: JobLaunch) -> None:
        jid, term, attempt = job.job_id, launch.term, launch.attempt
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
            await self.replicate(
                self.table.part_ended,
                jid,
                self.node,
                term,
                FAILED,
                None,
                f"the job could not start on {self.node}: {exc}",
                self.clock(),
                attempt,
            )
            self.on_change()
        finally:
            self.preparing.pop(jid, None)

    async def _start(self, job: JobRecord, launch: JobLaunch) -> None:
        if self._starts is None:
            self._starts = asyncio.Semaphore(STARTS_AT_ONCE)
        try:
            try:
                async with self._starts:
                    await asyncio.to_thread(self.runner.start, launch)
            except EarlierRunActive:
                # Requeued and placed here again while the earlier run goes on (this
                # member was lost meanwhile): stop that run first.
                await self._stop_earlier_run(job.job_id)
                async with self._starts:
                    await asyncio.to_thread(self.runner.start, launch)
        except JobAlreadyStarted:
            # Asked again: its start's record may have been lost (to a leader change),
            # so it is recorded again below (the job table keeps the first start time).
            log.warning("job %s was already started here; not starting it twice", job.job_id)
        except Exception:
            self.cores.pop(job.job_id, None)
            raise
        self._declare()
        await self._record_start(job, launch.attempt)

    async def _record_start(self, job: JobRecord, attempt: int) -> None:
        """Record that this member's part of ``job`` runs (again: the table keeps the
        first start time, so a record asked for twice changes nothing)."""
        member = job.member_on(self.node)
        held = gpus_held(self.sampler, list(member.gpu_indices) if member else [])
        await self.replicate(self.table.started, job.job_id, self.node, self.clock(), attempt, held)

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
            j = self.table.record(jid)
            m = j.member_on(self.node) if j is not None and j.state == RUNNING else None
            if m is None:
                continue
            for i in m.gpu_indices:
                declared[i] = declared.get(i, 0) + m.vram_per_gpu
        self.sampler.set_declared(declared)

    # ------------------------------------------------------------ VRAM watchdog

    def vram_shares(self) -> list[JobShare]:
        """The GPU parts of the jobs running here, for the VRAM watchdog."""
        out = []
        for jid in list(self.cores):
            j = self.table.record(jid)
            m = j.member_on(self.node) if j is not None and j.state == RUNNING else None
            if j is not None and m is not None and m.gpu_indices:
                out.append(share_of(j, m, self.terms.get(jid, (0, j.attempt))[1]))
        return out

    def job_processes(self) -> JobProcesses:
        """How to tell the job of a process here: the jobs' cgroup names and supervisors."""
        names: dict[str, str] = {}
        sups: dict[int, str] = {}
        for jid in list(self.cores):
            attempt = self.terms.get(jid, (0, 0))[1]
            names[job_cgroup_name(jid, str(self.runner.job_dir(jid)), attempt)] = jid
            pid = self.runner.supervisor_pid(jid)
            if pid is not None:
                sups[pid] = jid
        return JobProcesses(names, sups)

    def stop_vram(self, st: VramStop) -> bool:
        """Ask the supervisor of a job over its VRAM to stop it (OUT_OF_MEMORY)."""
        notice = f"mtgpu: job {st.job_id} is being stopped: it {st.reason}"
        return self.runner.stop_over_limit(
            st.job_id, f"the VRAM watchdog stopped the job: it {st.reason}", notice, st.attempt
        )

    # ---------------------------------------------------------------- loop

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._adopted = asyncio.Event()
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
        try:
            await self._adopt()
        except Exception:  # noqa: BLE001 - the jobs are watched whatever adoption did
            log.exception("adopting the jobs of an earlier daemon failed")
        finally:
            if self._adopted is not None:
                self._adopted.set()
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
                # At least a quarter interval between looks, unless an end wakes it: a
                # tick that took longer than the interval (its thread waited behind
                # others on a loaded host) is not followed at once by another.
                left = max(POLL_INTERVAL / 4, POLL_INTERVAL - (time.monotonic() - last_full))
                await asyncio.wait_for(self._wake.wait(), left)
                await asyncio.sleep(END_BATCH)  # let a burst of ends arrive together
            except TimeoutError:
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
        for j in self.table.active_records():
            if j.state != RUNNING or j.member_on(self.node) is None:
                continue
            jid, attempt = j.job_id, j.attempt
            here = self.runner.launch_run(jid)[1] if (self.runner.job_dir(jid) / SPEC).exists() else None
            if jid in known and here == attempt:
                self.cores[jid] = ()
                log.info("re-adopted job %s (attempt %d)", jid, attempt)
                continue
            if (
                (here is None and j.start_time is None)
                or (here is not None and here != attempt)
                or (
                    here is not None
                    and self.runner.result(jid) is None
                    and await asyncio.to_thread(self.runner.start_interrupted, jid)
                )
            ):
                # Placed but never started (the daemon died in between), only an earlier
                # attempt of it ran here, or its start was cut short before the
                # supervisor ran (nothing ran): start this attempt now.
                self.terms.pop(jid, None)  # not started by this daemon: start it
                try:
                    await self._dispatch_after_restart(j)
                except Exception as exc:  # noqa: BLE001
                    await self.replicate(
                        self.table.finish,
                        jid,
                        FAILED,
                        None,
                        f"could not start after a restart: {exc}",
                        self.clock(),
                        attempt,
                    )
            elif here is not None and jid in await asyncio.to_thread(self.runner.running):
                self.cores[jid] = ()  # its supervisor came up while this daemon started
                self.terms[jid] = await asyncio.to_thread(self.runner.launch_run, jid)
                log.info("re-adopted job %s (attempt %d)", jid, attempt)
            elif here is None or self.runner.result(jid) is None:
                await self.replicate(
                    self.table.finish,
                    jid,
                    NODE_FAIL,
                    None,
                    f"its supervisor on {self.node} is gone",
                    self.clock(),
                    attempt,
                )
        self._declare()

    async def _dispatch_after_restart(self, job: JobRecord) -> None:
        """Start a part an earlier daemon left unstarted. A start whose record is lost
        to a leader change (or refused while none is elected) is asked again: the part
        runs by then, and asking again records it (the job does not fail for the
        election). The job's own state decides whether it is still to start."""
        jid, attempt = job.job_id, job.attempt
        deadline = time.monotonic() + RECORD_RETRY
        delay = 0.2
        while True:
            try:
                await self._dispatch(job, job.term or 0)
                return
            except StateError as exc:
                if exc.code not in RETRYABLE_CODES | RESEND_CODES or time.monotonic() >= deadline:
                    raise
                log.info("the start of job %s after a restart is asked again: %s", jid, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            now = self.table.record(jid)
            if now is None or now.state != RUNNING or now.attempt != attempt:
                return  # requeued, cancelled or ended meanwhile: its new state stands
            if now.member_on(self.node) is None:
                return
            job = now

    async def tick(self, ended: set[str] | None = None) -> None:
        """Record ended jobs (all, or those in ``ended``) and carry out cancels."""
        results = await asyncio.to_thread(self.runner.poll, ended)
        # Each record waits on a commit: a burst of ends (an array) commits side by side.
        await asyncio.gather(*(self._record(r) for r in results))
        await self._old_runs_over()
        for jid in list(self.cores):  # the jobs started here and not ended
            j = self.table.record(jid)
            why = self._given_up(jid, j)
            prep = self.preparing.get(jid)
            if prep is not None and (why or (j is not None and j.cancel_requested)):
                # Still getting its image: nothing runs yet, so nothing to signal.
                prep.cancel()
                self.preparing.pop(jid, None)
                self.cores.pop(jid, None)
                self.terms.pop(jid, None)
                if not why and j is not None:
                    await self.replicate(
                        self.table.finish,
                        jid,
                        CANCELLED,
                        None,
                        j.reason or "cancelled",
                        self.clock(),
                        j.attempt,
                    )
                continue
            if prep is not None:
                continue
            mine = self.terms.get(jid, (0, None))[1]
            if why and (jid, mine) not in self._cancelling:
                self._cancelling.add((jid, mine))
                log.info("stopping job %s here: %s", jid, why)
                await asyncio.to_thread(self.runner.cancel, jid, STOP_GRACE, mine)
                continue
            if (
                j is not None
                and j.state == RUNNING
                and j.cancel_requested
                and (jid, j.attempt) not in self._cancelling
                and j.member_on(self.node)
            ):
                attempt = j.attempt
                self._cancelling.add((jid, attempt))
                ok = await asyncio.to_thread(self.runner.cancel, jid, 10.0, attempt)
                if not ok and self._unstarted(jid, attempt):
                    await self.replicate(
                        self.table.finish,
                        jid,
                        CANCELLED,
                        None,
                        j.reason or "cancelled",
                        self.clock(),
                        attempt,
                    )

    async def _old_runs_over(self) -> None:
        """Say so for requeued jobs that wait for an earlier run here which does not run
        here (it never started, or its end was recorded before the requeue), so that
        they are placed again without waiting for this member's lease to run out."""
        now = time.monotonic()
        if now - self._old_runs_checked < 1.0:
            return
        self._old_runs_checked = now
        for j in self.table.old_run_records():
            old = j.old_run if j.state != RUNNING else None
            if not old or self.node not in old["members"]:
                continue
            jid = j.job_id
            if jid in self.cores or jid in self.preparing:
                continue  # it still runs here: its end is recorded when it comes
            try:
                await self.replicate(
                    self.table.part_ended,
                    jid,
                    self.node,
                    0,
                    CANCELLED,
                    None,
                    "not running here",
                    self.clock(),
                    old["attempt"],
                )
            except StateError as exc:
                log.info("telling that job %s's earlier run is over here: %s", jid, exc)

    def _unstarted(self, jid: str, attempt: int) -> bool:
        """True if ``attempt`` of ``jid`` has no supervisor here that will report its end
        (it never started, or only another attempt did)."""
        if not (self.runner.job_dir(jid) / SPEC).exists():
            return True
        return self.runner.launch_run(jid)[1] != attempt

    def _given_up(self, jid: str, j: JobRecord | None) -> str:
        """Why this member's part of ``jid`` must stop although it was not cancelled
        (the scheduler ended, requeued or moved the job, e.g. while this member was
        lost, or another part failed); empty when it should go on."""
        if j is None:
            return "the job is no longer known"
        if j.state in FINAL_STATES:
            return f"the job has ended ({j.state}: {j.reason or 'no reason given'})"
        if j.state != RUNNING:
            return "the job was requeued"
        if j.member_on(self.node) is None:
            return "the job runs elsewhere now"
        mine = self.terms.get(jid)
        now = (j.term or 0, j.requeues)
        if mine and mine[0] and now[0] and now != mine:
            return (
                f"the job was placed again (term {now[0]}, attempt {now[1]}; this part is "
                f"of term {mine[0]}, attempt {mine[1]})"
            )
        return ""

    async def _record(self, r: JobResult) -> None:
        j = self.table.record(r.job_id)
        self._cancelling.discard((r.job_id, r.attempt))
        if self.terms.get(r.job_id, (0, r.attempt))[1] == r.attempt:
            # This attempt's end; an earlier attempt's late result leaves the part of
            # the attempt started since alone.
            self.cores.pop(r.job_id, None)
            self.terms.pop(r.job_id, None)
        if j is not None and j.state not in FINAL_STATES:
            reason = r.reason
            if r.signal and not reason:
                reason = f"killed by signal {r.signal}"
            # The runner hands each end over once: a commit lost to a leader change (a
            # hand-off, this member changing role) is retried here, or the job would
            # stay RUNNING for ever. Recording a part's end twice changes nothing.
            deadline = time.monotonic() + RECORD_RETRY
            fenced = reason.startswith("fenced: ") and j.spec.requeue
            while True:
                try:
                    if fenced:
                        # Fenced, and the scheduler had not given up on it yet (the
                        # member was cut off only briefly): a job that allows it is
                        # requeued, as it would have been had this member been lost.
                        others = [n for n in j.nodes if n != self.node]
                        r2 = await self.replicate(
                            self.table.requeue,
                            r.job_id,
                            f"requeued: {reason}",
                            self.clock(),
                            r.attempt,
                            others,
                        )
                        if "error" not in r2:
                            break
                    await self.replicate(
                        self.table.part_ended,
                        r.job_id,
                        self.node,
                        r.term,
                        str(r.state),
                        r.exit_code,
                        reason,
                        r.end_time or self.clock(),
                        r.attempt,
                        result_usage(r),
                    )
                    break
                except StateError as exc:
                    if time.monotonic() > deadline:
                        raise
                    log.info("recording the end of job %s: %s; retrying", r.job_id, exc)
                    await asyncio.sleep(0.5)
        self.runner.ack(r.job_id, r.attempt)
        self._declare()
        self.on_change()
