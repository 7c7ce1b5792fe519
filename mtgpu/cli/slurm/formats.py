"""Slurm's output formats, from MTGPU's job and node views (pure functions).

The shapes follow Slurm 22.05's own output (``squeue``, ``sinfo``, ``scontrol show``):
the same columns, widths, truncation and state codes, so scripts that cut or parse
those commands' output keep working.

>>> elapsed(62)
'1:02'
>>> collapse_indices([1, 2, 3, 5, 7, 8])
'1-3,5,7-8'
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mtgpu.jobstate import BY_NAME_OR_CODE, PENDING, RUNNING, JobState
from mtgpu.text import natural_key

#: The Slurm release whose commands' output and options these follow (Debian 12's),
#: as ``--version`` names it for scripts that check it.
SLURM_COMPAT = "22.05.8"


def version_line() -> str:
    """What ``-V``/``--version`` prints: ``slurm 22.05.8 (MTGPU 0.1.0)``."""
    import mtgpu

    return f"slurm {SLURM_COMPAT} (MTGPU {mtgpu.__version__})"


#: squeue's -O/--Format names -> the -o letter with the same column.
SQUEUE_FORMAT_NAMES = {
    "jobid": "i",
    "jobarrayid": "i",
    "arrayjobid": "F",
    "arraytaskid": "K",
    "partition": "P",
    "name": "j",
    "username": "u",
    "userid": "u",
    "statecompact": "t",
    "state": "T",
    "timeused": "M",
    "timelimit": "l",
    "timeleft": "L",
    "numnodes": "D",
    "reasonlist": "R",
    "nodelist": "N",
    "reason": "r",
    "numcpus": "C",
    "minmemory": "m",
    "tres-per-node": "b",
    "priority": "Q",
    "submittime": "V",
    "starttime": "S",
    "endtime": "e",
    "workdir": "Z",
    "command": "o",
}


def format_from_names(text: str) -> str:
    """``-O/--Format``'s ``name[:[.]size]`` list as an ``-o`` format: each column 20
    wide unless a size is given (``.``: right-justified), side by side with nothing
    between them, as Slurm's.

    >>> format_from_names("jobid:10,name,state:.8")
    '%10i%20j%.8T'
    """
    out = []
    for item in text.split(","):
        name, _, size = item.strip().partition(":")
        letter = SQUEUE_FORMAT_NAMES.get(name.lower())
        if letter is None:
            raise FormatError(
                f"unknown field {name[:40]!r} in --Format; known: {', '.join(SQUEUE_FORMAT_NAMES)}"
            )
        right = size.startswith(".")
        size = size.lstrip(".") or "20"
        if not size.isdigit() or not 0 < int(size) <= 1000:
            raise FormatError(f"--Format {item[:40]!r}: a size is a number from 1 to 1000")
        out.append(f"%{'.' if right else ''}{int(size)}{letter}")
    return "".join(out)


def sort_by(jobs: Sequence[dict[str, Any]], keys: str, now: float) -> list[dict[str, Any]]:
    """``-S/--sort``: a comma list of ``-o`` letters, each ``-`` for descending
    (``-t,i``), as Slurm's; values compared as text with numbers in order."""
    fields = _job_fields(now)
    order = []
    for key in reversed([k.strip() for k in keys.split(",") if k.strip()]):
        desc, letter = key.startswith("-"), key.lstrip("+-")
        if letter not in fields or letter == "%":
            raise FormatError(f"unknown sort field {key[:20]!r}; give -o letters such as i, t, u, -M")
        order.append((letter, desc))
    out = list(jobs)
    for letter, desc in order:  # stable: the first key sorts last
        get = fields[letter][1]

        def sort_key(
            j: dict[str, Any], get: Callable[[dict[str, Any]], Any] = get
        ) -> tuple[tuple[int, int | str], ...]:
            return natural_key(str(get(j)))

        out.sort(key=sort_key, reverse=desc)
    return out


