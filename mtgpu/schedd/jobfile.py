"""Job files: ``#MTGPU key=value`` directives, the common ``#SBATCH`` options, overrides.

A job file is a shell script. Directives are read, as ``sbatch`` reads them, from the
comment block at the top: scanning stops at the first line after the shebang that is
neither blank nor a comment. A directive must start in the first column.

Precedence: a later directive line overrides an earlier one for the same key, whether
it is ``#MTGPU`` or ``#SBATCH``; command-line overrides (``mt-job submit --gpus=nvidia:2``)
win over both. Every error names the line and the directive and says what is expected;
an ``#SBATCH`` option MTGPU does not know is a warning, not an error, so existing
scripts still run.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mtgpu.config.units import parse_count, parse_size
from mtgpu.errors import JobError
from mtgpu.jobspec import WarningTally
from mtgpu.schedd import sbatch
from mtgpu.schedd.timefmt import parse_time_limit
from mtgpu.schedd.types import (
    DEFAULT_CPUS,
    DEFAULT_PRIORITY,
    DEFAULT_RAM,
    KNOWN_BRANDS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    GpuMode,
    JobSpec,
    ResourceRequest,
)

#: The most tasks one ``array=`` may expand into.
MAX_ARRAY_TASKS = 100_000
#: The largest array index (seven digits): a task's job id ``ID_INDEX`` stays a short
#: name that every file and listing can carry.
MAX_ARRAY_INDEX = 9_999_999
#: The most servers a host list (``server=gpu[01-64]``) may name. No cluster has more
#: members than this, so a longer list is a mistake; it is refused before any name is made.
MAX_HOST_LIST = 1024
#: The longest directive line (``#MTGPU`` or ``#SBATCH``), in characters; checked before
#: the line is split, so splitting costs at most this much per line.
MAX_DIRECTIVE_LINE = 4096
#: The longest value of one directive (``name=...``, ``output=...``), in characters.
MAX_DIRECTIVE_VALUE = 1024
#: The longest job name: it becomes part of file names (``%x``).
MAX_JOB_NAME = 200
#: The most GPUs one member may be asked for.
MAX_GPUS = 1024
#: The most seconds before its time limit a job may ask to be signalled (``--signal=SIG@N``).
MAX_SIGNAL_SECONDS = 65535

#: Every ``#MTGPU`` key, with what it expects (used in error messages).
DIRECTIVES: dict[str, str] = {
    "gpus": "N, BRAND:N, TYPE:N or BRAND:TYPE:N, such as 2 or nvidia:4 or a100:1",
    "gpu_mode": "exclusive, shared or overcommit",
    "vram": "a size per GPU with a unit, such as 20G",
    "cpus": "a whole number of CPUs per member, such as 8",
    "ram": "a size per member with a unit, such as 32G",
    "container": "an image or template name",
    "nodes": "a whole number of members, such as 2",
    "array": "indices such as 0-9, 1,3,5 or 0-99%8 (%N caps tasks running at once)",
    "server": "a server name, or a list such as gpu01,gpu02 or gpu[01-04]",
    "name": "a job name",
    "priority": f"a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} (default {DEFAULT_PRIORITY})",
    "time": "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or 30m/2h/1d",
    "output": "a file path; %j, %J, %A, %a, %b, %x, %u, %N, %n, %t and %s are expanded",
    "error": "a file path; %j, %J, %A, %a, %b, %x, %u, %N, %n, %t and %s are expanded",
    "workdir": "a directory path",
    "requeue": "yes or no",
    "exclusive": "yes or no (whole members, shared with no other job, as sbatch's --exclusive)",
}


#: What the keys only ``#SBATCH`` options set expect, for error messages.
_EXPECTED: dict[str, str] = {
    **DIRECTIVES,
    "ntasks": "a whole number of tasks, such as 4",
    "ntasks_per_node": "a whole number of tasks per member, such as 4",
    "cpus_per_task": "a whole number of CPUs per task, such as 8",
    "cpus_per_gpu": "a whole number of CPUs per GPU, such as 8",
    "mincpus": "a whole number of CPUs per member, such as 8",
    "ram_per_cpu": "a size per CPU, such as 4G (a bare number is megabytes)",
    "ram_per_gpu": "a size per GPU, such as 64G (a bare number is megabytes)",
    "nice": "a whole number from 0 up, which lowers the job's priority",
    "gpus_total": "[TYPE:]N, such as a100:4",
    "dependency": "TYPE:ID[:ID...] joined by , (all) or ? (any); TYPE is after, afterany, afterok, afternotok, or singleton",
    "hold": "yes or no",
    "begin": "now+N[minutes|hours|days], HH:MM[:SS] or YYYY-MM-DD[THH:MM[:SS]]",
    "kill_on_invalid_dep": "yes or no",
    "test_only": "yes or no",
    "wait": "yes or no",
    "open_mode": "truncate or append",
    "constraint": "feature names joined by & (all) and | (any), such as a100&nvlink|h100",
    "signal": "[B:]SIG[@SECONDS], such as USR1@90 or B:10",
    "exclude": "a server name, or a list such as gpu01,gpu02 or gpu[01-04]",
    "export": "ALL, NONE, or NAME[=VALUE],... (ALL,NAME=VALUE adds to everything)",
}


@dataclass(frozen=True, slots=True)
class _Raw:
    """One key's value as written, and where: ``line 4: #MTGPU vram=20G``."""

    value: str
    origin: str
    source: str = "#MTGPU"  # or "#SBATCH", "command line"


