"""``sacct``: finished and running jobs' accounting records, as Slurm's ``sacct`` prints them.

It reads the same records as ``mt-job show`` (one ``job.list`` call, as the tenant;
an admin may ask for everyone's), then filters and formats them here. The field
names, the default format, ``--parsable``/``--parsable2`` and the exit codes
(``status:signal``) are Slurm's, so scripts written for ``sacct`` keep working.
Each job (or array task) is one line, followed by a line per step (``ID.N``, what
``srun`` ran in it) unless ``-X``; steps are read from the member that ran them
(``job.show``), for at most ``STEP_JOBS`` jobs a listing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal as _signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from mtgpu.cli.slurm.formats import PARTITION, json_id, named, version_line
from mtgpu.cmdline import with_examples
from mtgpu.jobstate import CANCELLED, PENDING, RUNNING, JobState

EPILOG = """\
examples:
  sacct                                  your jobs since midnight
  sacct -j 12,14 --format=JobID,State,ExitCode,Elapsed,MaxRSS,TotalCPU
  sacct -S 2026-03-01 -E now -s F,TO,OOM -P -n
  sacct --json -j 12                     Slurm's JSON shape (jobs: [...])

fields (-o/--format, case-insensitive; NAME%WIDTH sets a width):
  """

#: Slurm's default --format, and those of -b and -l.
DEFAULT_FORMAT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FORMAT = "JobID,State,ExitCode"
LONG_FORMAT = (
    "JobID,JobIDRaw,JobName,Partition,MaxVMSize,MaxRSS,AveRSS,NTasks,AllocCPUS,Elapsed,"
    "State,ExitCode,DerivedExitCode,ReqCPUS,ReqMem,ReqTRES,AllocTRES,TotalCPU,UserCPU,SystemCPU,"
    "NodeList,Start,End"
)
#: Slurm's state abbreviations for -s/--state.
STATE_CODES = {s.code: s for s in JobState}
_LONGEST_ARG = 4096


def hms(seconds: float | None) -> str:
    """Slurm's elapsed form, ``[D-]HH:MM:SS`` (as a time limit is written); empty when unset.

    >>> hms(3725), hms(90061), hms(None)
    ('01:02:05', '1-01:01:01', '')
    """
    from mtgpu.schedd.timefmt import format_time_limit

    return "" if seconds is None else format_time_limit(seconds)


def cpu_clock(seconds: float | None) -> str:
    """Slurm's CPU-time form: ``[D-][HH:]MM:SS.mmm``.

    >>> cpu_clock(1.5), cpu_clock(3661.25), cpu_clock(None)
    ('00:01.500', '01:01:01.250', '')
    """
    if seconds is None:
        return ""
    ms = round(seconds * 1000)
    secs, ms = divmod(ms, 1000)
    days, rest = divmod(secs, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    head = (f"{days}-" if days else "") + (f"{h:02d}:" if h or days else "")
    return f"{head}{m:02d}:{s:02d}.{ms:03d}"


def elapsed(v: dict[str, Any], now: float | None = None) -> float | None:
    """A job's elapsed seconds: its record's once it ended, counted to ``now`` while it
    runs (the record leaves it null then, so that every read of it agrees)."""
    if v.get("elapsed") is not None:
        return float(v["elapsed"])
    if v.get("state") == RUNNING and v.get("start_time"):
        return max(0.0, (now if now is not None else time.time()) - float(v["start_time"]))
    return None


#: --units: the power of 1024 each letter stands for.
UNITS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
#: The most jobs of one listing whose steps are read (one job.show each).
STEP_JOBS = 200


def kib(n: int | None, unit: str | None = None) -> str:
    """A size as sacct prints MaxRSS (``K`` units, rounded down), or in ``unit``
    (``--units``: K, M, G, T, P) with two decimals as Slurm prints it then.

    >>> kib(3 << 20), kib(3 << 20, "M"), kib(None, "G")
    ('3072K', '3.00M', '')
    """
    if n is None:
        return ""
    if unit is None:
        return f"{n // 1024}K"
    return f"{n / 1024 ** UNITS[unit]:.2f}{unit}"


def stamp(t: float | None) -> str:
    """Slurm's time form, local time ``YYYY-MM-DDTHH:MM:SS``; ``Unknown`` when unset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"