#: squeue's default format (``squeue`` with no -o), as Slurm prints it.
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
#: ``squeue -l``.
SQUEUE_LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
#: ``squeue --start``: pending jobs with their expected start (where the scheduler
#: holds resources back for one, the next in line; N/A for the others) and why they wait.
SQUEUE_START = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R"
#: sinfo's default format, and ``sinfo -N``.
SINFO_DEFAULT = "%#P %.5a %.10l %.6D %.6t %N"
SINFO_NODES = "%#N %.6D %#P %6t"
#: ``sinfo -l``, ``sinfo -N -l`` and ``sinfo -s``, as Slurm 22.05's opts.c has them.
SINFO_LONG = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
SINFO_NODES_LONG = "%#N %.6D %#P %.11T %4c %.8z %.6m %.8d %.6w %.8f %20E"
SINFO_SUMMARY = "%#P %.5a %.10l %.16F %N"
#: The one partition MTGPU has: the whole cluster (shown with sinfo's default mark).
PARTITION = "mtgpu"

#: Slurm's compact state codes (``%t``).
STATE_CODES = {**{s.value: s.code for s in JobState}, "MIXED": "R"}
#: What ``-t/--state`` accepts: Slurm's names and codes, for MTGPU's states.
STATE_NAMES: dict[str, str] = {**BY_NAME_OR_CODE}
STATE_NAMES["CG"] = RUNNING  # completing: still running here until it has ended


def elapsed(seconds: float | None) -> str:
    """Slurm's duration (``%M``): ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``.

    >>> elapsed(0), elapsed(3600), elapsed(90061)
    ('0:00', '1:00:00', '1-01:01:01')
    """
    s = max(0, int(seconds or 0))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def time_limit(seconds: float | None) -> str:
    """A time limit as Slurm shows it (``UNLIMITED`` without one).

    >>> time_limit(None), time_limit(7200)
    ('UNLIMITED', '2:00:00')
    """
    return "UNLIMITED" if not seconds else elapsed(seconds)


def run_time(job: dict[str, Any], now: float) -> float:
    """How long ``job`` has run (0 until it starts; up to its end once ended)."""
    start = job.get("start_time")
    if not start:
        return 0.0
    return float((job.get("end_time") or now) - start)


def collapse_indices(indices: Iterable[int]) -> str:
    """Array indices as Slurm writes them: runs of consecutive ones as ``A-B``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indices)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def named(v: dict[str, Any], job_ids: list[str]) -> bool:
    """Whether ``job_ids`` name the job view ``v``: by its id (``13_1``), its array's
    id (``13``) or, for an array task, its own numeric id (its ``SLURM_JOB_ID``).

    >>> v = {"job_id": "13_1", "array_id": "13", "numeric_id": "14"}
    >>> named(v, ["13"]), named(v, ["14"]), named(v, ["13_1"]), named(v, ["15"])
    (True, True, True, False)
    """
    return any(i in job_ids for i in (v["job_id"], v.get("array_id"), v.get("numeric_id")) if i)


def collapse_pending_arrays(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs with each array's pending tasks shown as one row, ``13_[4-99]``, as
    ``squeue`` shows them (running and finished tasks keep a row each). The row is
    the first pending task's view with its ``job_id`` replaced."""
    out: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        if j["state"] == PENDING and j.get("array_id") and j.get("array_task") is not None:
            group = groups.get(j["array_id"])
            if group is None:
                groups[j["array_id"]] = group = []
                out.append({"_group": j["array_id"]})
            group.append(j)
        else:
            out.append(j)
    rows = []
    for j in out:
        if "_group" not in j:
            rows.append(j)
            continue
        tasks = groups[j["_group"]]
        if len(tasks) == 1:
            rows.append(tasks[0])
        else:
            idx = collapse_indices(t["array_task"] for t in tasks)
            rows.append(
                {
                    **tasks[0],
                    "job_id": f"{j['_group']}_[{idx}]",
                    "numeric_id": j["_group"],  # the array's, as Slurm's %A shows it
                    "tasks_collapsed": len(tasks),
                }
            )
    return rows