# --------------------------------------------------------------------------- values


def _size(value: str) -> int:
    if re.fullmatch(r"\s*[0-9]+\s*", value, re.ASCII) and value.strip().strip("0"):
        # A bare number here is almost always a unit forgotten; bytes would be a surprise.
        raise ValueError(f"{_cut(value)!r} has no unit")
    try:
        n = parse_size(value)
    except ValueError:
        raise ValueError(f"{_cut(value)!r} is not a size") from None
    if n <= 0:
        raise ValueError(f"{_cut(value)!r} is not a positive size")
    return n


def _positive_int(value: str) -> int:
    return parse_count(value, minimum=1)


def _cut(text: str, n: int = 40) -> str:
    """``text``, cut to ``n`` characters: a refusal never echoes a long value back."""
    return text if len(text) <= n else text[:n] + "..."


def parse_gpus(value: str, brands: Collection[str] = KNOWN_BRANDS) -> tuple[int, str | None, str | None]:
    """Parse ``gpus=`` into (count, brand, type). A lone name is a brand if it is in ``brands``.

    >>> parse_gpus("nvidia:4")
    (4, 'nvidia', None)
    >>> parse_gpus("a100:2")
    (2, None, 'a100')
    >>> parse_gpus("amd:mi250:1")
    (1, 'amd', 'mi250')
    >>> parse_gpus("3")
    (3, None, None)
    """
    parts = [p.strip().lower() for p in value.split(":")]
    if parts and re.fullmatch(r"[0-9]+", parts[-1], re.ASCII):
        count = parse_count(parts.pop(), maximum=MAX_GPUS, what="a number of GPUs")
    else:
        count = 1  # as with --gres=gpu:a100, a name alone asks for one
    if len(parts) > 2 or any(not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", p) for p in parts):
        raise ValueError(f"{value!r} is not a GPU request")
    brand = gpu_type = None
    if len(parts) == 2:
        brand, gpu_type = parts
    elif len(parts) == 1:
        if parts[0] in brands:
            brand = parts[0]
        else:
            gpu_type = parts[0]
    if count == 0 and (brand or gpu_type):
        raise ValueError(f"{value!r} names a GPU but asks for none")
    return count, brand, gpu_type


def parse_array(value: str) -> tuple[tuple[int, ...], int | None]:
    """Parse an array spec into (sorted unique indices, limit of tasks running at once).

    >>> parse_array("0-99%8")[1], len(parse_array("0-99%8")[0])
    (8, 100)
    >>> parse_array("1,3,5")
    ((1, 3, 5), None)
    >>> parse_array("0-10:5")
    ((0, 5, 10), None)
    """
    text = value.strip()
    limit: int | None = None
    if "%" in text:
        text, _, lim = text.partition("%")
        try:
            limit = parse_count(lim, minimum=1, maximum=MAX_ARRAY_TASKS)
        except ValueError:
            raise ValueError(
                f"{value!r}: the limit after % must be a whole number from 1 to {MAX_ARRAY_TASKS}"
            ) from None
    indices: set[int] = set()
    for item in text.split(","):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", item.strip(), re.ASCII)
        if not m:
            raise ValueError(f"{_cut(value)!r} is not an array spec")
        if any(g is not None and (len(g) > 12 or int(g) > MAX_ARRAY_INDEX) for g in m.groups()):
            raise ValueError(
                f"{_cut(item.strip())!r}: array indices and steps run from 0 to {MAX_ARRAY_INDEX}"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"{value!r}: range {item.strip()!r} runs backwards or has a zero step")
        if (hi - lo) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"{value!r} has more than {MAX_ARRAY_TASKS} tasks")
        indices.update(range(lo, hi + 1, step))
    return tuple(sorted(indices)), limit


def expand_array(spec: JobSpec) -> list[int]:
    """The array task indices of ``spec``; an empty list for a job that is not an array."""
    return list(parse_array(spec.array)[0]) if spec.array else []


