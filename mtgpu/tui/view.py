"""What remotegpu-cli's screen shows, as plain values: the keys and what they do, which
job columns fit a terminal's width, usage bars, sparklines of recent usage and job
times. Nothing here draws or talks to a server, so each piece is tested in process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtgpu.jobstate import CANCELLED, COMPLETED, FINAL_STATES, PENDING

FINAL = FINAL_STATES

# ------------------------------------------------------------------ keys


@dataclass(frozen=True)
class Key:
    """One binding: the keys (urwid's names), the screen's action, its label in the
    ``?`` list and in the footer. ``kinds`` are the lines it applies to (server, job,
    workspace); empty: anywhere."""

    keys: tuple[str, ...]
    action: str
    label: str
    kinds: tuple[str, ...] = ()
    short: str = ""

    @property
    def footer(self) -> str:
        return self.short or self.label


#: Every key of the screen, in the order ``?`` lists them. j/k, / and ? are the keys
#: of htop, less, k9s and lazygit; Enter opens details and s a shell, as in k9s.
KEYMAP: tuple[Key, ...] = (
    Key(("j", "down"), "down", "move down"),
    Key(("k", "up"), "up", "move up"),
    Key(("g", "home"), "top", "first line"),
    Key(("G", "end"), "bottom", "last line"),
    Key(("enter",), "details", "details of the line (Esc closes)", short="details"),
    Key(("/",), "filter", "show only lines with this text (Esc clears)", short="filter"),
    Key(("r",), "refresh", "refresh now"),
    Key(("a",), "add_server", "add a server"),
    Key(("?",), "help", "this list of keys", short="keys"),
    Key(("q", "Q"), "quit", "quit"),
    Key(("s", "t"), "ssh", "ssh into its tmux session", ("server",), "ssh"),
    Key(("b",), "submit", "submit a job file (batch job)", ("server",), "submit job"),
    Key(("n",), "new_workspace", "new workspace", ("server",), "workspace"),
    Key(("d",), "drop_server", "drop it from your list", ("server",), "drop"),
    Key(("c",), "cancel", "cancel", ("job",)),
    Key(("l",), "log", "follow its log", ("job",), "log"),
    Key(("s", "t"), "ssh", "ssh into its server", ("job",), "ssh"),
    Key(("b",), "submit", "submit another job file", ("job",), "submit job"),
    Key(("s", "t"), "ssh", "a shell in it", ("workspace",), "shell"),
    Key(("S",), "start", "start", ("workspace",)),
    Key(("x",), "stop", "stop", ("workspace",)),
    Key(("D",), "remove", "remove", ("workspace",)),
    Key(("f",), "forward", "forward its ports to localhost", ("workspace",), "forward"),
    Key(("n",), "new_workspace", "new workspace", ("workspace",), "new"),
)

#: Shown in the footer after the focused line's own keys.
FOOTER_GLOBAL = ("enter", "/", "?", "q")


def action_for(key: str, kind: str | None) -> str | None:
    """The action of ``key`` on a line of ``kind``: the line's own binding first.

    >>> action_for("s", "workspace"), action_for("S", "workspace"), action_for("j", "job")
    ('ssh', 'start', 'down')
    >>> action_for("c", "server") is None
    True
    """
    for k in KEYMAP:
        if key in k.keys and kind is not None and kind in k.kinds:
            return k.action
    for k in KEYMAP:
        if key in k.keys and not k.kinds:
            return k.action
    return None


def footer_keys(kind: str | None) -> list[tuple[str, str]]:
    """(key, label) pairs for the footer: the focused line's keys, then the few that
    work everywhere.

    >>> footer_keys("job")
    [('c', 'cancel'), ('l', 'log'), ('s', 'ssh'), ('b', 'submit job'), ('Enter', 'details'), ('/', 'filter'), ('?', 'keys'), ('q', 'quit')]
    """
    own = [(k.keys[0], k.footer) for k in KEYMAP if kind is not None and kind in k.kinds]
    anywhere = [(_key_name(k.keys[0]), k.footer) for g in FOOTER_GLOBAL for k in KEYMAP if k.keys[0] == g]
    return own + anywhere


def help_lines() -> list[str]:
    """The ``?`` overlay: every key, grouped by the lines it applies to."""
    out: list[str] = []
    groups = (
        ("anywhere", None),
        ("on a server", "server"),
        ("on a job", "job"),
        ("on a workspace", "workspace"),
    )
    for title, kind in groups:
        out.append(f"{title}:")
        for k in KEYMAP:
            if (kind is None and not k.kinds) or (kind is not None and kind in k.kinds):
                names = " ".join(_key_name(x) for x in k.keys)
                out.append(f"  {names:<12} {k.label}")
        if kind is None:
            out.append(f"  {'PgUp PgDn':<12} scroll a page")
    return out


def _key_name(key: str) -> str:
    return {"enter": "Enter", "down": "Down", "up": "Up", "home": "Home", "end": "End"}.get(key, key)


# --------------------------------------------------------------- columns


@dataclass(frozen=True)
class Column:
    """One column of the job list: the field, its heading and its width (``0``: the
    rest of the line, wrapped there)."""

    name: str
    heading: str
    width: int
    align: str = "left"


#: Terminal widths from which more columns are shown.
WIDE, WIDER = 110, 150


def job_columns(width: int) -> list[Column]:
    """The job list's columns for a terminal ``width`` wide: the reason takes what is
    left (at least 12 columns) and wraps there, so it is never cut.

    >>> [c.name for c in job_columns(80)]
    ['job_id', 'name', 'state', 'where', 'gpus', 'elapsed', 'left', 'reason']
    >>> [c.name for c in job_columns(160)][-5:]
    ['submitted', 'cpus', 'ram', 'user', 'reason']
    """
    wide, wider = width >= WIDE, width >= WIDER
    cols = [
        Column("job_id", "JOBID", 6, "right"),
        Column("name", "NAME", 24 if wider else 18 if wide else 12),
        Column("state", "STATE", 13 if wide else 9),
        Column("where", "NODES", 16 if wide else 10),
        Column("gpus", "GPUS", 9 if wide else 5),
        Column("elapsed", "ELAPSED", 7, "right"),
        Column("left", "LEFT", 7, "right"),
    ]
    if wide:
        cols.append(Column("submitted", "SUBMITTED", 10, "right"))
    if wider:
        cols += [
            Column("cpus", "CPUS", 4, "right"),
            Column("ram", "RAM", 6, "right"),
            Column("user", "USER", 10),
        ]
    cols.append(Column("reason", "REASON", 0))
    return cols


def reason_width(width: int, cols: Sequence[Column]) -> int:
    """What is left for the wrapped last column (one space before each column).

    >>> reason_width(80, job_columns(80))
    17
    """
    return max(12, width - sum(c.width + 1 for c in cols if c.width))


def fit(text: str, width: int, align: str = "left") -> str:
    """``text`` cut or padded to ``width``; a cut ends in ``…``.

    >>> fit("resnet-training", 8), fit("7", 3, "right")
    ('resnet-…', '  7')
    """
    if len(text) > width:
        text = text[: max(0, width - 1)] + "\u2026"
    return text.rjust(width) if align == "right" else text.ljust(width)


# ----------------------------------------------------------------- times


def duration(seconds: float | None) -> str:
    """A span in at most six characters: ``45s``, ``12m05s``, ``3h02m``, ``2d03h``.

    >>> [duration(x) for x in (45, 725, 10920, 183600, None)]
    ['45s', '12m05s', '3h02m', '2d03h', '-']
    """
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def elapsed(job: dict[str, Any], now: float) -> float | None:
    """How long the job has run (or ran): None before it starts."""
    start = job.get("start_time")
    if start is None or job.get("state") == PENDING:
        return None
    end = job.get("end_time") if job.get("state") in FINAL else None
    return max(0.0, float(end if end is not None else now) - float(start))


def remaining(job: dict[str, Any], now: float) -> float | None:
    """Time left before the job's time limit: the whole limit while it waits, None
    without a limit or once it has ended."""
    limit = job.get("time_limit")
    if limit is None or job.get("state") in FINAL:
        return None
    ran = elapsed(job, now)
    return max(0.0, float(limit) - (ran or 0.0))


def left_text(job: dict[str, Any], now: float) -> str:
    """The LEFT column: the time left, ``no limit``, or ``-`` once ended.

    >>> left_text({"state": "RUNNING", "start_time": 0, "time_limit": 3600}, 600)
    '50m00s'
    >>> left_text({"state": "RUNNING", "start_time": 0, "time_limit": None}, 600)
    'nolimit'
    """
    if job.get("state") in FINAL:
        return "-"
    if job.get("time_limit") is None:
        return "nolimit"
    return duration(remaining(job, now))


def job_cells(job: dict[str, Any], server: str, now: float, wide: bool = False) -> dict[str, str]:
    """Every column's text for one job (tenant text as it is: the screen makes it
    printable)."""
    state = str(job.get("state"))
    gpus = job.get("gpus") or []
    if wide:
        gpu_text = ",".join(f"GPU{g.get('index')}" for g in gpus)
    else:
        gpu_text = ",".join(str(g.get("index")) for g in gpus)
    reason = ""
    if state == PENDING:
        pos = job.get("position")
        reason = (f"#{pos} " if pos else "") + str(job.get("reason") or "")
    elif state in FINAL:
        # A cancelled job's exit status is the cancellation's, not its program's:
        # "CANCELLED exit 0" read as if it had finished.
        shown = job.get("exit_code") is not None and state != CANCELLED
        reason = f"exit {job.get('exit_code')}" if shown else ""
        if job.get("reason") and state != COMPLETED:
            reason = (reason + " " + str(job["reason"])).strip()
    elif job.get("cancel_requested"):
        reason = "stopping"
    submitted = job.get("submit_time")
    return {
        "job_id": str(job.get("job_id")),
        "name": str(job.get("name") or ""),
        "state": state,
        "where": ",".join(job.get("nodes") or []) or server,
        "gpus": gpu_text or "-",
        "elapsed": duration(elapsed(job, now)),
        "left": left_text(job, now),
        "submitted": duration(now - float(submitted)) + " ago" if submitted is not None else "-",
        "cpus": str(job.get("cpus") if job.get("cpus") is not None else "-"),
        "ram": gib(job.get("ram")),
        "user": str(job.get("user") or ""),
        "reason": reason,
    }


def gib(n: Any) -> str:
    """Bytes as GiB with one decimal.

    >>> gib(3 * 2**30), gib(None)
    ('3.0G', '-')
    """
    return "-" if not isinstance(n, (int, float)) else f"{n / 2**30:.1f}G"


# ----------------------------------------------------------------- usage

SPARKS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def sparkline(values: Iterable[float | None], width: int) -> str:
    """The last ``width`` fractions (0 to 1) as a line of block heights, oldest left,
    padded on the left while the history is short; a missing sample is a space.

    >>> sparkline([0, 0.5, 1.0, None, 0.25], 6)
    ' ▁▅█ ▃'
    """
    vals = list(values)[-width:] if width > 0 else []
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            f = min(1.0, max(0.0, float(v)))
            out.append(SPARKS[min(len(SPARKS) - 1, round(f * (len(SPARKS) - 1)))])
    return "".join(out).rjust(width)


def bar_cells(fraction: float, width: int) -> int:
    """How many of ``width`` cells a usage bar fills (rounded; a non-zero use shows one).

    >>> bar_cells(0.5, 10), bar_cells(0.01, 10), bar_cells(0, 10), bar_cells(2, 10)
    (5, 1, 0, 10)
    """
    f = min(1.0, max(0.0, fraction))
    n = round(f * width)
    return max(n, 1) if f > 0 and width > 0 else n


@dataclass
class GpuHistory:
    """Recent samples of one GPU: utilisation and memory in use, as fractions."""

    util: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    mem: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def add(self, gpu: dict[str, Any]) -> None:
        total = float(gpu.get("vram_total") or 0)
        self.util.append(min(1.0, max(0.0, float(gpu.get("util") or 0) / 100)))
        self.mem.append(0.0 if total <= 0 else min(1.0, float(gpu.get("vram_used") or 0) / total))


#: Samples kept per GPU: a minute at the default refresh, enough for wide terminals.
HISTORY = 60


@dataclass(frozen=True)
class GpuLayout:
    """Widths of one GPU line's parts for a terminal width."""

    type_width: int
    bar: int
    spark: int
    mem_spark: int