def sort_jobs(jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs in squeue's order: pending first, then running, ids in natural order."""
    rank = {PENDING: 0, RUNNING: 1}
    return sorted(jobs, key=lambda j: (rank.get(j["state"], 2), natural_key(j["job_id"])))


def where(job: dict[str, Any]) -> str:
    """``%R``: the nodes of a running job, ``(Reason)`` of a pending one."""
    if job["state"] == PENDING:
        return f"({job.get('reason') or 'None'})"
    return ",".join(job.get("nodes") or ()) or ("(None)" if job["state"] == RUNNING else "")


def _job_fields(now: float) -> dict[str, tuple[str, Callable[[dict[str, Any]], Any]]]:
    def ts(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda j: iso_time(j.get(key))

    return {
        "i": ("JOBID", lambda j: j["job_id"]),
        # Slurm's %A: a value of its own per array task (its numeric id).
        "A": ("JOBID", lambda j: j.get("numeric_id") or j["job_id"]),
        "F": ("ARRAY_JOB_ID", lambda j: j.get("array_id") or j["job_id"]),
        "K": ("ARRAY_TASK_ID", lambda j: j.get("array_task") if j.get("array_task") is not None else "N/A"),
        "P": ("PARTITION", lambda j: PARTITION),
        "j": ("NAME", lambda j: j["name"]),
        "u": ("USER", lambda j: j["user"]),
        "t": ("ST", lambda j: STATE_CODES.get(j["state"], j["state"][:2])),
        "T": ("STATE", lambda j: j["state"]),
        "M": ("TIME", lambda j: elapsed(run_time(j, now))),
        "l": ("TIME_LIMIT", lambda j: time_limit(j.get("time_limit"))),
        "L": (
            "TIME_LEFT",
            lambda j: time_limit(
                max(0.0, j["time_limit"] - run_time(j, now)) if j.get("time_limit") else None
            ),
        ),
        "D": ("NODES", lambda j: max(1, len(j.get("nodes") or ()))),
        "R": ("NODELIST(REASON)", where),
        "N": ("NODELIST", lambda j: ",".join(j.get("nodes") or ())),
        "r": ("REASON", lambda j: j.get("reason") or "None"),
        "C": ("CPUS", lambda j: j.get("cpus", "")),
        "m": ("MIN_MEMORY", lambda j: mem_mb(j.get("ram"))),
        "b": ("TRES_PER_NODE", lambda j: f"gres/gpu:{n}" if (n := gpus_per_node(j)) else "N/A"),
        "Q": ("PRIORITY", lambda j: j.get("priority", "")),
        "V": ("SUBMIT_TIME", ts("submit_time")),
        # A pending job's: when the scheduler expects it to start, if it knows.
        "S": ("START_TIME", lambda j: iso_time(j.get("start_time") or j.get("expected_start"))),
        "e": ("END_TIME", ts("end_time")),
        "Z": ("WORK_DIR", lambda j: j.get("workdir", "")),
        "o": ("COMMAND", lambda j: j.get("command") or j.get("workdir", "")),
        "%": ("%", lambda j: "%"),
    }


def mem_mb(ram: int | None) -> str:
    """A memory size as Slurm writes one (``20000M``, ``32G``)."""
    if not ram:
        return "0"
    mb = ram >> 20
    return f"{mb >> 10}G" if mb and mb % 1024 == 0 else f"{mb}M"


def iso_time(t: float | None) -> str:
    """A time as Slurm writes one (``2026-12-02T02:29:00``), ``N/A`` without one."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "N/A"


_SPEC = re.compile(r"%(\.)?(#)?(\d+)?([A-Za-z%])")


class FormatError(ValueError):
    """A ``-o/--format`` string with a field this command does not know."""


def render(
    rows: Sequence[dict[str, Any]],
    fmt: str,
    fields: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]],
    header: bool = True,
) -> list[str]:
    """Lines of ``rows`` in a Slurm format string: ``%[.][#][width]X`` fields and
    literal text between them. A width pads (``.`` right-justifies) and truncates,
    as Slurm does; ``#`` sizes the column to its widest value."""
    parts: list[tuple[str, bool, int | None, str]] = []  # (literal, right, width, letter)
    pos = 0
    for m in _SPEC.finditer(fmt):
        if m.group(4) not in fields:
            raise FormatError(f"unknown field %{m.group(4)} in format {fmt!r}")
        width: int | None = int(m.group(3)) if m.group(3) else None
        if m.group(2):
            head, get = fields[m.group(4)]
            width = max([len(head), *(len(str(get(r))) for r in rows)])
        parts.append((fmt[pos : m.start()], bool(m.group(1)), width, m.group(4)))
        pos = m.end()
    tail = fmt[pos:]

    def line(values: list[str]) -> str:
        out = []
        for (lit, right, width, _), v in zip(parts, values, strict=True):
            if width is not None:
                v = v[:width]
                v = v.rjust(width) if right else v.ljust(width)
            out.append(lit + v)
        return "".join(out) + tail

    lines = [line([fields[p[3]][0] for p in parts])] if header else []
    for r in rows:
        lines.append(line([str(fields[p[3]][1](r)) for p in parts]))
    return lines


def squeue_lines(jobs: Sequence[dict[str, Any]], fmt: str, now: float, header: bool = True) -> list[str]:
    """``squeue`` output for ``jobs`` (views as ``mt-job list --json`` has them)."""
    return render(jobs, fmt, _job_fields(now), header)


def node_state(node: dict[str, Any]) -> str:
    """A member's state in sinfo's words: idle, mix, alloc, drain, drng, down, unk."""
    state = node.get("state", "unknown")
    gpus = node.get("gpus") or []
    busy = sum(1 for g in gpus if g.get("jobs"))
    if state in ("drain", "draining"):
        return "drng" if busy else "drain"
    if state == "down":
        return "down"
    if state not in ("up",):
        return "unk"
    cpus, cpus_alloc = int(node.get("cpus") or 0), int(node.get("cpus_alloc") or 0)
    if not gpus:  # by its CPUs, as Slurm's
        return "alloc" if cpus and cpus_alloc >= cpus else "mix" if cpus_alloc else "idle"
    return "alloc" if busy == len(gpus) else "mix" if busy or cpus_alloc else "idle"


def compress_hostlist(names: Iterable[str]) -> str:
    """Host names as Slurm's host list: ``gpu[01-03],login``.

    >>> compress_hostlist(["gpu01", "gpu02", "gpu03", "login", "gpu05"])
    'gpu[01-03,05],login'
    """
    by_prefix: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)", n)
        if not m:
            plain.append(n)
            order.append(n)
            continue
        key = (m.group(1), len(m.group(2)))
        if key not in by_prefix:
            by_prefix[key] = []
            order.append(key)
        by_prefix[key].append(int(m.group(2)))
    out = []
    for k in order:
        if isinstance(k, str):
            out.append(k)
            continue
        prefix, digits = k
        nums = sorted(set(by_prefix[k]))
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]:0{digits}d}")
            continue
        ranges = []
        for part in collapse_indices(nums).split(","):
            a, _, b = part.partition("-")
            ranges.append(f"{int(a):0{digits}d}" + (f"-{int(b):0{digits}d}" if b else ""))
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)