def expand_hostlist(value: str, limit: int = MAX_HOST_LIST) -> tuple[str, ...]:
    """Expand a Slurm-style host list of at most ``limit`` names.

    The names are counted before any is made, so ``a[0-9999999]`` costs nothing.

    >>> expand_hostlist("gpu[01-03,07],cpu1")
    ('gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu1')
    >>> expand_hostlist("a[0-9999999]")
    Traceback (most recent call last):
    ...
    ValueError: 'a[0-9999999]' names 10000000 servers; a host list names at most 1024
    """
    names: list[str] = []
    # (prefix, first, last, digits, suffix) per range, counted before any name is made.
    ranges: list[tuple[str, int, int, int, str]] = []
    count = 0
    shown = value if len(value) <= 40 else value[:30] + "..."
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", value):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item.strip())
        if not m:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}", item.strip(), re.ASCII):
                raise ValueError(f"{item.strip()[:40]!r} is not a server name")
            ranges.append((item.strip(), 0, 0, -1, ""))  # a plain name (width -1)
            count += 1
            continue
        prefix, body, suffix = m.groups()
        for part in body.split(","):
            r = re.fullmatch(r"([0-9]{1,12})(?:-([0-9]{1,12}))?", part.strip(), re.ASCII)
            if not r:
                raise ValueError(f"{item[:40]!r} is not a host list")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            count += max(0, int(hi) - int(lo) + 1)
            ranges.append((prefix, int(lo), int(hi), len(lo), suffix))
        if count > limit:
            break
    if count > limit:
        raise ValueError(f"{shown!r} names {count} servers; a host list names at most {limit}")
    for prefix, lo, hi, width, suffix in ranges:
        if width < 0:
            names.append(prefix)
        else:
            names.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(lo, hi + 1))
    if not names:
        raise ValueError(f"{value!r} names no server")
    return tuple(dict.fromkeys(names))