def gpu_layout(width: int) -> GpuLayout:
    """Wider terminals get longer bars and histories, and a memory history too.

    >>> gpu_layout(80)
    GpuLayout(type_width=12, bar=8, spark=10, mem_spark=0)
    >>> gpu_layout(160).mem_spark > 0
    True
    """
    if width >= WIDER:
        return GpuLayout(18, 16, 30, 20)
    if width >= WIDE:
        return GpuLayout(16, 12, 20, 10)
    return GpuLayout(12, 8, 10, 0)


# --------------------------------------------------------------- details


def clock(t: Any) -> str:
    """A timestamp as local date and time, or ``-``."""
    if not isinstance(t, (int, float)):
        return "-"
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def job_details(job: dict[str, Any], server: str, now: float) -> list[tuple[str, str]]:
    """The Enter view of a job: every field a user asks about, the reason in full.

    >>> d = dict(job_details({"job_id": "7", "state": "PENDING", "reason": "Resources",
    ...     "reason_detail": "waits for 2 GPUs", "time_limit": 3600, "position": 1}, "gpu01", 0))
    >>> d["reason"], d["time left"], d["elapsed"]
    ('#1 Resources: waits for 2 GPUs', '1h00m (limit 1h00m)', '-')
    """
    cells = job_cells(job, server, now, wide=True)
    reason = cells["reason"]
    if job.get("reason_detail"):
        reason = f"{reason}: {job['reason_detail']}" if reason else str(job["reason_detail"])
    limit = job.get("time_limit")
    left = left_text(job, now)
    if limit is not None and left != "-":
        left = f"{left} (limit {duration(limit)})"
    rows = [
        ("job", f"{cells['job_id']} {cells['name']}".strip()),
        ("state", cells["state"] + (" (cancel asked)" if job.get("cancel_requested") else "")),
        ("reason", reason or "-"),
        ("server", server),
        ("nodes", cells["where"]),
        ("gpus", cells["gpus"]),
        ("cpus, ram", f"{cells['cpus']}, {cells['ram']}"),
        ("submitted", clock(job.get("submit_time"))),
        ("started", clock(job.get("start_time"))),
        ("ended", clock(job.get("end_time"))),
        ("elapsed", cells["elapsed"]),
        ("time left", left),
        ("exit code", str(job["exit_code"]) if job.get("exit_code") is not None else "-"),
        ("workdir", str(job.get("workdir") or "-")),
        ("stdout", str(job.get("stdout") or "-")),
        ("stderr", str(job.get("stderr") or "-")),
    ]
    if job.get("container"):
        rows.append(("container", str(job["container"])))
    if job.get("requeues"):
        rows.append(("requeued", f"{job['requeues']} times ({job.get('requeue_reason') or '-'})"))
    for w in job.get("warnings") or []:
        rows.append(("warning", str(w)))
    return rows