#: The most host names a host list may expand to (``node[1-1000000000]`` is a typo).
MAX_HOSTS = 65536


class HostlistError(ValueError):
    """A host list that is not Slurm's syntax, said in one line."""


def expand_hostlist(text: str) -> list[str]:
    """A Slurm host list as its host names, in order, as ``scontrol show hostnames``
    prints them: each ``[a-b,c]`` gives its numbers at ``a``'s width (zero-padded), and
    several brackets in one name give every combination. Raises :class:`HostlistError`.

    >>> expand_hostlist("node[01-03,07],gpu1")
    ['node01', 'node02', 'node03', 'node07', 'gpu1']
    >>> expand_hostlist("r[1-2]n[8-10]")
    ['r1n8', 'r1n9', 'r1n10', 'r2n8', 'r2n9', 'r2n10']
    """
    items: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch == "[":
            if depth:
                raise HostlistError(f"{text!r}: a '[' inside brackets")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"{text!r}: a ']' without its '['")
            depth = 0
        elif not depth and (ch == "," or ch.isspace()):
            items.append(cur)
            cur = ""
            continue
        cur += ch
    if depth:
        raise HostlistError(f"{text!r}: a '[' without its ']'")
    items.append(cur)
    out: list[str] = []
    for item in filter(None, items):
        names = [""]
        for literal, bracket, inside in re.findall(r"([^\[]*)(\[([^\]]*)\])?", item):
            names = [n + literal for n in names]
            if not bracket:
                continue
            numbers: list[str] = []
            for part in inside.split(","):
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
                if not m:
                    raise HostlistError(f"{text!r}: {part!r} is not a number or a range such as 01-04")
                lo, hi = m.group(1), m.group(2) or m.group(1)
                if int(hi) < int(lo):
                    raise HostlistError(f"{text!r}: the range {part} goes down")
                if int(hi) - int(lo) + len(numbers) >= MAX_HOSTS:
                    raise HostlistError(f"{text!r}: more than {MAX_HOSTS} host names")
                numbers += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
            if len(names) * len(numbers) + len(out) > MAX_HOSTS:
                raise HostlistError(f"{text!r}: more than {MAX_HOSTS} host names")
            names = [n + x for n in names for x in numbers]
        out += names
        if len(out) > MAX_HOSTS:
            raise HostlistError(f"{text!r}: more than {MAX_HOSTS} host names")
    return out