def decode_job_file(data: bytes, name: str = "the job file") -> str:
    r"""A job file's bytes as text; refuse (JobError) what is not UTF-8, naming where.

    >>> decode_job_file(b"#!/bin/sh\necho \xfa\n", "job.sh")
    Traceback (most recent call last):
    ...
    mtgpu.errors.JobError: job.sh is not UTF-8 text: byte 0xfa at offset 15 (line 2); save it as UTF-8 (iconv -t UTF-8)
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start
        line = data.count(b"\n", 0, at) + 1
        raise JobError(
            f"{name} is not UTF-8 text: byte 0x{data[at]:02x} at offset {at} "
            f"(line {line}); save it as UTF-8 (iconv -t UTF-8)"
        ) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


#: What a directive's value (or the submission's working directory) may not hold: a
#: NUL, or a lone surrogate (a byte that was not UTF-8, as Python decodes argv).
_NOT_TEXT = re.compile("[\0\ud800-\udfff]")


def _shown(text: str) -> str:
    """``text`` with its NULs and lone surrogates written as escapes (``\\x00``), so
    a refusal quoting it is plain text."""
    return _NOT_TEXT.sub(lambda m: ascii(m.group())[1:-1], text)


def text_value_error(field: str, value: str) -> str | None:
    """Why ``value`` (of ``field``) is not text a job can carry, or None: a NUL or a
    byte that is not UTF-8 would reach file names, the environment and the job's
    supervisor, which cannot take them.

    >>> text_value_error("name", "a\\udcffb")
    'the value of name has byte 0xff, which is not UTF-8 text; write it in UTF-8'
    """
    m = _NOT_TEXT.search(value)
    if m is None:
        return None
    ch = m.group()
    if ch == "\0":
        return f"the value of {field} has a NUL character; remove it"
    byte = f"byte 0x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else "a lone surrogate"
    return f"the value of {field} has {byte}, which is not UTF-8 text; write it in UTF-8"


def script_text_error(script: str) -> str | None:
    """Why a script received as text is not text, or None. A lone surrogate stands for
    a byte that was not UTF-8 (Python's surrogateescape), as read from a pipe."""
    m = _SURROGATE.search(script)
    if m is None:
        return None
    ch, at = m.group(), m.start()
    line = script.count("\n", 0, at) + 1
    byte = f"byte 0x{ord(ch) - 0xDC00:02x}" if ch >= "\udc80" else "a lone surrogate"
    return (
        f"the job file is not UTF-8 text: {byte} at character {at} (line {line}); "
        "save it as UTF-8 (iconv -t UTF-8)"
    )


def _requeue(value: str) -> bool:
    v = value.strip().lower()
    if v in ("yes", "true", "1", "on"):
        return True
    if v in ("no", "false", "0", "off"):
        return False
    raise ValueError(f"{value!r} is not yes or no")


def _exclusive(value: str) -> bool:
    v = value.strip().lower()
    if v in ("user", "mcs", "topo"):
        raise ValueError(
            f"--exclusive={v} (sharing members only with some jobs) is not supported by MTGPU; "
            "expected --exclusive alone (members of the job's own)"
        )
    return _requeue(value)


def _priority(value: str) -> int:
    if (
        not re.fullmatch(r"-?[0-9]{1,6}", value.strip(), re.ASCII)
        or not MIN_PRIORITY <= int(value) <= MAX_PRIORITY
    ):
        raise ValueError(f"{_cut(value)!r} is out of range")
    return int(value)


def _text(value: str, limit: int = MAX_DIRECTIVE_VALUE) -> str:
    if not value.strip() or "\n" in value or "\0" in value:
        raise ValueError(f"{value[:40]!r} is empty or has a line break")
    if len(value.strip()) > limit:
        raise ValueError(f"{len(value.strip())} characters is longer than the {limit} allowed")
    return value.strip()


def parse_signal(value: str) -> tuple[int, float, bool]:
    """sbatch's ``--signal=[B:]SIG[@SECONDS]``: (signal number, seconds before the time
    limit, to the main process only).

    >>> parse_signal("B:USR1@90")
    (10, 90.0, True)
    >>> parse_signal("SIGTERM")
    (15, 60.0, False)
    """
    import signal as signals

    text = value.strip()
    batch = text[:2].upper() == "B:"
    if batch:
        text = text[2:]
    elif text[:2].upper() in ("R:", "RB:", "BR:") or text[:3].upper() in ("RB:", "BR:"):
        raise ValueError("R: (signal on a reservation's end) does not apply: MTGPU has no reservations")
    name, _, when = text.partition("@")
    name = name.strip().upper()
    if re.fullmatch(r"[0-9]{1,2}", name):
        num = int(name)
    else:
        try:
            num = int(signals.Signals["SIG" + name.removeprefix("SIG")])
        except KeyError:
            raise ValueError(f"{_cut(name)!r} is not a signal") from None
    if not 1 <= num <= 64 or num in (signals.SIGKILL, signals.SIGSTOP):
        raise ValueError(f"{num} is not a signal a job can be warned with")
    before = 60.0
    if when:
        if not re.fullmatch(r"[0-9]{1,5}", when.strip()):
            raise ValueError(_signal_seconds(when))
        before = float(int(when))
    return num, before, batch


def _signal_seconds(when: str) -> str:
    return f"{_cut(when)!r} is not a number of seconds (0 to {MAX_SIGNAL_SECONDS})"


def _signal(value: str) -> str:
    # The range is checked here, where a job is submitted, not in parse_signal: a job
    # recorded before it was checked still launches.
    _, before, _ = parse_signal(value)
    if before > MAX_SIGNAL_SECONDS:
        raise ValueError(_signal_seconds(value.partition("@")[2].strip()))
    return value.strip()


def _constraint(value: str) -> str:
    from mtgpu.schedd.features import parse_constraint

    parse_constraint(value.strip())
    return value.strip()


def _open_mode(value: str) -> str:
    v = value.strip().lower()
    if v not in ("truncate", "append"):
        raise ValueError(f"{_cut(value)!r} is not truncate or append")
    return v


def _dependency(value: str) -> str:
    from mtgpu.schedd.depend import parse_dependency

    parse_dependency(value)
    return value.strip()


def _begin(value: str) -> str:
    from mtgpu.schedd.depend import parse_begin

    parse_begin(value, 0.0)
    return value.strip()


def _export(value: str) -> str:
    from mtgpu.schedd.submitenv import exported

    exported({}, value)  # refuses what is not a list of names
    return value.strip()


def _name(value: str) -> str:
    return _text(value, MAX_JOB_NAME)


def check_priority(priority: int, *, is_admin: bool) -> None:
    """Refuse a priority above the default unless the submitter is an admin."""
    if priority > DEFAULT_PRIORITY and not is_admin:
        raise JobError(
            f"priority={priority}: only an admin may raise a job above the default "
            f"{DEFAULT_PRIORITY}; use {MIN_PRIORITY}..{DEFAULT_PRIORITY} to lower it"
        )


def expand_output_pattern(
    pattern: str,
    *,
    job_id: str,
    name: str,
    user: str,
    node: str = "",
    array_id: str | None = None,
    array_task: int | None = None,
) -> str:
    """Fill in Slurm's filename patterns: %j job id, %A array id, %a task, %x name, %u user, %N node.

    >>> expand_output_pattern("out-%A_%a-%x.log", job_id="7_3", name="t", user="ann", array_id="7", array_task=3)
    'out-7_3-t.log'
    """
    table = {
        "j": job_id,
        "A": array_id or job_id,
        "a": "" if array_task is None else str(array_task),
        "x": name,
        "u": user,
        "N": node,
        "%": "%",
    }
    return re.sub(r"%([jAaxuN%])", lambda m: table[m.group(1)], pattern)


# --------------------------------------------------------------------------- #SBATCH


def _sbatch_mem(value: str) -> str:
    # Slurm reads a bare --mem as megabytes (--mem=0: all of each member's, see _ram).
    v = value.strip()
    if re.fullmatch(r"\d+", v):
        return v + "M"
    return v


#: ``ram`` for "all of each member's memory" (sbatch's ``--mem=0``).
ALL_RAM = 0


def _ram(value: str) -> int:
    """A job's RAM per member; a zero size (sbatch's ``--mem=0``) is :data:`ALL_RAM`:
    as in Slurm, the job gets all of each member's memory (so it holds its members
    whole: no other job could get memory there)."""
    try:
        if parse_size(value.strip()) == 0:
            return ALL_RAM
    except ValueError:
        pass
    return _size(value)


def _sbatch_gres(value: str) -> str:
    items = [g.strip() for g in value.split(",") if g.strip()]
    others = [g for g in items if g.split(":")[0].lower() != "gpu"]
    if others:
        raise ValueError(f"{_cut(others[0])!r}: MTGPU schedules only GPUs (gpu[:TYPE]:N)")
    if len(items) != 1:
        raise ValueError(f"{value!r} asks for no GPUs or for GPUs twice")
    parts = items[0].split(":")[1:]
    return ":".join(parts) if parts else "1"


def _sbatch_nodes(value: str, warn: Callable[[str], None]) -> str:
    m = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if m:
        warn(f"a node range ({value}) is not supported; using the minimum, {m.group(1)}")
        return m.group(1)
    return value


# --------------------------------------------------------------------------- parsing


def _directive_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, prefix, rest) for every directive in the leading comment block.

    A line is what the shell reads as one: it ends at a newline only (not at a bare
    carriage return, form feed or Unicode line separator, which ``str.splitlines``
    would split at), so no directive counts that the shell sees inside another line.
    One carriage return before the newline (a CRLF file) is dropped.
    """
    found = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # like sbatch: directives end at the first command
        for prefix in ("#MTGPU", "#SBATCH"):
            if line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)].isspace()):
                if len(line) > MAX_DIRECTIVE_LINE:
                    first = line[len(prefix) : len(prefix) + 60].split()
                    key = first[0].partition("=")[0][:30] if first else ""
                    raise JobError(
                        f"line {lineno}: {prefix} {key}: the line is {len(line)} "
                        f"characters; directive lines are at most {MAX_DIRECTIVE_LINE} "
                        "(MAX_DIRECTIVE_LINE); shorten it, or keep long values out "
                        "of directives"
                    )
                found.append((lineno, prefix, line[len(prefix) :]))
    return found


def _split(rest: str, where: str) -> list[str]:
    """A directive line's words, split as sbatch splits them: quotes group, a
    backslash escapes, and an unquoted ``#`` starts a comment that runs to the end of
    the line, whatever it holds (``--gres=gpu:8  # can't be more``).

    >>> _split(" -o /x/%j.out  # can't use variables here", "line 2")
    ['-o', '/x/%j.out']
    >>> _split(' -J "a # b" --mem=4G#comment', "line 2")
    ['-J', 'a # b', '--mem=4G']
    """
    lexer = shlex.shlex(rest, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as exc:
        raise JobError(f"{where}: {exc}; close the quote") from exc


def _read_mtgpu(lineno: int, rest: str, raw: dict[str, _Raw]) -> None:
    for tok in _split(rest, f"line {lineno}: #MTGPU"):
        where = f"line {lineno}: #MTGPU {_cut(tok, 60)}"
        key, eq, value = tok.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not eq:
            raise JobError(f"{where}: expected key=value, such as gpus=1")
        _check_key(key, where)
        _set(raw, key, value, where, "#MTGPU")


def _check_key(key: str, where: str) -> None:
    if key not in DIRECTIVES:
        close = difflib.get_close_matches(key, DIRECTIVES, n=1)
        hint = f"did you mean {close[0]}?" if close else "expected one of " + ", ".join(DIRECTIVES)
        raise JobError(f"{where}: unknown directive {key!r}; {hint}")


def _read_sbatch(
    lineno: int | None, rest: str | list[str], raw: dict[str, _Raw], warnings: WarningTally
) -> None:
    """Read one ``#SBATCH`` line (``lineno``), or the command line's sbatch options
    (``lineno`` None, ``rest`` the tokens): each option takes effect, warns that it has
    none here, or refuses the submission naming the option and why."""
    if isinstance(rest, str):
        words = _split(rest, f"line {lineno}: #SBATCH")
        source, at = "#SBATCH", f"line {lineno}: #SBATCH"
    else:
        words, source, at = rest, "command line", "command line:"
    for opt, value, written in sbatch.tokens(words):
        where = f"{at} {_cut(written, 60)}"

        def warn(msg: str, where: str = where) -> None:
            warnings.add(f"{where}: {msg}")

        if not opt:
            raise JobError(
                f"{where}: not an option; #SBATCH lines hold sbatch options such as "
                "--gres=gpu:1 (quote a value with spaces)"
            )
        o = sbatch.BY_LONG.get(opt)
        if o is None:
            raise JobError(f"{where}: {sbatch.suggest(opt)}")
        if o.kind == "refuse":
            raise JobError(f"{where}: {opt} is refused: {o.why}; remove it to submit")
        if o.kind == "warn":
            warn(f"{opt} is ignored: {o.why}")
            continue
        if o.value is False and value is not None:
            raise JobError(f"{where}: {opt} takes no value; write {opt} alone")
        if o.kind == "flag":
            _set(raw, o.key, o.const, where, source)
            continue
        if value is None and o.value is True:
            raise JobError(f"{where}: needs a value; expected {opt}=VALUE")
        v = value if value is not None else ""
        try:
            if o.key in ("ram", "ram_per_cpu", "ram_per_gpu"):
                v = _sbatch_mem(v)
            elif o.key == "nodes":
                v = _sbatch_nodes(v, warn)
            elif o.key == "gres":
                v = _sbatch_gres(v)
            elif o.key == "exclusive":
                v = v or "yes"  # as #MTGPU exclusive=yes, so the two never conflict
        except ValueError as exc:
            key = {"nodes": "nodes", "gres": "gpus", "exclusive": "exclusive"}.get(o.key, "ram")
            raise JobError(f"{where}: {exc}; expected {DIRECTIVES[key]}") from exc
        _set(raw, "gpus" if o.key == "gres" else o.key, v, where, source)


#: Keys that say the same thing in different words: two of a group from different
#: kinds of line (``#MTGPU gpus=1`` and ``#SBATCH --gpus=2``) conflict.
_GROUPS = {
    "gpus_total": "gpus",
    "cpus_per_task": "cpus",
    "cpus_per_gpu": "cpus",
    "ram_per_cpu": "ram",
    "ram_per_gpu": "ram",
    "nice": "priority",
}


#: Pairs of keys that mean the same for the same value (on one member, one task).
_SAME = {frozenset({"cpus", "cpus_per_task"}), frozenset({"gpus", "gpus_total"})}


def _same(k1: str, v1: str, k2: str, v2: str) -> bool:
    return (k1 == k2 or frozenset({k1, k2}) in _SAME) and v1.strip() == v2.strip()


def _set(raw: dict[str, _Raw], key: str, value: str, where: str, source: str) -> None:
    """Record ``key=value`` from ``where``. A later line of the same kind wins, as in
    sbatch; the same setting on an ``#MTGPU`` and an ``#SBATCH`` line with different
    values is refused naming both; the command line wins over both."""
    bad = text_value_error(key, value)
    if bad is not None:
        raise JobError(f"{_cut(where, 80)}: {bad}")
    group = _GROUPS.get(key, key)
    for k, r in list(raw.items()):
        if _GROUPS.get(k, k) != group:
            continue
        if source == "command line":
            del raw[k]
        elif r.source != source and r.source != "command line" and not _same(k, r.value, key, value):
            raise JobError(f"{where} conflicts with {r.origin}; keep one of the two lines")
        elif source == "#SBATCH" and group == "ram" and k != key:
            raise JobError(
                f"{where} conflicts with {r.origin}: --mem, --mem-per-cpu and --mem-per-gpu "
                "are exclusive, as in sbatch; keep one"
            )
        elif k != key:
            del raw[k]  # the later line of the same kind wins
    raw[key] = _Raw(value, where, source)


def _build(
    raw: Mapping[str, _Raw],
    script: str,
    default_workdir: str,
    default_name: str,
    brands: Collection[str],
    warnings: WarningTally,
) -> JobSpec:
    def get(key: str, conv: Callable[[str], Any], default: Any) -> Any:
        r = raw.get(key)
        if r is None:
            return default
        if len(r.value) > MAX_DIRECTIVE_VALUE:
            where = r.origin if len(r.origin) <= 80 else r.origin[:60] + "..."
            raise JobError(
                f"{where}: the value of {key} is {len(r.value)} characters; a "
                f"directive's value is at most {MAX_DIRECTIVE_VALUE}"
            )
        try:
            return conv(r.value)
        except ValueError as exc:
            said = str(exc)
            expected = "" if "expected" in said else f"; expected {_EXPECTED[key]}"
            raise JobError(f"{r.origin}: {said}{expected}") from exc

    gpus, brand, gpu_type = get("gpus", lambda v: parse_gpus(v, brands), (0, None, None))
    nodes = get("nodes", _positive_int, 1)
    if "gpus_total" in raw and ("gpus" not in raw or _later(raw["gpus_total"], raw["gpus"])):
        r = raw["gpus_total"]
        try:
            total, brand, gpu_type = parse_gpus(r.value, brands)
        except ValueError as exc:
            raise JobError(f"{r.origin}: {exc}; expected [TYPE:]N, such as a100:4") from exc
        if total % nodes:
            raise JobError(
                f"{r.origin}: {total} GPUs do not split evenly over {nodes} nodes; "
                f"expected a multiple of {nodes} (or use --gpus-per-node)"
            )
        gpus = total // nodes
    vram = get("vram", _size, 0)
    mode = get("gpu_mode", GpuMode, GpuMode.SHARED if vram else GpuMode.EXCLUSIVE)
    if gpus == 0:
        for key in ("gpu_mode", "vram"):
            if key in raw:
                raise JobError(
                    f"{raw[key].origin}: {key} applies to GPUs, but the job asks for none; "
                    f"expected gpus=N as well, such as gpus=1"
                )
    if mode is GpuMode.SHARED and not vram:
        raise JobError(
            f"{raw['gpu_mode'].origin}: gpu_mode=shared needs the VRAM to guarantee; "
            f"expected vram=SIZE as well, such as vram=20G"
        )
    if mode is GpuMode.OVERCOMMIT and not vram:
        raise JobError(
            f"{raw['gpu_mode'].origin}: gpu_mode=overcommit places by measured free VRAM; "
            f"expected vram=SIZE as well, such as vram=8G"
        )
    servers = get("server", expand_hostlist, ())
    if servers and len(servers) < nodes:
        raise JobError(
            f"{raw['server'].origin}: {len(servers)} server(s) cannot hold {nodes} members; "
            f"expected at least {nodes} servers, or fewer nodes"
        )
    # Tasks (as sbatch counts them): the script runs once per member; the CPUs are
    # the tasks' (--ntasks x --cpus-per-task), and srun-style launchers read the counts.
    per_node = get("ntasks_per_node", _positive_int, None)
    ntasks = get("ntasks", _positive_int, None)
    if per_node is None and ntasks is not None:
        if ntasks % nodes:
            raise JobError(
                f"{raw['ntasks'].origin}: {ntasks} tasks do not split evenly over {nodes} "
                f"nodes; expected a multiple of {nodes} (or use --ntasks-per-node)"
            )
        per_node = ntasks // nodes
    if per_node is not None and ntasks is not None and ntasks != per_node * nodes:
        raise JobError(
            f"{raw['ntasks'].origin} conflicts with {raw['ntasks_per_node'].origin} on "
            f"{nodes} node(s); keep one"
        )
    tasks = per_node or 1
    cpus_per_task = get("cpus_per_task", _positive_int, None)
    cpus_per_gpu = get("cpus_per_gpu", _positive_int, None)
    if "cpus" in raw:
        cpus = get("cpus", _positive_int, DEFAULT_CPUS)
    elif cpus_per_task is not None:
        cpus = tasks * cpus_per_task
    elif cpus_per_gpu is not None:
        if not gpus:
            raise JobError(f"{raw['cpus_per_gpu'].origin}: the job asks for no GPUs; expected --gpus as well")
        cpus = gpus * cpus_per_gpu
    else:
        cpus = max(DEFAULT_CPUS, tasks)
    cpus = max(cpus, get("mincpus", _positive_int, 1))
    ram = get("ram", _ram, DEFAULT_RAM)
    if "ram_per_cpu" in raw:
        ram = get("ram_per_cpu", _size, 0) * cpus
    elif "ram_per_gpu" in raw:
        if not gpus:
            raise JobError(f"{raw['ram_per_gpu'].origin}: the job asks for no GPUs; expected --gpus as well")
        ram = get("ram_per_gpu", _size, 0) * gpus
    priority = get("priority", _priority, DEFAULT_PRIORITY)
    if "nice" in raw:
        nice = get("nice", lambda v: parse_count(v or "100"), 100)
        priority = max(MIN_PRIORITY, DEFAULT_PRIORITY - nice)
    request = ResourceRequest(
        gpus=gpus,
        gpu_brand=brand,
        gpu_type=gpu_type,
        gpu_mode=mode,
        vram=vram,
        cpus=cpus,
        ram=ram,
        nodes=nodes,
        servers=servers,
        exclude=get("exclude", expand_hostlist, ()),
        constraint=get("constraint", _constraint, None),
        whole_member=get("exclusive", _exclusive, False) or ram == ALL_RAM,
    )
    array = get("array", lambda v: (v.strip(), parse_array(v)), None)
    workdir = get("workdir", _text, default_workdir)
    if not posixpath.isabs(workdir):
        workdir = posixpath.normpath(posixpath.join(default_workdir, workdir))
    return JobSpec(
        request=request,
        script=script,
        name=get("name", _name, default_name),
        array=array[0] if array else None,
        array_limit=array[1][1] if array else None,
        priority=priority,
        time_limit=get("time", parse_time_limit, None),
        output=get("output", _text, None),
        error=get("error", _text, None),
        workdir=workdir,
        container=get("container", _text, None),
        requeue=get("requeue", _requeue, False),
        warnings=warnings.lines(),
        ntasks=per_node * nodes if per_node is not None else None,
        ntasks_per_node=per_node,
        export=get("export", _export, None),
        hold=get("hold", _requeue, False),
        dependency=get("dependency", _dependency, None),
        begin=get("begin", _begin, None),
        kill_on_invalid_dep=get("kill_on_invalid_dep", _requeue, True),
        test_only=get("test_only", _requeue, False),
        wait=get("wait", _requeue, False),
        open_mode=get("open_mode", _open_mode, "truncate"),
        signal=get("signal", _signal, None),
        cpus_per_task=cpus_per_task if cpus_per_task is not None else (cpus // tasks if per_node else None),
    )


def _later(a: _Raw, b: _Raw) -> bool:
    """True if ``a`` was written after ``b`` (command line beats any line)."""

    def rank(r: _Raw) -> float:
        m = re.match(r"line (\d+)", r.origin)
        return float(m.group(1)) if m else float("inf")

    return rank(a) > rank(b)


def parse_job_file(
    text: str,
    overrides: Mapping[str, str] | None = None,
    *,
    default_workdir: str,
    default_name: str = "job",
    brands: Collection[str] = KNOWN_BRANDS,
    options: list[str] | None = None,
) -> JobSpec:
    """Parse a job file's directives, apply command-line ``overrides``, and validate.

    ``options`` are sbatch options given on the command line (``["-J", "x"]``, as
    :func:`mtgpu.schedd.sbatch.argv_of` makes them); they win over the file, and
    ``overrides`` win over them.

    ``overrides`` uses the directive keys (``{"gpus": "nvidia:2"}``); dashes and a
    leading ``--`` are accepted. ``default_workdir`` is the submit directory (or the
    tenant's home for ``mt-job submit -``); a relative ``workdir`` is taken from it.
    ``brands`` lists the names that ``gpus=NAME:N`` treats as a brand rather than a type.
    Raises :class:`~mtgpu.errors.JobError` naming the line and directive; a NUL or an
    undecodable byte it quotes is written as an escape (``\\udcff``).
    """
    try:
        return _parse(text, overrides, default_workdir, default_name, brands, options)
    except JobError as exc:
        said = str(exc)
        if _NOT_TEXT.search(said) is None:
            raise
        raise JobError(_shown(said)) from None


def _parse(
    text: str,
    overrides: Mapping[str, str] | None,
    default_workdir: str,
    default_name: str,
    brands: Collection[str],
    options: list[str] | None,
) -> JobSpec:
    if not text.strip():
        raise JobError(
            "the job file is empty; write the commands the job runs in it "
            "(sbatch refuses an empty script too)"
        )
    for field, value in (("workdir", default_workdir), ("name", default_name)):
        bad = text_value_error(field, value)
        if bad is not None:
            raise JobError(f"submission: {bad}")
    raw: dict[str, _Raw] = {}
    warnings = WarningTally()  # repeats counted, bounded: the job's record keeps them
    for lineno, prefix, rest in _directive_lines(text):
        if prefix == "#MTGPU":
            _read_mtgpu(lineno, rest, raw)
        else:
            _read_sbatch(lineno, rest, raw, warnings)
    if options:
        _read_sbatch(None, list(options), raw, warnings)
    for key, value in (overrides or {}).items():
        k = key.removeprefix("--").strip().lower().replace("-", "_")
        value = str(value)
        shown = value if len(value) <= 60 else value[:40] + f"... ({len(value)} characters)"
        where = f"command line: --{k[:40]}={shown}"
        _check_key(k, where)
        _set(raw, k, str(value), where, "command line")
    return _build(raw, text, default_workdir, default_name, brands, warnings)
