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

from mtgpu.config.units import parse_size
from mtgpu.errors import JobError
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
    "output": "a file path; %j, %A, %a, %x, %u and %N are expanded",
    "error": "a file path; %j, %A, %a, %x, %u and %N are expanded",
    "workdir": "a directory path",
    "requeue": "yes or no",
}


@dataclass(frozen=True, slots=True)
class _Raw:
    """One key's value as written, and where: ``line 4: #MTGPU vram=20G``."""

    value: str
    origin: str


# --------------------------------------------------------------------------- values


def _size(value: str) -> int:
    if re.fullmatch(r"\s*\d+\s*", value) and int(value) != 0:
        # A bare number here is almost always a unit forgotten; bytes would be a surprise.
        raise ValueError(f"{value!r} has no unit")
    try:
        n = parse_size(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a size") from None
    if n <= 0:
        raise ValueError(f"{value!r} is not a positive size")
    return n


def _positive_int(value: str) -> int:
    if not re.fullmatch(r"\d+", value.strip()) or int(value) < 1:
        raise ValueError(f"{value!r} is not a whole number of at least 1")
    return int(value)


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
    if parts and re.fullmatch(r"\d+", parts[-1]):
        count = int(parts.pop())
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
        if not re.fullmatch(r"\d+", lim) or int(lim) < 1:
            raise ValueError(f"{value!r}: the limit after % must be a whole number of at least 1")
        limit = int(lim)
    indices: set[int] = set()
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", item.strip())
        if not m:
            raise ValueError(f"{value!r} is not an array spec")
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


def expand_hostlist(value: str) -> tuple[str, ...]:
    """Expand a Slurm-style host list.

    >>> expand_hostlist("gpu[01-03,07],cpu1")
    ('gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu1')
    """
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", value):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item.strip())
        if not m:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", item.strip()):
                raise ValueError(f"{item.strip()!r} is not a server name")
            names.append(item.strip())
            continue
        prefix, body, suffix = m.groups()
        for part in body.split(","):
            r = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if not r:
                raise ValueError(f"{item!r} is not a host list")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            width = len(lo)
            names.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    if not names:
        raise ValueError(f"{value!r} names no server")
    return tuple(dict.fromkeys(names))


def _requeue(value: str) -> bool:
    v = value.strip().lower()
    if v in ("yes", "true", "1", "on"):
        return True
    if v in ("no", "false", "0", "off"):
        return False
    raise ValueError(f"{value!r} is not yes or no")


def _priority(value: str) -> int:
    if not re.fullmatch(r"-?\d+", value.strip()) or not MIN_PRIORITY <= int(value) <= MAX_PRIORITY:
        raise ValueError(f"{value!r} is out of range")
    return int(value)


def _text(value: str) -> str:
    if not value.strip() or "\n" in value or "\0" in value:
        raise ValueError(f"{value!r} is empty or has a line break")
    return value.strip()


def check_priority(priority: int, *, is_admin: bool) -> None:
    """Refuse a priority above the default unless the submitter is an admin."""
    if priority > DEFAULT_PRIORITY and not is_admin:
        raise JobError(f"priority={priority}: only an admin may raise a job above the default "
                       f"{DEFAULT_PRIORITY}; use {MIN_PRIORITY}..{DEFAULT_PRIORITY} to lower it")


def expand_output_pattern(pattern: str, *, job_id: str, name: str, user: str, node: str = "",
                          array_id: str | None = None, array_task: int | None = None) -> str:
    """Fill in Slurm's filename patterns: %j job id, %A array id, %a task, %x name, %u user, %N node.

    >>> expand_output_pattern("out-%A_%a-%x.log", job_id="7_3", name="t", user="ann", array_id="7", array_task=3)
    'out-7_3-t.log'
    """
    table = {"j": job_id, "A": array_id or job_id, "a": "" if array_task is None else str(array_task),
             "x": name, "u": user, "N": node, "%": "%"}
    return re.sub(r"%([jAaxuN%])", lambda m: table[m.group(1)], pattern)


# --------------------------------------------------------------------------- #SBATCH

#: Options that take no value; named so the next word is not eaten as their value.
_SBATCH_FLAGS = {"--requeue", "--no-requeue", "--exclusive", "--hold", "-H", "--parsable", "-Q",
                 "--quiet", "-v", "--verbose", "--wait", "-W", "--oversubscribe", "-s",
                 "--contiguous", "--overcommit", "-O", "--spread-job", "--test-only", "--use-min-nodes"}
#: sbatch options that map one to one onto an ``#MTGPU`` key.
_SBATCH_SIMPLE = {"--job-name": "name", "--cpus-per-task": "cpus", "--array": "array",
                  "--output": "output", "--error": "error", "--time": "time", "--chdir": "workdir",
                  "--gpus-per-node": "gpus", "--container-image": "container"}
_SBATCH_SHORT = {"-J": "--job-name", "-c": "--cpus-per-task", "-N": "--nodes", "-a": "--array",
                 "-w": "--nodelist", "-o": "--output", "-e": "--error", "-t": "--time",
                 "-D": "--chdir", "-G": "--gpus"}


def _sbatch_tokens(tokens: list[str]) -> list[tuple[str, str | None, str]]:
    """Split sbatch arguments into (long option, value, as written): ``-J x``, ``-Jx``, ``--job-name=x``."""
    out: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("-") or len(tok) < 2:
            out.append(("", tok, tok))
            continue
        if tok.startswith("--"):
            opt, eq, attached = tok.partition("=")
        else:
            opt, attached = _SBATCH_SHORT.get(tok[:2], tok[:2]), tok[2:].removeprefix("=")
            eq = "=" if attached else ""
        if eq:
            out.append((opt, attached, tok))
        elif tok not in _SBATCH_FLAGS and i < len(tokens) and not tokens[i].startswith("-"):
            out.append((opt, tokens[i], f"{tok} {tokens[i]}"))
            i += 1
        else:
            out.append((opt, None, tok))
    return out


def _sbatch_mem(value: str) -> str:
    # Slurm reads a bare --mem as megabytes.
    v = value.strip()
    if re.fullmatch(r"\d+", v):
        if int(v) == 0:
            raise ValueError("--mem=0 (all of a node's memory) is not supported")
        return v + "M"
    return v


def _sbatch_gres(value: str) -> str:
    items = [g for g in value.split(",") if g.strip().lower().startswith("gpu")]
    if len(items) != 1:
        raise ValueError(f"{value!r} asks for no GPUs or for GPUs twice")
    parts = items[0].strip().split(":")[1:]
    return ":".join(parts) if parts else "1"


def _sbatch_nodes(value: str, warn: Callable[[str], None]) -> str:
    m = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if m:
        warn(f"a node range ({value}) is not supported; using the minimum, {m.group(1)}")
        return m.group(1)
    return value


# --------------------------------------------------------------------------- parsing


def _directive_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, prefix, rest) for every directive in the leading comment block."""
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # like sbatch: directives end at the first command
        for prefix in ("#MTGPU", "#SBATCH"):
            if line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)].isspace()):
                found.append((lineno, prefix, line[len(prefix):]))
    return found


def _split(rest: str, where: str) -> list[str]:
    try:
        tokens = shlex.split(rest)
    except ValueError as exc:
        raise JobError(f"{where}: {exc}; close the quote") from exc
    for i, tok in enumerate(tokens):
        if tok.startswith("#"):  # a trailing comment
            return tokens[:i]
    return tokens


def _read_mtgpu(lineno: int, rest: str, raw: dict[str, _Raw]) -> None:
    for tok in _split(rest, f"line {lineno}: #MTGPU"):
        where = f"line {lineno}: #MTGPU {tok}"
        key, eq, value = tok.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not eq:
            raise JobError(f"{where}: expected key=value, such as gpus=1")
        _check_key(key, where)
        raw[key] = _Raw(value, where)


def _check_key(key: str, where: str) -> None:
    if key not in DIRECTIVES:
        close = difflib.get_close_matches(key, DIRECTIVES, n=1)
        hint = f"did you mean {close[0]}?" if close else "expected one of " + ", ".join(DIRECTIVES)
        raise JobError(f"{where}: unknown directive {key!r}; {hint}")


def _read_sbatch(lineno: int, rest: str, raw: dict[str, _Raw], warnings: list[str]) -> None:
    for opt, value, written in _sbatch_tokens(_split(rest, f"line {lineno}: #SBATCH")):
        where = f"line {lineno}: #SBATCH {written}"

        def warn(msg: str, where: str = where) -> None:
            warnings.append(f"{where}: {msg}")

        simple = _SBATCH_SIMPLE
        if opt in ("--requeue", "--no-requeue"):
            raw["requeue"] = _Raw("yes" if opt == "--requeue" else "no", where)
            continue
        if opt and value is None:
            if opt in simple or opt in ("--mem", "--nodes", "--gres", "--gpus", "--nodelist"):
                raise JobError(f"{where}: needs a value; expected {opt}=VALUE")
            warn("option not supported by MTGPU; ignored")
            continue
        try:
            if opt in simple:
                raw[simple[opt]] = _Raw(value or "", where)
            elif opt == "--mem":
                raw["ram"] = _Raw(_sbatch_mem(value or ""), where)
            elif opt == "--nodes":
                raw["nodes"] = _Raw(_sbatch_nodes(value or "", warn), where)
            elif opt == "--gres":
                raw["gpus"] = _Raw(_sbatch_gres(value or ""), where)
            elif opt == "--gpus":
                # Slurm's --gpus counts the whole job; it is split over members at the end.
                raw["gpus_total"] = _Raw(value or "", where)
            elif opt == "--nodelist":
                raw["server"] = _Raw(value or "", where)
            elif not opt:
                warn("not an option; ignored")
            else:
                warn("option not supported by MTGPU; ignored")
        except ValueError as exc:
            key = {"--mem": "ram", "--nodes": "nodes", "--gres": "gpus"}.get(opt, "gpus")
            raise JobError(f"{where}: {exc}; expected {DIRECTIVES[key]}") from exc


def _build(raw: Mapping[str, _Raw], script: str, default_workdir: str, default_name: str,
           brands: Collection[str], warnings: list[str]) -> JobSpec:
    def get(key: str, conv: Callable[[str], Any], default: Any) -> Any:
        r = raw.get(key)
        if r is None:
            return default
        try:
            return conv(r.value)
        except ValueError as exc:
            said = str(exc)
            expected = "" if "expected" in said else f"; expected {DIRECTIVES[key]}"
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
            raise JobError(f"{r.origin}: {total} GPUs do not split evenly over {nodes} nodes; "
                           f"expected a multiple of {nodes} (or use --gpus-per-node)")
        gpus = total // nodes
    vram = get("vram", _size, 0)
    mode = get("gpu_mode", GpuMode, GpuMode.SHARED if vram else GpuMode.EXCLUSIVE)
    if gpus == 0:
        for key in ("gpu_mode", "vram"):
            if key in raw:
                raise JobError(f"{raw[key].origin}: {key} applies to GPUs, but the job asks for none; "
                               f"expected gpus=N as well, such as gpus=1")
    if mode is GpuMode.SHARED and not vram:
        raise JobError(f"{raw['gpu_mode'].origin}: gpu_mode=shared needs the VRAM to guarantee; "
                       f"expected vram=SIZE as well, such as vram=20G")
    if mode is GpuMode.OVERCOMMIT and not vram:
        raise JobError(f"{raw['gpu_mode'].origin}: gpu_mode=overcommit places by measured free VRAM; "
                       f"expected vram=SIZE as well, such as vram=8G")
    servers = get("server", expand_hostlist, ())
    if servers and len(servers) < nodes:
        raise JobError(f"{raw['server'].origin}: {len(servers)} server(s) cannot hold {nodes} members; "
                       f"expected at least {nodes} servers, or fewer nodes")
    request = ResourceRequest(gpus=gpus, gpu_brand=brand, gpu_type=gpu_type, gpu_mode=mode, vram=vram,
                              cpus=get("cpus", _positive_int, DEFAULT_CPUS),
                              ram=get("ram", _size, DEFAULT_RAM), nodes=nodes, servers=servers)
    array = get("array", lambda v: (v.strip(), parse_array(v)), None)
    workdir = get("workdir", _text, default_workdir)
    if not posixpath.isabs(workdir):
        workdir = posixpath.normpath(posixpath.join(default_workdir, workdir))
    return JobSpec(request=request, script=script, name=get("name", _text, default_name),
                   array=array[0] if array else None, array_limit=array[1][1] if array else None,
                   priority=get("priority", _priority, DEFAULT_PRIORITY),
                   time_limit=get("time", parse_time_limit, None),
                   output=get("output", _text, None), error=get("error", _text, None),
                   workdir=workdir, container=get("container", _text, None),
                   requeue=get("requeue", _requeue, False), warnings=tuple(warnings))


def _later(a: _Raw, b: _Raw) -> bool:
    """True if ``a`` was written after ``b`` (command line beats any line)."""
    def rank(r: _Raw) -> float:
        m = re.match(r"line (\d+)", r.origin)
        return float(m.group(1)) if m else float("inf")
    return rank(a) > rank(b)


def parse_job_file(text: str, overrides: Mapping[str, str] | None = None, *, default_workdir: str,
                   default_name: str = "job", brands: Collection[str] = KNOWN_BRANDS) -> JobSpec:
    """Parse a job file's directives, apply command-line ``overrides``, and validate.

    ``overrides`` uses the directive keys (``{"gpus": "nvidia:2"}``); dashes and a
    leading ``--`` are accepted. ``default_workdir`` is the submit directory (or the
    tenant's home for ``mt-job submit -``); a relative ``workdir`` is taken from it.
    ``brands`` lists the names that ``gpus=NAME:N`` treats as a brand rather than a type.
    Raises :class:`~mtgpu.errors.JobError` naming the line and directive.
    """
    raw: dict[str, _Raw] = {}
    warnings: list[str] = []
    for lineno, prefix, rest in _directive_lines(text):
        if prefix == "#MTGPU":
            _read_mtgpu(lineno, rest, raw)
        else:
            _read_sbatch(lineno, rest, raw, warnings)
    for key, value in (overrides or {}).items():
        k = key.removeprefix("--").strip().lower().replace("-", "_")
        where = f"command line: --{k}={value}"
        _check_key(k, where)
        raw[k] = _Raw(str(value), where)
    return _build(raw, text, default_workdir, default_name, brands, warnings)