#: sinfo's states whose CPUs and members count as "other" in %C and %F.
_OTHER_STATES = ("drain", "drng", "down", "unk")


def cpus_aiot(nodes: Sequence[dict[str, Any]]) -> str:
    """sinfo's ``%C``: CPUs allocated/idle/other/total over ``nodes`` (other: those
    of drained, down or unknown members not allocated), as Slurm's."""
    a = i = o = t = 0
    for n in nodes:
        total = int(n.get("cpus") or 0)
        alloc = min(total, int(n.get("cpus_alloc") or 0))
        t += total
        a += alloc
        if node_state(n) in _OTHER_STATES:
            o += total - alloc
        else:
            i += total - alloc
    return f"{a}/{i}/{o}/{t}"


def nodes_aiot(nodes: Sequence[dict[str, Any]]) -> str:
    """sinfo's ``%F``: members allocated (in whole or part)/idle/other/total."""
    states = [node_state(n) for n in nodes]
    other = sum(1 for s in states if s in _OTHER_STATES)
    idle = states.count("idle")
    return f"{len(states) - other - idle}/{idle}/{other}/{len(states)}"


def sinfo_lines(
    nodes: Sequence[dict[str, Any]], node_oriented: bool, fmt: str | None, header: bool, summary: bool = False
) -> list[str]:
    """``sinfo`` output: one row per state (or per member with ``-N``, or one for the
    partition with ``summary``, sinfo's ``-s``)."""
    if node_oriented:
        groups = [{"names": [n["name"]], "state": node_state(n), "node": n, "all": [n]} for n in nodes]
    elif summary:
        groups = [{"names": [n["name"] for n in nodes], "state": "", "node": nodes[0] if nodes else {}}]
        groups[0]["all"] = list(nodes)
    else:
        by_state: dict[str, list[dict[str, Any]]] = {}
        for n in nodes:
            by_state.setdefault(node_state(n), []).append(n)
        groups = [
            {"names": [n["name"] for n in ns], "state": s, "node": ns[0], "all": ns}
            for s, ns in by_state.items()
        ]
        if not groups:
            groups = [{"names": [], "state": "n/a", "node": {}, "all": []}]
    fields: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
        "P": ("PARTITION", lambda g: PARTITION + "*"),
        "R": ("PARTITION", lambda g: PARTITION),
        "a": ("AVAIL", lambda g: "up"),
        "l": ("TIMELIMIT", lambda g: "infinite"),
        "D": ("NODES", lambda g: len(g["names"])),
        "t": ("STATE", lambda g: g["state"]),
        "T": ("STATE", lambda g: long_node_state(g["state"])),
        "N": ("NODELIST", lambda g: compress_hostlist(g["names"])),
        "n": ("HOSTNAMES", lambda g: ",".join(g["names"])),
        "c": ("CPUS", lambda g: g["node"].get("cpus", 0)),
        "m": ("MEMORY", lambda g: (g["node"].get("ram_total") or 0) >> 20),
        "G": ("GRES", lambda g: gres_of(g["node"])),
        "E": ("REASON", lambda g: g["node"].get("drain_reason") or "none"),
        "C": ("CPUS(A/I/O/T)", lambda g: cpus_aiot(g["all"])),
        "F": ("NODES(A/I/O/T)", lambda g: nodes_aiot(g["all"])),
        "e": (
            "FREE_MEM",
            lambda g: ((g["node"].get("ram_total") or 0) - (g["node"].get("ram_used") or 0)) >> 20,
        ),
        "z": ("S:C:T", lambda g: f"1:{g['node'].get('cpus', 0)}:1"),
        "d": ("TMP_DISK", lambda g: 0),
        "w": ("WEIGHT", lambda g: 1),
        "f": ("AVAIL_FEATURES", lambda g: ",".join(g["node"].get("features") or ()) or "(null)"),
        "s": ("JOB_SIZE", lambda g: "1-infinite"),
        "r": ("ROOT", lambda g: "no"),
        "h": ("OVERSUBSCRIBE", lambda g: "NO"),
        "g": ("GROUPS", lambda g: "all"),
        "%": ("%", lambda g: "%"),
    }
    default = SINFO_SUMMARY if summary else SINFO_NODES if node_oriented else SINFO_DEFAULT
    return render(groups, fmt or default, fields, header)