def signal_name(sig: int | None) -> str:
    try:
        return _signal.Signals(int(sig or 0)).name if sig else ""
    except ValueError:
        return f"signal {sig}"


def exit_code(v: dict[str, Any]) -> str:
    """Slurm's ``ExitCode``: ``status:signal`` (``0:0`` while it runs)."""
    return v.get("exit") or "0:0"


def _req_tres(v: dict[str, Any]) -> str:
    """What the job asked for, as Slurm's ReqTRES: ``cpu=2,mem=4G,node=1,gres/gpu=1``."""
    from mtgpu.config.units import format_size

    bits = [f"cpu={v['cpus']}", f"mem={format_size(v['ram'])}", f"node={v.get('req_nodes') or 1}"]
    if v.get("req_gpus"):
        bits.append(f"gres/gpu={v['req_gpus']}")
    return ",".join(bits)


def _tres(v: dict[str, Any]) -> str:
    from mtgpu.config.units import format_size

    bits = [f"cpu={v['alloc_cpus']}", f"mem={format_size(v['alloc_ram'])}", f"node={len(v['nodes'])}"]
    if v["alloc_gpus"]:
        bits.append(f"gres/gpu={v['alloc_gpus']}")
    return ",".join(bits) if v["nodes"] else ""


#: Field name (as Slurm spells it) -> (width, right-aligned, value of a job view).
FIELDS: dict[str, tuple[int, bool, Callable[[dict[str, Any]], Any]]] = {
    "JobID": (12, False, lambda v: v["job_id"]),
    "JobIDRaw": (12, False, lambda v: v.get("numeric_id") or v["job_id"]),
    "JobName": (10, True, lambda v: v["name"]),
    # One partition, as squeue, sinfo and scontrol say; the cluster is its own field.
    "Partition": (10, True, lambda v: PARTITION),
    "Cluster": (10, True, lambda v: v.get("cluster") or ""),
    "Account": (10, True, lambda v: v["user"]),
    "User": (9, True, lambda v: v["user"]),
    "AllocCPUS": (10, True, lambda v: v["alloc_cpus"]),
    "NCPUS": (10, True, lambda v: v["alloc_cpus"]),
    "NTasks": (8, True, lambda v: v.get("ntasks", "")),
    "AllocNodes": (10, True, lambda v: len(v["nodes"])),
    "NNodes": (8, True, lambda v: len(v["nodes"])),
    "NodeList": (15, True, lambda v: ",".join(v["nodes"]) or "None assigned"),
    "AllocTRES": (30, True, _tres),
    "AllocGPUS": (9, True, lambda v: v["alloc_gpus"]),
    "GPUs": (30, True, lambda v: ",".join(f"{g['node']}:{g['index']}" for g in v["gpus"])),
    "GPUUUIDs": (40, True, lambda v: ",".join(g.get("uuid") or "?" for g in v["gpus"])),
    "GPUType": (10, True, lambda v: ",".join(sorted({g.get("type") or "?" for g in v["gpus"]}))),
    "ReqCPUS": (8, True, lambda v: v["cpus"]),
    "ReqMem": (10, True, lambda v: kib(v["ram"], v.get("_units")) if v.get("_units") else _size(v["ram"])),
    "ReqTRES": (30, True, _req_tres),
    "State": (10, True, lambda v: v["state"]),
    "ExitCode": (8, True, exit_code),
    # The highest exit status of the job and its steps, as Slurm derives it.
    "DerivedExitCode": (
        15,
        True,
        lambda v: exit_code(v) if v.get("derived_exit") is None else v["derived_exit"],
    ),
    "Signal": (8, True, lambda v: signal_name(v.get("signal"))),
    "Reason": (30, True, lambda v: v.get("reason") or "None"),
    "Timelimit": (10, True, lambda v: hms(v["time_limit"]) if v.get("time_limit") else "UNLIMITED"),
    "TimelimitRaw": (12, True, lambda v: round(v["time_limit"] / 60) if v.get("time_limit") else "UNLIMITED"),
    "Elapsed": (10, True, lambda v: hms(elapsed(v) or 0)),
    "ElapsedRaw": (10, True, lambda v: round(elapsed(v) or 0)),
    "Submit": (19, True, lambda v: stamp(v["submit_time"])),
    "Start": (19, True, lambda v: stamp(v["start_time"])),
    "End": (19, True, lambda v: stamp(v["end_time"])),
    "MaxRSS": (10, True, lambda v: kib(v.get("max_rss"), v.get("_units"))),
    # One task's figure is the average of one (per-step RSS is not sampled: blank).
    "AveRSS": (10, True, lambda v: kib(v.get("max_rss"), v.get("_units"))),
    # Virtual size is not measured: blank, as Slurm leaves what it did not gather.
    "MaxVMSize": (10, True, lambda v: ""),
    "MemoryPeak": (10, True, lambda v: kib(v.get("memory_peak"), v.get("_units"))),
    "UserCPU": (10, True, lambda v: cpu_clock(v.get("cpu_user"))),
    "SystemCPU": (10, True, lambda v: cpu_clock(v.get("cpu_system"))),
    "TotalCPU": (10, True, lambda v: cpu_clock(v.get("total_cpu"))),
    "CPUTime": (10, True, lambda v: hms((elapsed(v) or 0) * v["alloc_cpus"])),
    "CPUTimeRAW": (10, True, lambda v: round((elapsed(v) or 0) * v["alloc_cpus"])),
    "Restarts": (8, True, lambda v: v.get("restarts", 0)),
    "Priority": (10, True, lambda v: v.get("priority")),
    "WorkDir": (30, True, lambda v: v.get("workdir") or ""),
}
_BY_LOWER = {k.lower(): k for k in FIELDS}


