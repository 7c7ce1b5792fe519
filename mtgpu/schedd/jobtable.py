"""The job table: every job and every transition, as replicated state.

A PySyncObj consumer, like the user registry. Each transition (submitted, placed,
started, finished, cancel requested) is one log entry, applied in log order on every
member, so a new scheduler rebuilds its queue from here after a failover and nobody
resubmits anything. Methods are deterministic: callers pass ``now``.

Records are plain dicts (stable to pickle across versions) replaced as a whole, so
readers on the event-loop thread always see a complete record. Their fields, their
format version and their typed form (:class:`~mtgpu.state.codec.JobRecord`, which
:meth:`JobTable.record` gives) are :mod:`mtgpu.state.codec`'s.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from mtgpu.jobstate import ACTIVE_STATES, CANCELLED, COMPLETED, FAILED, FINAL_STATES, PENDING, RUNNING
from mtgpu.schedd import submitkeys, usage
from mtgpu.schedd.jobenv import JOB_ID_RE
from mtgpu.state import codec
from mtgpu.state.codec import JobRecord


def attempt_of(job: dict[str, Any]) -> int:
    """Which start of ``job`` this is (0 first, one more per requeue), as Slurm's
    restart count. Records journalled before attempts were counted read as 0."""
    return int(job.get("requeues") or 0)


class JobTable(SyncObjConsumer):
    """Jobs by id, plus the next id and submission keys (idempotent retries; see
    :mod:`mtgpu.schedd.submitkeys`)."""

    def __init__(self) -> None:
        # Set before the consumer's __init__, which leaves what exists by then out of
        # the replicated state: who waits for which job, on this member only.
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._wait_lock = threading.Lock()  # the log is applied on PySyncObj's thread
        # The typed form of each record, made once per change of the job (see record()).
        self._records: dict[str, JobRecord] = {}
        self._specs: codec.SpecCache = {}
        # An array's id -> its tasks' ids, in the table's order (made from the records):
        # what an array's id names is looked up, not searched for among every job.
        self.array_tasks: dict[str, dict[str, None]] = {}
        # The pending and running jobs whose earlier run may still run somewhere
        # (their record's ``old_run``), made from the records: the agents and the
        # scheduler look at these every second, not at every active job.
        self.old_run_ids: dict[str, None] = {}
        super().__init__()
        #: The format of the records (mtgpu.state.codec); a dump without it is format 1.
        self.state_format = codec.FORMAT
        #: The release that wrote the records: named when a member too old for them refuses them.
        self.written_by = codec.RELEASE
        self.jobs: dict[str, dict[str, Any]] = {}
        self.next_id = 1
        self.submit_keys: submitkeys.Keys = {}
        # Bumped whenever a job becomes pending (submit, requeue), so a scheduler can
        # notice work that another member added without scanning every time.
        self.pending_version = 0
        # The ids of pending and running jobs, in submission order: the scheduler and
        # the agents look at these many times a second, and finished jobs stay in
        # the table for JOB_RETENTION_DAYS.
        self.active_ids: dict[str, None] = {}
        self.running_ids: dict[str, None] = {}
        # Pending jobs (array tasks one by one) per user, for USER_MAX_QUEUED_JOBS.
        self.pending_by_user: dict[str, int] = {}
        # Bytes of pending jobs' scripts per user (an array's once), for
        # USER_MAX_QUEUED_SCRIPT_BYTES; and per submission [user, bytes, pending tasks].
        self.pending_script_bytes: dict[str, int] = {}
        self._pending_scripts: dict[str, list[Any]] = {}
        # What the jobs that ended used, summed per day, tenant, member and GPU type
        # (mtgpu.schedd.usage): kept for USAGE_RETENTION_DAYS, after the job records.
        self.usage: dict[str, list[float]] = {}
        # An array task's own numeric id (its SLURM_JOB_ID) -> its job id (13_1).
        self.numeric_ids: dict[str, str] = {}

    def _deserialize(self, data: dict[str, Any]) -> None:
        # Checked before anything is taken from it: a dump of a newer format leaves
        # the table as it was (the daemon refuses such a STATE_DIR before opening it:
        # mtgpu.state.codec.check_state_dir).
        fmt = data.get("state_format", 1)
        data = {
            **data,
            "jobs": codec.upgrade_jobs(data.get("jobs") or {}, fmt),
            "state_format": codec.FORMAT,
            "written_by": codec.RELEASE,
        }
        super()._deserialize(data)
        self._records.clear()
        self._specs.clear()
        # State from before keys had outcomes and ages ("UID:token" -> job id): those
        # keys are not kept (a retry across the upgrade is a new submission).
        self.__dict__.pop("tokens", None)
        if not isinstance(self.__dict__.get("submit_keys"), dict):
            self.submit_keys = {}
        if not isinstance(self.__dict__.get("usage"), dict):
            self.usage = {}  # a dump from before usage was summed
        with self._wait_lock:  # a whole new table: everyone looks again
            waiting = [w for ws in self._waiters.values() for w in ws]
            self._waiters.clear()
        for loop, fut in waiting:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:
                pass
        self.active_ids = {jid: None for jid, j in self.jobs.items() if j["state"] in ACTIVE_STATES}
        self.running_ids = {jid: None for jid, j in self.jobs.items() if j["state"] == RUNNING}
        self.old_run_ids = {jid: None for jid, j in self.jobs.items() if _waits_for_old_run(j)}
        self.numeric_ids = {j["numeric_id"]: jid for jid, j in self.jobs.items() if j.get("numeric_id")}
        self.array_tasks = {}
        for jid, j in self.jobs.items():
            if j.get("array_id"):
                self.array_tasks.setdefault(j["array_id"], {})[jid] = None
        self.pending_by_user = {}
        self.pending_script_bytes, self._pending_scripts = {}, {}
        for j in self.jobs.values():
            if j["state"] == PENDING:
                self.pending_by_user[j["user"]] = self.pending_by_user.get(j["user"], 0) + 1
                self._charge(j, 1)

    def _charge(self, record: dict[str, Any], n: int) -> None:
        """Count a pending job's script (``n`` = 1) or stop counting it (-1)."""
        sub = record.get("array_id") or record["job_id"]
        entry = self._pending_scripts.get(sub)
        if entry is None:
            if n < 0:
                return
            size = record.get("script_bytes", len(record["spec"].get("script", "")))
            entry = self._pending_scripts[sub] = [record["user"], size, 0]
            user = record["user"]
            self.pending_script_bytes[user] = self.pending_script_bytes.get(user, 0) + size
        entry[2] += n
        if entry[2] <= 0:
            del self._pending_scripts[sub]
            user, size = entry[0], entry[1]
            left = self.pending_script_bytes.get(user, 0) - size
            if left > 0:
                self.pending_script_bytes[user] = left
            else:
                self.pending_script_bytes.pop(user, None)

    def _put(self, record: dict[str, Any]) -> None:
        if type(record["state"]) is not str:
            record = {**record, "state": str(record["state"])}  # a JobState: records hold plain strings
        jid = record["job_id"]
        old = self.jobs.get(jid)
        if old is not None and old["state"] == PENDING:
            left = self.pending_by_user.get(old["user"], 0) - 1
            if left > 0:
                self.pending_by_user[old["user"]] = left
            else:
                self.pending_by_user.pop(old["user"], None)
            self._charge(old, -1)
        if record["state"] == PENDING:
            self.pending_by_user[record["user"]] = self.pending_by_user.get(record["user"], 0) + 1
            self._charge(record, 1)
        elif record["state"] in FINAL_STATES and record["spec"].get("script"):
            # A finished job's script is never run again: it leaves the replicated state
            # (and the next snapshot) so that records kept for JOB_RETENTION_DAYS stay small.
            record = {**record, "spec": {**record["spec"], "script": ""}}
        if record["state"] in FINAL_STATES and (record.get("submit") or {}).get("env"):
            # Nor is its exported environment (which may hold the tenant's secrets).
            record = {**record, "submit": {**record["submit"], "env": {}}}
        self.jobs[jid] = record
        if old is None and record.get("numeric_id"):
            self.numeric_ids[record["numeric_id"]] = jid
        if old is None and record.get("array_id"):
            self.array_tasks.setdefault(record["array_id"], {})[jid] = None
        if record["state"] in ACTIVE_STATES:
            self.active_ids[jid] = None
        else:
            self.active_ids.pop(jid, None)
        if record["state"] == RUNNING:
            self.running_ids[jid] = None
        else:
            self.running_ids.pop(jid, None)
        if _waits_for_old_run(record):
            self.old_run_ids[jid] = None
        else:
            self.old_run_ids.pop(jid, None)
        if self._waiters:
            with self._wait_lock:
                waiting = self._waiters.pop(jid, ())
            for loop, fut in waiting:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # that loop is closed
                    pass

    async def wait_for(
        self, job_id: str, test: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any] | None:
        """The job's record once ``test`` holds for it (as this replica applies the log),
        or None after ``timeout`` seconds. Woken by each change to the job, not polled."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            fut = loop.create_future()
            # Registered before looking, so a change applied in between still wakes it.
            with self._wait_lock:
                self._waiters.setdefault(job_id, []).append((loop, fut))
            try:
                j = self.jobs.get(job_id)
                if j is not None and test(j):
                    return j
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    await asyncio.wait_for(fut, left)
                except TimeoutError:
                    return None
            finally:
                self._unwait(job_id, fut)

    def _unwait(self, job_id: str, fut: asyncio.Future[None]) -> None:
        with self._wait_lock:
            waiting = [w for w in self._waiters.get(job_id, ()) if w[1] is not fut]
            if waiting:
                self._waiters[job_id] = waiting
            else:
                self._waiters.pop(job_id, None)

    # ------------------------------------------------------------- reads

    def get(self, job_id: str) -> dict[str, Any] | None:
        return self.jobs.get(job_id)

    def record(self, job_id: str) -> JobRecord | None:
        """The job's typed record, decoded once per change of the job (records are
        replaced whole, so one made from the same dict is still right). The cache
        holds one entry per job in the table, and loses it when the job is purged."""
        j = self.jobs.get(job_id)
        if j is None:
            return None
        return self.typed(j)

    def typed(self, j: dict[str, Any]) -> JobRecord:
        """The typed form of ``j``, one of this table's records."""
        hit = self._records.get(j["job_id"])
        if hit is not None and hit.raw is j:
            return hit
        rec = codec.decode_job(j, hit, self._specs)
        if self.jobs.get(rec.job_id) is j:  # a record since replaced is not kept
            self._records[rec.job_id] = rec
        return rec

    def digest(self) -> str:
        """A digest of every job's id, state and attempt (replicas that agree have the
        same one)."""
        import hashlib

        h = hashlib.sha256()
        for jid in sorted(self.jobs):
            j = self.jobs[jid]
            h.update(f"{jid} {j['state']} {attempt_of(j)}\n".encode())
        return h.hexdigest()[:16]

    def tasks_of(self, job_id: str) -> list[dict[str, Any]]:
        """A job, or every task of an array when ``job_id`` is the array's id, or the
        one array task whose own numeric id (its ``SLURM_JOB_ID``) ``job_id`` is."""
        j = self.jobs.get(job_id)
        if j is not None:
            return [j]
        tid = self.numeric_ids.get(job_id)
        if tid is not None and tid in self.jobs:
            return [self.jobs[tid]]
        jobs = self.jobs
        return [jobs[t] for t in list(self.array_tasks.get(job_id, ())) if t in jobs]

    def all(self) -> list[dict[str, Any]]:
        return list(self.jobs.values())

    def active(self) -> list[dict[str, Any]]:
        """Pending and running jobs, in submission order."""
        jobs = self.jobs
        return [jobs[jid] for jid in list(self.active_ids)]

    def running(self) -> list[dict[str, Any]]:
        """Running jobs (placed, on their members)."""
        jobs = self.jobs
        return [jobs[jid] for jid in list(self.running_ids)]

    def active_records(self) -> list[JobRecord]:
        """:meth:`active`, typed."""
        typed, jobs = self.typed, self.jobs
        return [typed(jobs[jid]) for jid in list(self.active_ids)]

    def running_records(self) -> list[JobRecord]:
        """:meth:`running`, typed."""
        typed, jobs = self.typed, self.jobs
        return [typed(jobs[jid]) for jid in list(self.running_ids)]

    def old_run_records(self) -> list[JobRecord]:
        """The pending and running jobs whose record has an ``old_run`` (an earlier
        run that may still run on its members), typed."""
        typed, jobs = self.typed, self.jobs
        return [typed(j) for jid in list(self.old_run_ids) if (j := jobs.get(jid)) is not None]

    def task_records(self, job_id: str) -> list[JobRecord]:
        """:meth:`tasks_of`, typed."""
        return [self.typed(j) for j in self.tasks_of(job_id)]

    # -------------------------------------------------------- replicated

    def outcome(self, scope: str, key: str, now: float) -> dict[str, Any] | None:
        """What the submission with ``key`` (of the tenant ``scope``) came to, as
        :meth:`submit` answered it, or None if this replica has no record of it."""
        hit = submitkeys.recall(self.submit_keys, scope, key, now)
        if hit is None:
            return None
        if "error" in hit:
            return {"error": hit["error"], "code": hit.get("code", "rejected"), "duplicate": True}
        jid = hit["job_id"]
        return {"job_id": jid, "tasks": [j["job_id"] for j in self.tasks_of(jid)], "duplicate": True}

    @replicated
    def submit(
        self,
        record: dict[str, Any],
        tasks: list[int] | None,
        now: float,
        key: str | None = None,
        scope: str | None = None,
        number_tasks: bool = False,
    ) -> dict[str, Any]:
        """Add a job (or one record per array task); returns the id(s).

        With ``key`` (and the tenant's ``scope``), a submission already in the log
        with the same key is answered as it was, and nothing is added.

        With ``number_tasks``, an array takes a block of ids, as Slurm's do: the array's
        own (13) and one per task after it (14, 15, ...), each task's ``numeric_id``
        (its ``SLURM_JOB_ID``), which no other job ever gets. The block is taken in this
        log entry, so every replica (and a new scheduler after a failover) numbers the
        tasks alike. Entries journalled before tasks were numbered leave it False and
        are applied as they were then (one id per array), so a replayed log gives the
        later jobs the ids they were given.
        """
        if key and scope is None:  # an entry journalled before keys were scoped
            scope, _, key = key.partition(":")
        if key:
            seen = self.outcome(scope or "", key, now)
            if seen is not None:
                return seen
        jid = str(self.next_id)
        last = jid if tasks is None else f"{jid}_{max(tasks, default=0)}"
        if not JOB_ID_RE.match(last) or (tasks is not None and min(tasks, default=0) < 0):
            # Read back by the same rule: a record whose id cannot be shown never enters.
            refused = {
                "error": f"array indices make the job id {last[:40]!r}, which is not a job "
                "id; use indices from 0 to 9999999",
                "code": "bad_id",
            }
            if key:
                submitkeys.remember(self.submit_keys, scope or "", key, refused, now)
            return refused
        self.next_id += 1
        numbered = number_tasks and tasks is not None
        if numbered:
            self.next_id += len(tasks or ())
        base = _pending(codec.bounded_warnings(record), now)  # a journal entry of an older release too
        ids = []
        if tasks is None:
            self._put({**base, "job_id": jid, "array_id": None, "array_task": None})
            ids.append(jid)
        else:
            for n, i in enumerate(tasks, start=int(jid) + 1):
                tid = f"{jid}_{i}"
                task = {**base, "job_id": tid, "array_id": jid, "array_task": i}
                if numbered:
                    task["numeric_id"] = str(n)
                self._put(task)
                ids.append(tid)
        self.pending_version += 1
        if key:
            submitkeys.remember(self.submit_keys, scope or "", key, {"job_id": jid}, now)
        return {"job_id": jid, "tasks": ids}

    @replicated
    def place(self, job_id: str, placement: dict[str, Any], term: int, now: float) -> dict[str, Any]:
        """The scheduler gave the job its members; it is RUNNING from here, as in Slurm."""
        return self._place(job_id, placement, term, now)

    @replicated
    def place_many(
        self, placements: list[tuple[str, dict[str, Any]]], term: int, now: float
    ) -> list[dict[str, Any]]:
        """Several placements of one scheduling pass as one log entry: ``place``'s
        answer for each ``(job_id, placement)``, in order."""
        return [self._place(str(jid), placement, term, now) for jid, placement in placements]

    def _place(self, job_id: str, placement: dict[str, Any], term: int, now: float) -> dict[str, Any]:
        j = self.jobs.get(job_id)
        if j is None or j["state"] != PENDING:
            return {"error": f"job {job_id} is not pending", "code": "not_pending"}
        self._put(
            {**j, "state": RUNNING, "placement": placement, "term": term, "placed_time": now, "reason": ""}
        )
        return {"job_id": job_id}

    @replicated
    def started(
        self,
        job_id: str,
        node: str,
        now: float,
        attempt: int | None = None,
        gpus: list[dict[str, Any]] | None = None,
    ) -> None:
        """A member started its part (of ``attempt``: a late report of an earlier
        attempt changes nothing). ``gpus``: the GPUs it holds there (index, UUID, type)."""
        j = self.jobs.get(job_id)
        if j is None or j["state"] != RUNNING or (attempt is not None and attempt != attempt_of(j)):
            return
        rec = j
        if gpus:
            rec = {**rec, "gpu_info": {**(j.get("gpu_info") or {}), node: list(gpus)}}
        if j["start_time"] is None:
            rec = {**rec, "start_time": now}
        if rec is not j:
            self._put(rec)

    @replicated
    def set_progress(self, job_id: str, node: str, text: str) -> None:
        """What a member is doing before its part can start (fetching the image, say),
        for ``mt-job show``."""
        j = self.jobs.get(job_id)
        if j is not None and j["state"] == RUNNING:
            self._put({**j, "progress": {**j.get("progress", {}), node: text[:300]}})

    @replicated
    def part_ended(
        self,
        job_id: str,
        node: str,
        term: int,
        state: str,
        exit_code: int | None,
        reason: str,
        now: float,
        attempt: int = 0,
        used: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One member's part of a job ended (the whole job, for a one-member job).

        ``used``: what the part used and how it ended beyond its state (the signal,
        CPU time, peak memory; :func:`mtgpu.schedd.agent.result_usage`), kept per member.

        A job on several members (``nodes=N``) completes when every part has completed;
        the first part that ends otherwise ends the job, naming its member, and the
        agents stop the other parts. A part of an earlier run (another term or attempt:
        the job was requeued since) changes nothing.
        """
        j = self.jobs.get(job_id)
        old = (j or {}).get("old_run")
        if j is not None and old and attempt == old["attempt"] and node in old["members"]:
            # The requeued job's earlier run ended here: once it has ended on every
            # member, the job may be placed again.
            self._old_part_over(j, node)
            return {"error": f"job {job_id} was requeued; its earlier run ended on {node}", "code": "stale"}
        if j is None or j["state"] in FINAL_STATES:
            return {"error": f"job {job_id} has already ended", "code": "final"}
        if (
            j["state"] != RUNNING
            or (term and j.get("term") and term != j["term"])
            or attempt != attempt_of(j)
        ):
            return {
                "error": f"job {job_id} is not running with term {term}, attempt {attempt}",
                "code": "stale",
            }
        if used:
            j = {**j, "usage": {**(j.get("usage") or {}), node: dict(used)}}
        members = [m["node"] for m in (j.get("placement") or {}).get("members", [])]
        if len(members) <= 1:
            return self._finish(j, state, exit_code, reason, now)
        parts = {
            **j.get("parts", {}),
            node: {"state": state, "exit_code": exit_code, "reason": reason, "end_time": now},
        }
        if state != COMPLETED:
            rank = members.index(node) if node in members else "?"
            why = f"its part on {node} (rank {rank}) ended {state}" + (f": {reason}" if reason else "")
            return self._finish({**j, "parts": parts}, state, exit_code, why, now)
        if all(parts.get(m, {}).get("state") == COMPLETED for m in members):
            return self._finish({**j, "parts": parts}, COMPLETED, exit_code, reason, now)
        self._put({**j, "parts": parts})
        return {"job_id": job_id, "state": RUNNING, "parts": len(parts)}

    @replicated
    def finish(
        self,
        job_id: str,
        state: str,
        exit_code: int | None,
        reason: str,
        now: float,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """End a job the scheduler or an agent gave up on (lost member, failed start).

        With ``attempt``, only that attempt of a running job: a decision taken about
        an earlier attempt (the job was requeued and started again since) changes
        nothing, so a job's end is recorded once, by whichever comes first.
        """
        j = self.jobs.get(job_id)
        if j is None or j["state"] in FINAL_STATES:
            return {"error": f"job {job_id} has already ended", "code": "final"}
        if attempt is not None and (j["state"] != RUNNING or attempt != attempt_of(j)):
            return {"error": f"job {job_id} is not running attempt {attempt}", "code": "stale"}
        return self._finish(j, state, exit_code, reason, now)

    def _finish(
        self, j: dict[str, Any], state: str, exit_code: int | None, reason: str, now: float
    ) -> dict[str, Any]:
        job_id = j["job_id"]
        if j["cancel_requested"] and state in (FAILED, COMPLETED, CANCELLED):
            state = CANCELLED  # killed by the cancel, whatever status it ended with
            reason = f"{j['reason']}; {reason}" if reason and reason != j["reason"] else j["reason"]
        final = {
            **j,
            "state": state,
            "exit_code": exit_code,
            "reason": reason,
            "end_time": now,
            "start_time": j["start_time"] or j.get("placed_time"),
        }
        self._put(final)
        usage.charge(self.usage, final)
        return {"job_id": job_id, "state": state}

    @replicated
    def cancel(self, job_ids: list[str], by: str, now: float, why: str = "") -> dict[str, Any]:
        """Cancel pending jobs at once; mark running ones for their member to stop.
        ``why`` (an admin's reason) is recorded with who cancelled."""
        done, asked, ended = [], [], []
        reason = f"cancelled by {by}" + (f": {why}" if why else "")
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is None:
                continue
            if j["state"] in FINAL_STATES:
                ended.append(jid)
            elif j["state"] == PENDING:
                final = {**j, "state": CANCELLED, "end_time": now, "reason": reason}
                self._put(final)
                usage.charge(self.usage, final)
                done.append(jid)
            else:
                # Running: its member stops it. Asked again, it is still being stopped.
                if not j["cancel_requested"]:
                    self._put({**j, "cancel_requested": True, "reason": reason})
                asked.append(jid)
        return {"cancelled": done, "stopping": asked, "ended": ended}

    @replicated
    def end_never_satisfied(self, ended: list[tuple[str, str]], now: float) -> list[str]:
        """Pending jobs whose dependency can never be met end CANCELLED with Slurm's
        reason (``DependencyNeverSatisfied: job 5 ended FAILED (afterok)``)."""
        done = []
        for jid, why in ended:
            j = self.jobs.get(jid)
            if j is not None and j["state"] == PENDING:
                self._put(
                    {**j, "state": CANCELLED, "end_time": now, "reason": f"DependencyNeverSatisfied: {why}"}
                )
                done.append(jid)
        return done

    @replicated
    def set_held(self, job_ids: list[str], held: bool) -> dict[str, Any]:
        """Hold pending jobs (the queue passes them over) or release them (sbatch's
        --hold, ``mt-job release``). Jobs no longer pending are in ``not_pending``."""
        return self._change_pending(
            job_ids, lambda j: {**j, "held": held} if bool(j.get("held")) != held else None
        )

    @replicated
    def update(self, job_ids: list[str], changes: dict[str, Any]) -> dict[str, Any]:
        """Change pending jobs' ``time_limit`` (seconds, None: none) and/or
        ``priority`` (an admin's ``mtgpu-admin update``). Jobs no longer pending are in
        ``not_pending``: a running job's limit is its member's to enforce since it
        started."""
        changes = {k: v for k, v in changes.items() if k in ("time_limit", "priority")}
        return self._change_pending(
            job_ids, lambda j: {**j, "spec": {**j["spec"], **changes}} if changes else None
        )

    def _change_pending(
        self, job_ids: list[str], change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any]:
        """Put ``change(job)`` for each pending job of ``job_ids`` (None: unchanged);
        the others that exist are in ``not_pending``."""
        changed, not_pending = [], []
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is None:
                continue
            if j["state"] != PENDING:
                not_pending.append(jid)
            elif (new := change(j)) is not None:
                self._put(new)
                changed.append(jid)
        if changed:
            self.pending_version += 1
        return {"changed": changed, "not_pending": not_pending}

    def _old_part_over(self, j: dict[str, Any], node: str) -> None:
        old = j["old_run"]
        left = [m for m in old["members"] if m != node]
        self._put({**j, "old_run": {**old, "members": left} if left else None})
        if not left:
            self.pending_version += 1

    @replicated
    def old_run_over(self, job_id: str, attempt: int, why: str) -> bool:
        """The earlier run (``attempt``) of a requeued job is over everywhere (its
        members' leases ran out): the job may be placed again."""
        j = self.jobs.get(job_id)
        old = (j or {}).get("old_run")
        if j is None or not old or old["attempt"] != attempt:
            return False
        self._put({**j, "old_run": None, "old_run_end": why})
        self.pending_version += 1
        return True

    @replicated
    def requeue(
        self,
        job_id: str,
        reason: str,
        now: float,
        attempt: int | None = None,
        running_on: list[str] | None = None,
    ) -> dict[str, Any]:
        """Put a running job back in the queue; its next start is attempt + 1.

        A job whose cancel was asked for is not run again: it ends CANCELLED here.
        With ``attempt``, only that attempt (a late decision about an earlier one
        changes nothing). The job is placed again only once its run is known to have
        ended on each of its members: each reports it (:meth:`part_ended`) or the
        scheduler sees its lease run out (:meth:`old_run_over`). ``running_on``: the
        members it may still run on (all of them unless given; none for a member
        already known to be lost).
        """
        j = self.jobs.get(job_id)
        if j is None or j["state"] != RUNNING:
            return {"error": f"job {job_id} is not running", "code": "not_running"}
        if attempt is not None and attempt != attempt_of(j):
            return {"error": f"job {job_id} is not running attempt {attempt}", "code": "stale"}
        if j["cancel_requested"]:
            return self._finish(j, CANCELLED, None, j["reason"], now)
        # The run that ends here held its resources: charged, though not a job of its own.
        ran = {"end_time": now, "start_time": j.get("start_time") or j.get("placed_time")}
        usage.charge(self.usage, {**j, **ran, "state": "REQUEUED"}, count=False)
        members = [m["node"] for m in (j.get("placement") or {}).get("members", [])]
        ended = {n for n, p in (j.get("parts") or {}).items() if p.get("state")}
        still = sorted((set(members) if running_on is None else set(running_on) & set(members)) - ended)
        self._put(
            {
                **j,
                "state": PENDING,
                "placement": None,
                "term": None,
                "start_time": None,
                "reason": reason,
                "requeue_reason": reason,
                "requeues": attempt_of(j) + 1,
                "parts": {},
                "progress": {},
                "usage": {},
                "gpu_info": {},
                "old_run": {"attempt": attempt_of(j), "members": still} if still else None,
            }
        )
        self.pending_version += 1
        return {"job_id": job_id, "state": PENDING, "attempt": attempt_of(j) + 1}

    @replicated
    def purge_usage(self, before_day: str, roll_before: str = "") -> int:
        """Drop the usage sums of days before ``before_day`` (USAGE_RETENTION_DAYS), and
        roll those of days before ``roll_before`` (the 1st of a month) into months."""
        n = usage.drop_before(self.usage, before_day)
        if roll_before:
            n += usage.roll_up(self.usage, roll_before)
        return n

    @replicated
    def purge(self, job_ids: list[str]) -> int:
        n = 0
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is not None and j["state"] in FINAL_STATES:
                del self.jobs[jid]
                self._records.pop(jid, None)
                if j.get("numeric_id"):
                    self.numeric_ids.pop(j["numeric_id"], None)
                tasks = self.array_tasks.get(j.get("array_id") or "")
                if tasks is not None:
                    tasks.pop(jid, None)
                    if not tasks:
                        del self.array_tasks[j["array_id"]]
                self.active_ids.pop(jid, None)
                self.running_ids.pop(jid, None)
                self.old_run_ids.pop(jid, None)
                n += 1
        return n


def _waits_for_old_run(record: dict[str, Any]) -> bool:
    """Whether ``record`` is of a pending or running job whose earlier run may still
    run (:attr:`JobTable.old_run_ids`)."""
    return bool(record.get("old_run")) and record["state"] in ACTIVE_STATES


def _pending(record: dict[str, Any], now: float) -> dict[str, Any]:
    """The record a submission of ``record`` at ``now`` makes (before its ids)."""
    return {
        **codec.FORMAT_2_DEFAULTS,
        **record,
        "state": PENDING,
        "submit_time": now,
        "start_time": None,
        "end_time": None,
        "placement": None,
        "exit_code": None,
        "reason": "",
        "term": None,
        "cancel_requested": False,
    }


def draft(record: dict[str, Any], now: float) -> JobRecord:
    """The typed record a submission of ``record`` at ``now`` would make, with no id
    (sbatch's --test-only asks about it; nothing is added)."""
    return codec.decode_job({**_pending(record, now), "job_id": "", "array_id": None, "array_task": None})


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