def long_node_state(code: str) -> str:
    """sinfo's long state name (``%T``) for a short one."""
    return {"alloc": "allocated", "mix": "mixed", "drng": "draining", "unk": "unknown"}.get(code, code)


def gres_of(node: dict[str, Any]) -> str:
    """A member's GPUs as Slurm's Gres (``gpu:rtx4090:2``), ``(null)`` without any."""
    kinds: dict[str, int] = {}
    for g in node.get("gpus") or ():
        kinds[str(g.get("type") or "gpu")] = kinds.get(str(g.get("type") or "gpu"), 0) + 1
    return ",".join(f"gpu:{k}:{n}" for k, n in sorted(kinds.items())) or "(null)"


def gpus_per_node(j: dict[str, Any]) -> int:
    """The GPUs a job asked for on each member (what it holds, for an older view)."""
    if j.get("req_gpus") is not None:
        return int(j["req_gpus"])
    return len(j.get("gpus") or ()) // max(1, len(j.get("nodes") or ()))


def gpus_asked(j: dict[str, Any]) -> int:
    """The GPUs a job asked for over all its members, pending or not."""
    if j.get("req_gpus") is not None:
        return int(j["req_gpus"]) * int(j.get("req_nodes") or 1)
    return len(j.get("gpus") or ())