# ------------------------------------------------------------ this month's usage


def month_usage(answer: Any) -> dict[str, Any]:
    """The tenant's own usage from a ``job.usage`` answer grouped ``by`` gpu_type (the
    call ``mt-job usage`` makes; the daemon's default period is this month, UTC):
    ``{"month", "start", "end", "jobs", "gpu_hours": {type: hours}, "cpu_hours"}``.
    ValueError names what is wrong with an answer of another shape.

    >>> u = month_usage({"start": "2026-12-01", "end": "2026-12-31", "total": {"jobs": 3,
    ...     "cpu_hours": 6.0}, "rows": [{"gpu_type": "rtx4090", "gpu_hours": 1.5},
    ...     {"gpu_type": "", "gpu_hours": 0.0}]})
    >>> u["month"], u["jobs"], u["gpu_hours"], u["cpu_hours"]
    ('2026-12', 3, {'rtx4090': 1.5}, 6.0)
    """
    if not isinstance(answer, dict):
        raise ValueError("not an object")
    total, rows = answer.get("total"), answer.get("rows")
    start, end = answer.get("start"), answer.get("end")
    if not isinstance(total, dict) or not isinstance(rows, list):
        raise ValueError("no total or rows")
    if not isinstance(start, str) or not isinstance(end, str):
        raise ValueError("no period")

    def number(v: Any, what: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e12:
            raise ValueError(f"{what} is not a number of hours")
        return float(v)

    gpu: dict[str, float] = {}
    for r in rows[:64]:
        if not isinstance(r, dict) or not isinstance(r.get("gpu_type"), str):
            raise ValueError("a row has no GPU type")
        if r["gpu_type"]:  # "": CPU-only jobs, in the CPU-hours
            gpu[r["gpu_type"][:40]] = number(r.get("gpu_hours"), "gpu_hours")
    jobs = total.get("jobs")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise ValueError("jobs is not a count")
    return {
        "month": start[:7] if start[:7] == end[:7] else f"{start[:10]}..{end[:10]}",
        "start": start[:10],
        "end": end[:10],
        "jobs": jobs,
        "gpu_hours": gpu,
        "cpu_hours": number(total.get("cpu_hours"), "cpu_hours"),
    }


def hours(h: float) -> str:
    """Hours with two decimals, fewer when large; a little above none is ``<0.01``.

    >>> [hours(x) for x in (0, 0.001, 1.5, 250.4)]
    ['0', '<0.01', '1.50', '250']
    """
    if h <= 0:
        return "0"
    if h < 0.005:
        return "<0.01"
    return f"{h:.0f}" if h >= 100 else f"{h:.2f}"


def usage_text(usage: dict[str, Any] | None, error: str | None = None) -> str:
    """A server's line of the tenant's own usage this month, or why it is not shown.

    >>> usage_text({"month": "2026-12", "jobs": 3, "gpu_hours": {"rtx4090": 1.5},
    ...     "cpu_hours": 6.0})
    'usage 2026-12: 3 jobs  GPU-hours rtx4090 1.50  CPU-hours 6.00'
    >>> usage_text({"month": "2026-12", "jobs": 0, "gpu_hours": {}, "cpu_hours": 0})
    'usage 2026-12: 0 jobs  GPU-hours 0  CPU-hours 0'
    >>> usage_text(None, "an older MTGPU")
    'usage: not available (an older MTGPU)'
    """
    if usage is None:
        return f"usage: not available ({error or 'not read yet'})"
    gpu = ", ".join(f"{t} {hours(h)}" for t, h in sorted(usage["gpu_hours"].items())) or "0"
    n = usage["jobs"]
    return (
        f"usage {usage['month']}: {n} job{'' if n == 1 else 's'}  GPU-hours {gpu}  "
        f"CPU-hours {hours(usage['cpu_hours'])}"
    )


def usage_refused(code: str, message: str) -> str:
    """Why a server did not give its usage, from its refusal: an older MTGPU does not
    know the operation, and says so with every operation it knows (too long to show).

    >>> usage_refused("unknown_op", "unknown operation 'job.usage'; known: ...")
    'this server runs an MTGPU older than usage reporting'
    >>> usage_refused("internal", "internal error (id 7f3a)")
    'internal error (id 7f3a)'
    """
    if code == "unknown_op":
        return "this server runs an MTGPU older than usage reporting"
    return message if len(message) <= 160 else message[:159] + "\u2026"
