"""The job table: every job and every transition, as replicated state.

A PySyncObj consumer, like the user registry. Each transition (submitted, placed,
started, finished, cancel requested) is one log entry, applied in log order on every
member, so a new scheduler rebuilds its queue from here after a failover and nobody
resubmits anything. Methods are deterministic: callers pass ``now``.

Records are plain dicts (stable to pickle across versions) replaced as a whole, so
readers on the event-loop thread always see a complete record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from mtgpu.schedd.types import GpuMode, JobSpec, ResourceRequest

PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY = (
    "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
FINAL_STATES = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY})
ACTIVE_STATES = frozenset({PENDING, RUNNING})


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """A plain-dict form of a job spec (what the log stores)."""
    d = dataclasses.asdict(spec)
    d["request"]["gpu_mode"] = str(spec.request.gpu_mode)
    return d


def spec_from_dict(d: dict[str, Any]) -> JobSpec:
    """Inverse of :func:`spec_to_dict`."""
    r = dict(d["request"])
    r["gpu_mode"] = GpuMode(r["gpu_mode"])
    r["servers"] = tuple(r.get("servers", ()))
    rest = {k: v for k, v in d.items() if k != "request"}
    rest["warnings"] = tuple(rest.get("warnings", ()))
    return JobSpec(request=ResourceRequest(**r), **rest)


class JobTable(SyncObjConsumer):
    """Jobs by id, plus the next id and submission tokens (idempotent retries)."""

    def __init__(self) -> None:
        # Set before the consumer's __init__, which leaves what exists by then out of
        # the replicated state: who waits for which job, on this member only.
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._wait_lock = threading.Lock()  # the log is applied on PySyncObj's thread
        super().__init__()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.next_id = 1
        self.tokens: dict[str, str] = {}
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

    def _deserialize(self, data: dict[str, Any]) -> None:
        super()._deserialize(data)
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
        self.pending_by_user = {}
        for j in self.jobs.values():
            if j["state"] == PENDING:
                self.pending_by_user[j["user"]] = self.pending_by_user.get(j["user"], 0) + 1

    def _put(self, record: dict[str, Any]) -> None:
        jid = record["job_id"]
        old = self.jobs.get(jid)
        if old is not None and old["state"] == PENDING:
            left = self.pending_by_user.get(old["user"], 0) - 1
            if left > 0:
                self.pending_by_user[old["user"]] = left
            else:
                self.pending_by_user.pop(old["user"], None)
        if record["state"] == PENDING:
            self.pending_by_user[record["user"]] = self.pending_by_user.get(record["user"], 0) + 1
        self.jobs[jid] = record
        if record["state"] in ACTIVE_STATES:
            self.active_ids[jid] = None
        else:
            self.active_ids.pop(jid, None)
        if record["state"] == RUNNING:
            self.running_ids[jid] = None
        else:
            self.running_ids.pop(jid, None)
        if self._waiters:
            with self._wait_lock:
                waiting = self._waiters.pop(jid, ())
            for loop, fut in waiting:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # that loop is closed
                    pass

    async def wait_for(self, job_id: str, test: Callable[[dict[str, Any]], bool],
                       timeout: float) -> dict[str, Any] | None:
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
                except asyncio.TimeoutError:
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

    def tasks_of(self, job_id: str) -> list[dict[str, Any]]:
        """A job, or every task of an array when ``job_id`` is the array's id."""
        j = self.jobs.get(job_id)
        if j is not None:
            return [j]
        return [r for r in list(self.jobs.values()) if r.get("array_id") == job_id]

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

    # -------------------------------------------------------- replicated

    @replicated
    def submit(self, record: dict[str, Any], tasks: list[int] | None, now: float,
               token: str | None = None) -> dict[str, Any]:
        """Add a job (or one record per array task); returns the id(s)."""
        if token and token in self.tokens:
            jid = self.tokens[token]
            return {"job_id": jid, "tasks": [j["job_id"] for j in self.tasks_of(jid)],
                    "duplicate": True}
        jid = str(self.next_id)
        self.next_id += 1
        base = {**record, "state": PENDING, "submit_time": now, "start_time": None,
                "end_time": None, "placement": None, "exit_code": None, "reason": "",
                "term": None, "cancel_requested": False}
        ids = []
        if tasks is None:
            self._put({**base, "job_id": jid, "array_id": None, "array_task": None})
            ids.append(jid)
        else:
            for i in tasks:
                tid = f"{jid}_{i}"
                self._put({**base, "job_id": tid, "array_id": jid, "array_task": i})
                ids.append(tid)
        self.pending_version += 1
        if token:
            self.tokens[token] = jid
            if len(self.tokens) > 100_000:
                for k in list(self.tokens)[:10_000]:
                    del self.tokens[k]
        return {"job_id": jid, "tasks": ids}

    @replicated
    def place(self, job_id: str, placement: dict[str, Any], term: int, now: float) -> dict[str, Any]:
        """The scheduler gave the job its members; it is RUNNING from here, as in Slurm."""
        return self._place(job_id, placement, term, now)

    @replicated
    def place_many(self, placements: list[tuple[str, dict[str, Any]]], term: int,
                   now: float) -> list[dict[str, Any]]:
        """Several placements of one scheduling pass as one log entry: ``place``'s
        answer for each ``(job_id, placement)``, in order."""
        return [self._place(str(jid), placement, term, now) for jid, placement in placements]

    def _place(self, job_id: str, placement: dict[str, Any], term: int, now: float) -> dict[str, Any]:
        j = self.jobs.get(job_id)
        if j is None or j["state"] != PENDING:
            return {"error": f"job {job_id} is not pending", "code": "not_pending"}
        self._put({**j, "state": RUNNING, "placement": placement, "term": term,
                   "placed_time": now, "reason": ""})
        return {"job_id": job_id}

    @replicated
    def started(self, job_id: str, node: str, now: float) -> None:
        j = self.jobs.get(job_id)
        if j is not None and j["state"] == RUNNING and j["start_time"] is None:
            self._put({**j, "start_time": now})

    @replicated
    def set_progress(self, job_id: str, node: str, text: str) -> None:
        """What a member is doing before its part can start (fetching the image, say),
        for ``mt-job show``."""
        j = self.jobs.get(job_id)
        if j is not None and j["state"] == RUNNING:
            self._put({**j, "progress": {**j.get("progress", {}), node: text[:300]}})

    @replicated
    def part_ended(self, job_id: str, node: str, term: int, state: str, exit_code: int | None,
                   reason: str, now: float, attempt: int = 0) -> dict[str, Any]:
        """One member's part of a job ended (the whole job, for a one-member job).

        A job on several members (``nodes=N``) completes when every part has completed;
        the first part that ends otherwise ends the job, naming its member, and the
        agents stop the other parts. A part of an earlier run (another term or attempt:
        the job was requeued since) changes nothing.
        """
        j = self.jobs.get(job_id)
        if j is None or j["state"] in FINAL_STATES:
            return {"error": f"job {job_id} has already ended", "code": "final"}
        if (j["state"] != RUNNING or (term and j.get("term") and term != j["term"])
                or attempt != j.get("requeues", 0)):
            return {"error": f"job {job_id} is not running with term {term}, attempt {attempt}",
                    "code": "stale"}
        members = [m["node"] for m in (j.get("placement") or {}).get("members", [])]
        if len(members) <= 1:
            return self._finish(j, state, exit_code, reason, now)
        parts = {**j.get("parts", {}), node: {"state": state, "exit_code": exit_code,
                                               "reason": reason, "end_time": now}}
        if state != COMPLETED:
            rank = members.index(node) if node in members else "?"
            why = f"its part on {node} (rank {rank}) ended {state}" + (f": {reason}" if reason else "")
            return self._finish({**j, "parts": parts}, state, exit_code, why, now)
        if all(parts.get(m, {}).get("state") == COMPLETED for m in members):
            return self._finish({**j, "parts": parts}, COMPLETED, exit_code, reason, now)
        self._put({**j, "parts": parts})
        return {"job_id": job_id, "state": RUNNING, "parts": len(parts)}

    @replicated
    def finish(self, job_id: str, state: str, exit_code: int | None, reason: str,
               now: float) -> dict[str, Any]:
        j = self.jobs.get(job_id)
        if j is None or j["state"] in FINAL_STATES:
            return {"error": f"job {job_id} has already ended", "code": "final"}
        return self._finish(j, state, exit_code, reason, now)

    def _finish(self, j: dict[str, Any], state: str, exit_code: int | None, reason: str,
                now: float) -> dict[str, Any]:
        job_id = j["job_id"]
        if j["cancel_requested"] and state in (FAILED, COMPLETED, CANCELLED):
            state = CANCELLED  # killed by the cancel, whatever status it ended with
            reason = f"{j['reason']}; {reason}" if reason and reason != j["reason"] else j["reason"]
        self._put({**j, "state": state, "exit_code": exit_code, "reason": reason,
                   "end_time": now, "start_time": j["start_time"] or j.get("placed_time")})
        return {"job_id": job_id, "state": state}

    @replicated
    def cancel(self, job_ids: list[str], by: str, now: float, why: str = "") -> dict[str, Any]:
        """Cancel pending jobs at once; mark running ones for their member to stop.
        ``why`` (an admin's reason) is recorded with who cancelled."""
        done, asked = [], []
        reason = f"cancelled by {by}" + (f": {why}" if why else "")
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is None or j["state"] in FINAL_STATES:
                continue
            if j["state"] == PENDING:
                self._put({**j, "state": CANCELLED, "end_time": now, "reason": reason})
                done.append(jid)
            elif not j["cancel_requested"]:
                self._put({**j, "cancel_requested": True, "reason": reason})
                asked.append(jid)
        return {"cancelled": done, "stopping": asked}

    @replicated
    def requeue(self, job_id: str, reason: str, now: float) -> None:
        j = self.jobs.get(job_id)
        if j is not None and j["state"] == RUNNING:
            self._put({**j, "state": PENDING, "placement": None, "term": None,
                       "start_time": None, "reason": reason, "requeue_reason": reason,
                       "requeues": j.get("requeues", 0) + 1})
            self.pending_version += 1

    @replicated
    def purge(self, job_ids: list[str]) -> int:
        n = 0
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is not None and j["state"] in FINAL_STATES:
                del self.jobs[jid]
                self.active_ids.pop(jid, None)
                self.running_ids.pop(jid, None)
                n += 1
        return n


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