#: A final state's reason in Slurm's words (``scontrol show job``'s ``Reason=``).
FINAL_REASONS = {
    JobState.COMPLETED: "None",
    JobState.CANCELLED: "None",
    JobState.TIMEOUT: "TimeLimit",
    JobState.OUT_OF_MEMORY: "OutOfMemory",
    JobState.NODE_FAIL: "NodeDown",
}


def slurm_reason(j: dict[str, Any]) -> str:
    """``Reason=`` as one word, as Slurm's are (``Resources``, ``Dependency``,
    ``NonZeroExitCode``, ``RaisedSignal:11``), so ``scontrol -o`` splits into
    key=value pairs; a reason of several words has them joined by ``_``, as Slurm
    joins ``ReqNodeNotAvail,_UnavailableNodes``. ``mt-job show`` keeps the sentence."""
    state = j.get("state")
    if state == JobState.FAILED:
        code, sig = j.get("exit_code"), j.get("signal")
        if sig:
            return f"RaisedSignal:{sig}"
        return "NonZeroExitCode" if code else "None"
    if state in FINAL_REASONS:
        return FINAL_REASONS[state]
    reason = str(j.get("reason") or "None")
    return "_".join(reason.split()) or "None"


def exit_pair(j: dict[str, Any]) -> tuple[int, int]:
    """A job's (exit status, signal), as sacct's ``ExitCode`` ``status:signal``
    gives them ((0, 0) while it has not ended)."""
    if j.get("exit"):
        status, _, sig = str(j["exit"]).partition(":")
        return int(status or 0), int(sig or 0)
    ec = j.get("exit_code")
    if isinstance(ec, int):
        return (ec, 0) if ec >= 0 else (0, -ec)
    return 0, 0


def scontrol_job(j: dict[str, Any], now: float, one_liner: bool = False) -> str:
    """``scontrol show job``'s record for one job view."""
    exit_code = ":".join(map(str, exit_pair(j)))
    nodes = j.get("nodes") or []
    groups = [
        [f"JobId={j['job_id']}", f"JobName={j['name']}"],
        [f"UserId={j['user']}", f"Priority={j.get('priority', '')}"],
        [f"JobState={j['state']}", f"Reason={slurm_reason(j)}"],
        [
            f"Requeue={1 if j.get('requeue') else 0}",
            f"Restarts={j.get('attempt', 0)}",
            f"ExitCode={exit_code}",
        ],
        # scontrol writes both as [D-]HH:MM:SS (squeue's %l is the shorter 5:00).
        [
            f"RunTime={_hms(run_time(j, now))}",
            f"TimeLimit={_hms(tl) if (tl := j.get('time_limit')) else 'UNLIMITED'}",
        ],
        [f"SubmitTime={iso_time(j.get('submit_time'))}"],
        [f"StartTime={iso_time(j.get('start_time'))}", f"EndTime={iso_time(j.get('end_time'))}"],
        [f"Partition={PARTITION}"],
        [f"NodeList={compress_hostlist(nodes) if nodes else '(null)'}"],
        [f"BatchHost={nodes[0] if nodes else '(null)'}"],
        [
            f"NumNodes={max(1, len(nodes))}",
            f"NumCPUs={j.get('cpus', 1)}",
            f"MinMemoryNode={mem_mb(j.get('ram'))}",
        ],
        [
            f"TRES=cpu={j.get('cpus', 1)},node={max(1, len(nodes), int(j.get('req_nodes') or 1))}"
            + (f",gres/gpu={n}" if (n := gpus_asked(j)) else "")
        ],
        [f"OverSubscribe={'NO' if j.get('exclusive') else 'OK'}"],
        [f"WorkDir={j.get('workdir', '')}"],
        [f"StdErr={j.get('stderr', '')}"],
        [f"StdOut={j.get('stdout', '')}"],
    ]
    if j.get("array_id"):
        groups.insert(1, [f"ArrayJobId={j['array_id']}", f"ArrayTaskId={j.get('array_task')}"])
    if one_liner:
        return " ".join(f for g in groups for f in g)
    return (
        "\n".join((" " if i else "") + ("  " if i else "") + " ".join(g) for i, g in enumerate(groups)) + "\n"
    )


