"""The VRAM watchdog: keeps each shared GPU's promise of VRAM to the jobs placed on it.

Every ``VRAM_WATCH_INTERVAL`` seconds (at most 1) the agent's watchdog reads what
each process holds on each GPU (NVML's running-process lists, amdsmi's process
list, DRM fdinfo, or the simulator: :meth:`Sampler.process_use`), finds each
process's job by its cgroup (or, where a job has none, by its ancestry up to the
job's supervisor, which is the subreaper of everything the job forks), and sums
the use per job and GPU. :func:`judge`, a pure function, then picks the jobs to stop:

- ``gpu_mode=shared``: a job holding more than its ``vram`` plus ``VRAM_TOLERANCE``
  percent on any of its GPUs. Its neighbours, within their share, are never picked.
- ``gpu_mode=overcommit``: nothing is promised, so nothing is stopped until a card
  is full (its measured use within ``VRAM_TOLERANCE`` percent of its total). Then
  the jobs above their declared ``vram`` are stopped, largest excess first, until
  what they hold brings the card back under full.
- ``gpu_mode=exclusive``: the card is the job's; no limit.

A job picked is stopped as a job over its RAM limit is: the runner asks its
supervisor (``stop.json``), which writes one line in the job's standard error,
sends SIGTERM to every process of the job and SIGKILL after its grace, and records
it ``OUT_OF_MEMORY`` with the reason ("used 31.2G of GPU 0's memory, over its
vram=20G").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mtgpu.config import format_size
from mtgpu.gpuinfo.types import GpuInfo
from mtgpu.jobspec import MemberPlacement
from mtgpu.state.codec import JobRecord

log = logging.getLogger("mtgpu.vramwatch")

#: How far up the process tree a process's job is looked for.
_ANCESTRY_DEPTH = 64


@dataclass(frozen=True)
class JobShare:
    """One job part running here, as the watchdog judges it."""

    job_id: str
    attempt: int
    mode: str  # exclusive | shared | overcommit
    vram: int  # declared, per GPU
    gpus: tuple[int, ...]  # host indices


@dataclass(frozen=True)
class VramStop:
    """A job to stop: where it went over, what it held and its limit."""

    job_id: str
    attempt: int
    gpu: int
    used: int
    vram: int
    reason: str


def _reason(gpu: int, used: int, vram: int, full: bool) -> str:
    """
    >>> _reason(0, int(31.2 * 2**30), 20 << 30, False)
    "used 31.2G of GPU 0's memory, over its vram=20G"
    """
    text = f"used {format_size(used)} of GPU {gpu}'s memory, over its vram={format_size(vram)}"
    return text + (f", while GPU {gpu} was full" if full else "")


def judge(
    cards: Mapping[int, GpuInfo],
    use: Mapping[tuple[str, int], int],
    jobs: Iterable[JobShare],
    tolerance: float,
    stopping: Iterable[str] = (),
) -> list[VramStop]:
    """The jobs to stop now (see the module docstring); pure.

    ``cards`` are the GPUs by host index, ``use`` the bytes each job holds on each
    GPU (job id, index), ``tolerance`` a percentage and ``stopping`` the jobs asked
    to stop already (what they hold counts as freed).
    """
    slack = 1 + tolerance / 100
    stopping = set(stopping)
    out: list[VramStop] = []
    picked: set[str] = set()
    jobs = list(jobs)
    for j in jobs:
        if j.mode != "shared" or j.job_id in stopping:
            continue
        over = [(use.get((j.job_id, g), 0), g) for g in j.gpus if use.get((j.job_id, g), 0) > j.vram * slack]
        if over:
            used, g = max(over)
            out.append(VramStop(j.job_id, j.attempt, g, used, j.vram, _reason(g, used, j.vram, False)))
            picked.add(j.job_id)
    for index, card in sorted(cards.items()):
        if not card.vram_total:
            continue
        held = sum(u for (jid, g), u in use.items() if g == index)
        measured = max(card.vram_used, held)
        full_at = card.vram_total * (1 - tolerance / 100)
        if measured < full_at:
            continue
        freed = sum(u for (jid, g), u in use.items() if g == index and (jid in stopping or jid in picked))
        excess = sorted(
            (
                (use.get((j.job_id, index), 0) - j.vram, j)
                for j in jobs
                if j.mode == "overcommit"
                and index in j.gpus
                and j.job_id not in stopping
                and j.job_id not in picked
                and use.get((j.job_id, index), 0) > j.vram * slack
            ),
            key=lambda e: (-e[0], e[1].job_id),
        )
        for _, j in excess:
            if measured - freed < full_at:
                break
            used = use[(j.job_id, index)]
            out.append(VramStop(j.job_id, j.attempt, index, used, j.vram, _reason(index, used, j.vram, True)))
            picked.add(j.job_id)
            freed += used
    return out


# ------------------------------------------------------------------ processes to jobs


def cgroup_job(pid: int, names: Mapping[str, str], proc_root: str = "/proc") -> str | None:
    """The job whose cgroup (by name, in ``names``) holds ``pid``, or None.

    A tenant cannot leave its job's cgroup: moving a process takes write access to
    another cgroup's ``cgroup.procs``, which only root has.
    """
    try:
        text = Path(f"{proc_root}/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part in names:
                return names[part]
    return None


def _ppid(pid: int, proc_root: str) -> int | None:
    try:
        text = Path(f"{proc_root}/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def ancestry_job(pid: int, supervisors: Mapping[int, str], proc_root: str = "/proc") -> str | None:
    """The job whose supervisor is an ancestor of ``pid``, or None.

    Each supervisor is its job's child subreaper, so a process that forks twice
    or starts a new session is still its descendant.
    """
    for _ in range(_ANCESTRY_DEPTH):
        parent = _ppid(pid, proc_root)
        if parent is None or parent <= 1:
            return None
        if parent in supervisors:
            return supervisors[parent]
        pid = parent
    return None


@dataclass(frozen=True)
class JobProcesses:
    """How to tell which job a process is in: job cgroup names and supervisor pids."""

    cgroups: Mapping[str, str]
    supervisors: Mapping[int, str]
    proc_root: str = "/proc"

    def job_of(self, pid: int) -> str | None:
        return cgroup_job(pid, self.cgroups, self.proc_root) or ancestry_job(
            pid, self.supervisors, self.proc_root
        )


def job_use(
    gpus: Iterable[GpuInfo], job_of: Callable[[int], str | None]
) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """Per (job, GPU index) bytes held, and per GPU the bytes held by no job."""
    use: dict[tuple[str, int], int] = {}
    outside: dict[int, int] = {}
    for g in gpus:
        outside[g.index] = 0
        for p in g.processes:
            jid = job_of(p.pid)
            if jid is None:
                outside[g.index] += p.used_memory
            else:
                use[(jid, g.index)] = use.get((jid, g.index), 0) + p.used_memory
    return use, outside


class VramWatch:
    """The watchdog loop of one member; the agent supplies its jobs and stops them.

    ``shares()`` lists the job parts running here, ``processes()`` says how to map
    processes to them, ``stop(VramStop)`` asks a job's supervisor to stop it.
    """

    def __init__(
        self,
        read: Callable[[], Mapping[str, GpuInfo]],
        shares: Callable[[], Sequence[JobShare]],
        processes: Callable[[], JobProcesses],
        stop: Callable[[VramStop], bool],
        *,
        interval: float = 1.0,
        tolerance: float = 5.0,
    ) -> None:
        self.read = read
        self.shares = shares
        self.processes = processes
        self.stop = stop
        self.interval = interval
        self.tolerance = tolerance
        #: (job id, attempt) asked to stop, and when: asked once per attempt.
        self.stopped: dict[tuple[str, int], VramStop] = {}
        #: The last reading: per (job, GPU) and per GPU outside every job.
        self.use: dict[tuple[str, int], int] = {}
        self.outside: dict[int, int] = {}

    def check(self, shares: Sequence[JobShare] | None = None) -> list[VramStop]:
        """One reading and its stops (blocking; the loop runs it in a thread, with the
        ``shares`` it took in the event loop, where the agent's tables change)."""
        shares = list(self.shares() if shares is None else shares)
        if not shares:
            self.use = {}
            return []
        if not any(s.mode in ("shared", "overcommit") for s in shares):
            return []
        cards = {g.index: g for g in self.read().values()}
        mapping = self.processes()
        self.use, self.outside = job_use(cards.values(), mapping.job_of)
        running = {(s.job_id, s.attempt) for s in shares}
        self.stopped = {k: v for k, v in self.stopped.items() if k in running}
        stopping = {jid for jid, _ in self.stopped}
        out = []
        for st in judge(cards, self.use, shares, self.tolerance, stopping):
            log.warning("job %s: %s; stopping it", st.job_id, st.reason)
            self.stopped[(st.job_id, st.attempt)] = st
            try:
                self.stop(st)
            except Exception:  # the next reading tries the others
                log.exception("job %s: cannot ask its supervisor to stop it", st.job_id)
            out.append(st)
        return out

    async def run(self) -> None:
        """Check every ``interval`` seconds until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await asyncio.to_thread(self.check, self.shares())
            except Exception:  # the watchdog must keep watching
                log.exception("VRAM watchdog reading failed; trying again")
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))


def share_of(job: JobRecord, member: MemberPlacement, attempt: int) -> JobShare:
    """The :class:`JobShare` of a placed job's part (``member`` of its placement)."""
    return JobShare(
        job_id=job.job_id,
        attempt=attempt,
        mode=str(job.placement.gpu_mode) if job.placement is not None else "exclusive",
        vram=member.vram_per_gpu,
        gpus=member.gpu_indices,
    )