def _size(n: int) -> str:
    from mtgpu.config.units import format_size

    return format_size(n)


def parse_format(text: str) -> list[tuple[str, int]]:
    """``-o``'s list: ``JobID,State%20`` -> ``[("JobID", 12), ("State", 20)]``.

    >>> parse_format("jobid,state%20")
    [('JobID', 12), ('State', 20)]
    """
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, width = item.partition("%")
        field = _BY_LOWER.get(name.lower())
        if field is None:
            raise ValueError(f"--format: unknown field {name[:40]!r}; `sacct --helpformat` lists them")
        if width and not (width.isdigit() and 0 < int(width) <= 1000):
            raise ValueError(f"--format: {item[:40]!r}: a width is a number from 1 to 1000")
        out.append((field, int(width) if width else FIELDS[field][0]))
    if not out:
        raise ValueError("--format: name at least one field, such as JobID,State")
    return out


_REL = re.compile(r"^now(?:([+-])(\d+)(seconds?|minutes?|hours?|days?|weeks?|[smhdw])?)?$")


def parse_when(text: str, now: float) -> float:
    """A time as sacct takes it: ``YYYY-MM-DD[THH:MM[:SS]]``, ``MM/DD[/YY]``, ``now``,
    ``now-2days``, ``today``/``midnight``, ``yesterday``; local time.

    >>> parse_when("now-1hours", 7200.0), parse_when("now-1hour", 7200.0)
    (3600.0, 3600.0)
    """
    t = text.strip().lower()
    if len(t) > 40:
        raise ValueError(f"{text[:40]!r}... is too long for a time")
    m = _REL.match(t)
    if m:
        if not m.group(1):
            return now
        unit = (m.group(3) or "s")[0]
        secs = int(m.group(2)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
        return now + secs if m.group(1) == "+" else now - secs
    today = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if t in ("today", "midnight"):
        return today.timestamp()
    if t == "yesterday":
        return (today - dt.timedelta(days=1)).timestamp()
    if t == "tomorrow":
        return (today + dt.timedelta(days=1)).timestamp()
    m = re.match(r"^(\d{1,2})/(\d{1,2})(?:/(\d{2}|\d{4}))?$", t)
    if m:
        year = int(m.group(3)) if m.group(3) else today.year
        year += 2000 if year < 100 else 0
        try:
            return dt.datetime(year, int(m.group(1)), int(m.group(2))).timestamp()
        except ValueError:
            pass
    else:
        try:
            return dt.datetime.fromisoformat(text.strip()).timestamp()
        except ValueError:
            pass
    raise ValueError(
        f"{text!r} is not a time; give YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], now[-N{{days|hours|minutes}}] or today"
    )


def parse_states(text: str) -> set[str]:
    """``-s``'s list: Slurm's names or abbreviations (``F,TO,cd``)."""
    names = set(STATE_CODES.values())
    out: set[str] = set()
    for item in text.split(","):
        s = item.strip().upper()
        if not s:
            continue
        if s in STATE_CODES:
            out.add(STATE_CODES[s])
        elif s == "CANCELED":
            out.add(CANCELLED)
        elif s in names:
            out.add(s)
        else:
            raise ValueError(
                f"--state: unknown state {item[:30]!r}; use {', '.join(sorted(STATE_CODES))} or full names"
            )
    return out


def parse_job_ids(text: str) -> list[str]:
    ids = [i.strip() for i in text.split(",") if i.strip()]
    for i in ids:
        if not re.fullmatch(r"\d{1,12}(_\d{1,8})?", i):
            raise ValueError(f"--jobs: {i[:30]!r} is not a job id (such as 12 or 12_3)")
    return ids


def select(
    views: Iterable[dict[str, Any]],
    *,
    job_ids: list[str] | None,
    states: set[str] | None,
    start: float | None,
    end: float | None,
    now: float,
) -> list[dict[str, Any]]:
    """The jobs sacct shows: named by ``job_ids`` (an array's id names its tasks, a
    task's numeric id that task), in
    ``states``, and in the window: submitted before ``end`` and not ended before
    ``start`` (pending and running jobs have not ended)."""
    out = []
    for v in views:
        if job_ids and not named(v, job_ids):
            continue
        if states and v["state"] not in states:
            continue
        if end is not None and v["submit_time"] > end:
            continue
        if start is not None and (v.get("end_time") or now) < start:
            continue
        out.append(v)
    out.sort(key=lambda v: (_id_key(v["job_id"]), v["submit_time"]))
    return out


def step_view(job: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """A step's line, in the fields of its job's view: its id (``ID.N``), the first
    word of what it ran as its name, its state, exit code, times, member and tasks;
    what steps do not measure (RSS, CPU time) is blank."""
    code = step.get("exit_code")
    start, end = step.get("start_time"), step.get("end_time")
    return {
        **job,
        "job_id": step["step_id"],
        "numeric_id": f"{job.get('numeric_id') or job['job_id']}.{step['step']}",
        "name": (str(step.get("command") or "").split() or ["step"])[0].rsplit("/", 1)[-1][:64],
        "state": step["state"],
        "exit": f"{code}:0" if code is not None else "0:0",
        "derived_exit": "",  # a job's field: blank on its steps, as Slurm's
        "signal": None,
        "reason": None,
        "start_time": start,
        "end_time": end,
        "elapsed": (end - start) if end and start else None,
        "nodes": [step["node"]] if step.get("node") else job["nodes"],
        "ntasks": step.get("ntasks", 1),
        "max_rss": None,
        "memory_peak": None,
        "cpu_user": None,
        "cpu_system": None,
        "total_cpu": None,
    }


def with_steps(
    views: list[dict[str, Any]], steps_of: Callable[[str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each job's view followed by its steps' (``steps_of`` a job id -> its steps);
    a job's DerivedExitCode is the highest exit status among it and its steps."""
    out = []
    for v in views:
        steps = steps_of(v["job_id"]) if v["state"] != PENDING else []
        codes = [int(str(v.get("exit") or "0:0").split(":")[0])] + [
            int(s["exit_code"]) for s in steps if s.get("exit_code") is not None
        ]
        out.append({**v, "ntasks": 1, "derived_exit": f"{max(codes)}:0" if steps else None})
        out += [step_view(v, s) for s in steps]
    return out


def _id_key(jid: str) -> tuple[int, int]:
    base, _, task = jid.partition("_")
    return (int(base) if base.isdigit() else 0, int(task) if task.isdigit() else -1)


def fixed_width(value: Any, width: int, right: bool) -> str:
    """A cell as sacct pads it; a longer value is cut and ends with ``+``.

    >>> fixed_width("averylongname", 10, True), fixed_width(12, 5, False)
    ('averylong+', '12   ')
    """
    text = "" if value is None else str(value)
    if len(text) > width:
        text = text[: width - 1] + "+"
    return text.rjust(width) if right else text.ljust(width)


def render(
    views: list[dict[str, Any]], fields: list[tuple[str, int]], *, parsable: str = "", header: bool = True
) -> str:
    """sacct's text: fixed-width columns with a dashed rule, or with ``parsable``
    (``"|"``: a trailing bar, as ``-p``; ``"2"``: none, as ``-P``) bar-separated."""
    lines = []
    if parsable:
        tail = "|" if parsable == "|" else ""
        if header:
            lines.append("|".join(f for f, _ in fields) + tail)
        for v in views:
            lines.append("|".join(str(FIELDS[f][2](v)) for f, _ in fields) + tail)
        return "\n".join(lines)
    if header:
        lines.append(" ".join(fixed_width(f, w, FIELDS[f][1]) for f, w in fields))
        lines.append(" ".join("-" * w for _, w in fields))
    for v in views:
        lines.append(" ".join(fixed_width(FIELDS[f][2](v), w, FIELDS[f][1]) for f, w in fields))
    return "\n".join(lines)


def _ended_exit(status: int, sig: int) -> dict[str, Any]:
    """An ended job's or step's ``exit_code`` in Slurm 22.05's (dbv0.0.38) shape:
    ``status`` one word, ``return_code`` a number, ``signal`` with ``signal_id`` and
    strsignal's name. A nonzero status is ``ERROR`` with its code (22.05 itself says
    ``SUCCESS`` and 0 for every status, which loses it)."""
    if sig:
        return {
            "status": "SIGNALED",
            "return_code": None,
            "signal": {"signal_id": sig, "name": _signal.strsignal(sig) or f"Signal {sig}"},
        }
    return {"status": "SUCCESS" if status == 0 else "ERROR", "return_code": status}


def _json_time(seconds: float | None) -> int:
    return int(seconds or 0)


def _cpu_time(seconds: float | None) -> dict[str, int]:
    """CPU time as Slurm's JSON splits it (0 where it was not measured, as Slurm's)."""
    us = round((seconds or 0) * 1_000_000)
    return {"seconds": us // 1_000_000, "microseconds": us % 1_000_000}


def slurm_json(
    views: list[dict[str, Any]], steps_of: Callable[[str], list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Slurm 22.05's ``sacct --json`` shape (openapi dbv0.0.38), for the fields MTGPU
    has: ``job_id`` a number, ``state`` ``{"current": "COMPLETED", "reason": ...}`` with
    one word as squeue's ``job_state``, ``array`` ``{"job_id": 0, "task_id": null}``
    outside an array, ``time.limit`` minutes (null: none), each job's steps in its
    ``steps`` (``steps_of``: a job id -> its steps)."""
    from mtgpu.cli.slurm.formats import json_meta

    jobs = []
    for v in views:
        code, _, sig = exit_code(v).partition(":")
        ended = v.get("exit") is not None
        steps = list(steps_of(v["job_id"])) if steps_of and v["state"] != PENDING else []
        number = json_id(v.get("numeric_id") or v["job_id"])
        step_json = []
        for st in steps:
            s_code = st.get("exit_code")
            s_start, s_end = st.get("start_time"), st.get("end_time")
            node = st.get("node") or (v["nodes"][0] if v["nodes"] else "")
            step_json.append(
                {
                    "step": {"job_id": number, "id": st["step"], "name": step_view(v, st)["name"]},
                    "state": st["state"],
                    "exit_code": _ended_exit(int(s_code), 0)
                    if s_code is not None
                    else {"status": "PENDING", "return_code": None},
                    "nodes": {"count": 1, "range": node, "list": [node]},
                    "tasks": {"count": st.get("ntasks", 1)},
                    "time": {
                        "start": _json_time(s_start),
                        "end": _json_time(s_end),
                        "elapsed": _json_time((s_end - s_start) if s_start and s_end else 0),
                        "suspended": 0,
                    },
                }
            )
        codes = [int(code)] + [int(st["exit_code"]) for st in steps if st.get("exit_code") is not None]
        jobs.append(
            {
                "job_id": number,
                "array": {
                    "job_id": json_id(v.get("array_id")) or 0,
                    "task_id": v.get("array_task"),
                    "task": None,
                    "limits": {"max": {"running": {"tasks": 0}}},
                },
                "name": v["name"],
                "user": v["user"],
                "account": v["user"],
                "partition": PARTITION,
                "cluster": v.get("cluster") or "",
                "priority": v.get("priority"),
                "state": {"current": v["state"], "reason": v.get("reason") or "None"},
                "exit_code": _ended_exit(int(code), int(sig))
                if ended
                else {"status": "PENDING", "return_code": None},
                "derived_exit_code": _ended_exit(max(codes), 0)
                if ended
                else {"status": "PENDING", "return_code": None},
                "time": {
                    "submission": _json_time(v["submit_time"]),
                    "eligible": _json_time(v["submit_time"]),
                    "start": _json_time(v["start_time"]),
                    "end": _json_time(v["end_time"]),
                    "elapsed": round(elapsed(v) or 0),
                    "suspended": 0,
                    "limit": round(v["time_limit"] / 60) if v.get("time_limit") else None,
                    "user": _cpu_time(v.get("cpu_user")),
                    "system": _cpu_time(v.get("cpu_system")),
                    "total": _cpu_time(v.get("total_cpu")),
                },
                "nodes": ",".join(v["nodes"]) or "None assigned",
                "allocation_nodes": len(v["nodes"]),
                "required": {"CPUs": v.get("cpus"), "memory": (v.get("ram") or 0) >> 20},
                "tres": {
                    "allocated": [
                        {"type": "cpu", "name": "", "id": 1, "count": v["alloc_cpus"]},
                        {"type": "mem", "name": "", "id": 2, "count": v["alloc_ram"] >> 20},
                        {"type": "node", "name": "", "id": 4, "count": len(v["nodes"])},
                    ]
                    + (
                        [{"type": "gres", "name": "gpu", "id": 1001, "count": v["alloc_gpus"]}]
                        if v["alloc_gpus"]
                        else []
                    )
                    if v["nodes"]
                    else [],
                    "requested": [
                        {"type": "cpu", "name": "", "id": 1, "count": v.get("cpus")},
                        {"type": "mem", "name": "", "id": 2, "count": (v.get("ram") or 0) >> 20},
                        {"type": "node", "name": "", "id": 4, "count": v.get("req_nodes") or 1},
                    ]
                    + (
                        [{"type": "gres", "name": "gpu", "id": 1001, "count": v["req_gpus"]}]
                        if v.get("req_gpus")
                        else []
                    ),
                },
                "working_directory": v.get("workdir"),
                "steps": step_json,
                "gpus": v["gpus"],
                "max_rss": v.get("max_rss"),
                "restart_cnt": v.get("restarts", 0),
            }
        )
    return {"meta": json_meta(), "errors": [], "jobs": jobs}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sacct",
        description="Accounting records of your jobs (finished and running), as Slurm's sacct shows them.",
        epilog=EPILOG + ",".join(FIELDS) + "\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="the daemon's configuration (default $MTGPU_CONFIG)")
    p.add_argument("-j", "--jobs", help="only these jobs (comma-separated; an array's id: all its tasks)")
    p.add_argument("-S", "--starttime", help="jobs not ended before this (default: midnight; none with -j)")
    p.add_argument("-E", "--endtime", help="jobs submitted before this (default: now)")
    p.add_argument("-s", "--state", help="only these states (CD,F,CA,TO,NF,OOM,PD,R or full names)")
    p.add_argument("-o", "--format", help=f"fields to show (default {DEFAULT_FORMAT})")
    p.add_argument("-p", "--parsable", action="store_true", help="fields separated by |, with a trailing |")
    p.add_argument("-P", "--parsable2", action="store_true", help="fields separated by |, no trailing |")
    p.add_argument("-n", "--noheader", action="store_true", help="no header lines")
    p.add_argument("-X", "--allocations", action="store_true", help="jobs only, without their steps")
    p.add_argument("-b", "--brief", action="store_true", help=f"the fields {BRIEF_FORMAT}")
    p.add_argument(
        "-l", "--long", action="store_true", help="many fields (see LONG_FORMAT in `sacct --help`)"
    )
    p.add_argument("--name", help="only jobs of these names (comma-separated)")
    p.add_argument("--units", type=str.upper, choices=sorted(UNITS), help="memory fields in K, M, G, T or P")
    p.add_argument("-a", "--allusers", action="store_true", help="every user's jobs (admins)")
    p.add_argument("-u", "--user", "--uid", dest="user", help="this user's jobs (admins; others: yourself)")
    p.add_argument("-e", "--helpformat", action="store_true", help="list the fields --format takes")
    p.add_argument("--json", action="store_true", help="Slurm's JSON shape: {jobs: [...]}")
    p.add_argument(
        "-V", "--version", action="version", version=version_line(), help="the Slurm release followed"
    )
    return with_examples(p, {})  # its examples are in EPILOG, with the fields


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.helpformat:
        print(" ".join(FIELDS))
        return 0
    from mtgpu.cli.common import run_cli, tenant_client
    from mtgpu.errors import MtgpuError

    def run() -> int:
        import json

        now = time.time()
        try:
            for name in ("jobs", "starttime", "endtime", "state", "format", "user", "name"):
                val = getattr(args, name)
                if val is not None and len(val) > _LONGEST_ARG:
                    raise ValueError(f"--{name} is longer than {_LONGEST_ARG} characters")
            chosen = args.format or (
                BRIEF_FORMAT if args.brief else LONG_FORMAT if args.long else DEFAULT_FORMAT
            )
            fields = parse_format(chosen)
            names = {n.strip() for n in args.name.split(",") if n.strip()} if args.name else None
            job_ids = parse_job_ids(args.jobs) if args.jobs else None
            states = parse_states(args.state) if args.state else None
            if args.starttime:
                start: float | None = parse_when(args.starttime, now)
            else:
                start = None if job_ids else parse_when("midnight", now)
            end = parse_when(args.endtime, now) if args.endtime else None
        except ValueError as exc:
            print(f"sacct: {exc}", file=sys.stderr)
            return 2
        user = args.user
        if not args.allusers and user is None and os.getuid() != 0:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        api = tenant_client(args)
        views = api.call_all("job.list", all=True, **({"user": user} if user else {}))
        shown = select(views, job_ids=job_ids, states=states, start=start, end=end, now=now)
        if names is not None:
            shown = [v for v in shown if v["name"] in names]

        def steps_of(jid: str) -> list[dict[str, Any]]:
            try:
                return list(api.call("job.show", job_id=jid).get("steps") or [])
            except MtgpuError:  # ended and purged meanwhile, or another member's
                return []

        with_them = not args.allocations and len(shown) <= STEP_JOBS
        if args.json:
            print(json.dumps(slurm_json(shown, steps_of if with_them else None), indent=2, sort_keys=True))
            return 0
        if with_them:
            shown = with_steps(shown, steps_of)
        if args.units:
            shown = [{**v, "_units": args.units} for v in shown]
        mode = "2" if args.parsable2 else ("|" if args.parsable else "")
        out = render(shown, fields, parsable=mode, header=not args.noheader)
        if out:
            print(out)
        return 0

    return run_cli("sacct", run)


def show_lines(v: dict[str, Any]) -> list[str]:
    """``mt-job show``'s accounting lines for one job view."""
    from mtgpu.config.units import format_size

    gpus = (
        ", ".join(
            f"{g['node']}:{g['index']}"
            + (
                f" ({', '.join(x for x in (g.get('type'), g.get('uuid')) if x)})"
                if g.get("uuid") or g.get("type")
                else ""
            )
            for g in v["gpus"]
        )
        or "-"
    )
    sig = v.get("signal")
    code = v["exit_code"]
    if code is None and not sig:
        ended = "-"
    else:
        ended = (
            f"{code or 0}:{sig or 0} (status {code or 0}"
            + (f", signal {sig} {signal_name(sig)}" if sig else "")
            + ")"
        )
    limit = hms(v["time_limit"]) if v.get("time_limit") else "UNLIMITED"
    lines = [
        f"alloc:     {v['alloc_cpus']} CPUs, {format_size(v['alloc_ram'])} RAM, {v['alloc_gpus']} GPUs"
        if v["nodes"]
        else f"request:   {v['cpus']} CPUs, {format_size(v['ram'])} RAM per member",
        f"gpus:      {gpus}",
        f"time:      limit {limit}, elapsed {hms(elapsed(v)) or '-'}",
        f"exit_code: {ended}",
    ]
    if v.get("max_rss") is not None or v.get("total_cpu") is not None:
        lines.append(
            f"used:      max_rss {format_size(v['max_rss']) if v.get('max_rss') is not None else '-'}, "
            f"memory_peak {format_size(v['memory_peak']) if v.get('memory_peak') is not None else '-'}, "
            f"cpu user {cpu_clock(v.get('cpu_user')) or '-'} system {cpu_clock(v.get('cpu_system')) or '-'}"
        )
    lines.append(f"restarts:  {v.get('restarts', 0)}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