def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def scontrol_node(n: dict[str, Any], one_liner: bool = False) -> str:
    """``scontrol show node``'s record for one member (``mt-job nodes --json``)."""
    gpus = n.get("gpus") or []
    busy = sum(1 for g in gpus if g.get("jobs"))
    total = (n.get("ram_total") or 0) >> 20
    used = (n.get("ram_used") or 0) >> 20
    state = long_node_state(node_state(n)).upper()
    groups = [
        [f"NodeName={n['name']}"],
        [f"CPUAlloc={n.get('cpus_alloc', 0)}", f"CPUTot={n.get('cpus', 0)}"],
        [f"Gres={gres_of(n)}", f"GresUsed=gpu:{busy}"],
        [
            f"RealMemory={total}",
            f"AllocMem={(n.get('ram_alloc') or 0) >> 20}",
            f"FreeMem={max(0, total - used)}",
        ],
        [f"State={state}"],
        [f"Partitions={PARTITION}"],
        [f"Reason={n.get('drain_reason') or 'none'}"] if n.get("drain_reason") else [],
    ]
    groups = [g for g in groups if g]
    if one_liner:
        return " ".join(f for g in groups for f in g)
    return "\n".join(("   " if i else "") + " ".join(g) for i, g in enumerate(groups)) + "\n"


def json_meta() -> dict[str, Any]:
    """The ``meta`` of every ``--json`` answer (Slurm's names its plugin and release)."""
    import mtgpu

    return {"plugin": {"name": "MTGPU"}, "Slurm": {"release": f"MTGPU {mtgpu.__version__}"}}


def json_id(text: Any) -> Any:
    """A job id as Slurm's ``--json`` gives one: an integer (``"12"`` -> 12); an id
    that is no number (a collapsed array such as ``15_[1-9]``) stays as it is."""
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else text


def slurm_job_json(j: dict[str, Any], now: float) -> dict[str, Any]:
    """A job view under Slurm's ``--json`` key names (the fields MTGPU has): ``job_id``
    is the job's number, for an array task its own (its ``SLURM_JOB_ID``), as Slurm's;
    ``job_state`` one word; ``array_job_id`` 0 outside an array; ``exit_code`` the
    wait status (``exit 3``: 768, a SIGSEGV: 11), as Slurm 22.05's openapi v0.0.38."""
    status, sig = exit_pair(j)
    return {
        "job_id": json_id(j.get("numeric_id") or j["job_id"]),
        "array_job_id": json_id(j.get("array_id")) or 0,
        "array_task_id": j.get("array_task"),
        "name": j["name"],
        "user_name": j["user"],
        "job_state": j["state"],
        "state_reason": j.get("reason") or "None",
        "partition": PARTITION,
        "nodes": ",".join(j.get("nodes") or ()),
        "node_count": max(1, len(j.get("nodes") or ())),
        "cpus": j.get("cpus"),
        "memory_per_node": (j.get("ram") or 0) >> 20,
        "gpus": gpus_asked(j),
        "priority": j.get("priority"),
        "time_limit": int(j["time_limit"] // 60) if j.get("time_limit") else None,
        "submit_time": int(j.get("submit_time") or 0),
        "start_time": int(j.get("start_time") or 0),
        "end_time": int(j.get("end_time") or 0),
        "run_time": int(run_time(j, now)),
        "exit_code": (status << 8) | sig,
        "current_working_directory": j.get("workdir"),
        "standard_output": j.get("stdout"),
        "standard_error": j.get("stderr"),
        "steps": j.get("steps", []),
    }
