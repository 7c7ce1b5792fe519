"""What the submitting shell hands its job: its environment, umask and resource limits.

As with Slurm's ``sbatch``, a job starts with the environment of the shell that
submitted it (``--export``, default ``ALL``) minus what MTGPU sets itself, with that
shell's umask, and with its resource limits (``ulimit -n``, ``-s``, ``-c``...), as
Slurm's ``PropagateResourceLimits`` does by default; an administrator chooses which
limits with ``PROPAGATE_RESOURCE_LIMITS``. The clients send what they have; this
module checks it (it is the tenant's input) and keeps what applies. Limits are applied
after the job has become the tenant, so the kernel holds them within the member's own
hard limits: a tenant can lower a limit, never raise one.

Everything here is pure, so it is tested with tables.
"""

from __future__ import annotations

import re
import resource
from collections.abc import Iterable, Mapping
from typing import Any

from mtgpu.errors import JobError

#: The limits Slurm's PropagateResourceLimits names, by its names (lower case), as
#: PROPAGATE_RESOURCE_LIMITS takes them (RESOURCE_LIMIT_NAMES in mtgpu.config.options).
RLIMITS: dict[str, int] = {
    "as": resource.RLIMIT_AS,
    "core": resource.RLIMIT_CORE,
    "cpu": resource.RLIMIT_CPU,
    "data": resource.RLIMIT_DATA,
    "fsize": resource.RLIMIT_FSIZE,
    "memlock": resource.RLIMIT_MEMLOCK,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "rss": resource.RLIMIT_RSS,
    "stack": resource.RLIMIT_STACK,
}
#: -1 on the wire is "unlimited" (RLIM_INFINITY).
UNLIMITED = -1
_MAX_LIMIT = (1 << 63) - 1
#: The most bytes of exported environment a job keeps (names, values, ``=`` and a
#: separator each): enough for a conda environment's, small next to a script.
MAX_EXPORT_BYTES = 256 << 10
#: The most variables a job keeps.
MAX_EXPORT_VARS = 4096
#: The most bytes of environment a client sends (it sends all it has, up to this).
MAX_SENT_ENV_BYTES = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}", re.ASCII)
#: Variables MTGPU sets for the job itself (or that describe the submitting session,
#: not the job's): never taken from the submitting shell.
NOT_EXPORTED = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "MAIL",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TMUX",
        "TMUX_PANE",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "DBUS_SESSION_BUS_ADDRESS",
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "NVIDIA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
#: Prefixes of variables MTGPU sets (or that belong to the submitting session).
NOT_EXPORTED_PREFIXES = ("MTGPU_", "SLURM_", "SLURMD_", "PET_", "SSH_")


def check_umask(value: Any) -> int | None:
    """The submitting shell's umask as sent (None: not sent)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0o777:
        raise JobError("umask must be a number from 0 to 0o777")
    return value


def check_rlimits(value: Any, propagate: Iterable[str]) -> dict[str, list[int]]:
    """The submitting shell's limits as sent, ``{"nofile": [soft, hard]}`` (-1 for
    unlimited), checked, keeping only the ones in ``propagate``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > len(RLIMITS):
        raise JobError("rlimits must map limit names to [soft, hard]")
    keep = set(propagate)
    out: dict[str, list[int]] = {}
    for name, pair in value.items():
        if name not in RLIMITS:
            raise JobError(
                f"rlimits: {str(name)[:20]!r} is not a limit; expected one of {', '.join(RLIMITS)}"
            )
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and -1 <= n <= _MAX_LIMIT for n in pair)
        ):
            raise JobError(f"rlimits: {name} must be [soft, hard], whole numbers, -1 for unlimited")
        if name in keep:
            out[name] = [int(pair[0]), int(pair[1])]
    return out


def check_env(value: Any) -> dict[str, str]:
    """The submitting shell's environment as sent, checked (bounded before use)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JobError("env must map names to values")
    total = 0
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise JobError("env must map names to values (strings)")
        total += len(k) + len(v) + 2
        if total > MAX_SENT_ENV_BYTES:
            raise JobError(f"the environment sent is over {MAX_SENT_ENV_BYTES} bytes")
    return value


def exported(env: Mapping[str, str], export: str | None) -> dict[str, str]:
    """What of the submitting ``env`` the job gets, as sbatch's ``--export`` says:
    ``ALL`` (the default), ``NONE``, or names and ``NAME=value`` pairs, after ``ALL,``
    to add to everything (``ALL,EPOCHS=3``) or alone (only those). Variables MTGPU
    sets are never taken, and the result is bounded (MAX_EXPORT_BYTES).

    >>> exported({"A": "1", "B": "2", "HOME": "/x"}, None)
    {'A': '1', 'B': '2'}
    >>> exported({"A": "1", "B": "2"}, "B,C=3")
    {'B': '2', 'C': '3'}
    >>> exported({"A": "1"}, "NONE")
    {}
    """
    spec = (export or "ALL").strip()
    items = [p for p in spec.split(",") if p.strip()] or ["ALL"]
    out: dict[str, str] = {}
    head = items[0].strip().upper()
    if head == "ALL":
        out.update(env)
        items = items[1:]
    elif head == "NONE":
        items = items[1:]
    for item in items:
        name, eq, val = item.partition("=")
        name = name.strip()
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name[:40]!r} is not a variable name")
        if eq:
            out[name] = val
        elif name in env:
            out[name] = env[name]
    kept = {k: v for k, v in out.items() if exportable(k) and "\0" not in v and not _SURROGATE.search(v)}
    size = sum(len(k) + len(v) + 2 for k, v in kept.items())
    if size > MAX_EXPORT_BYTES or len(kept) > MAX_EXPORT_VARS:
        raise ValueError(
            f"the exported environment is {size} bytes in {len(kept)} variables; a job "
            f"takes at most {MAX_EXPORT_BYTES} bytes and {MAX_EXPORT_VARS} variables: "
            "name the ones it needs (--export=NAME,...) or --export=NONE"
        )
    return kept


def exportable(name: str) -> bool:
    """True if a variable of this name may come from the submitting shell.

    >>> exportable("PATH"), exportable("MTGPU_JOB_ID"), exportable("HOME"), exportable("A B")
    (True, False, False, False)
    """
    return (
        bool(_NAME.fullmatch(name))
        and name not in NOT_EXPORTED
        and not name.startswith(NOT_EXPORTED_PREFIXES)
    )


def limits_argument(rlimits: Mapping[str, Any]) -> str:
    """The job-start helper's RLIMITS argument: ``nofile=1024:4096,stack=-1:-1``.

    >>> limits_argument({"nofile": [1024, 4096], "core": [0, -1]})
    'core=0:-1,nofile=1024:4096'
    """
    return ",".join(f"{n}={int(p[0])}:{int(p[1])}" for n, p in sorted(rlimits.items()) if n in RLIMITS)


def apply_limits(rlimits: Mapping[str, Any]) -> None:
    """Set the job's limits (called once it is the tenant: each is held within the hard
    limit it inherited, which it cannot raise)."""
    inf = resource.RLIM_INFINITY
    for name, pair in sorted(rlimits.items()):
        res = RLIMITS.get(name)
        if res is None:
            continue
        _, cur_hard = resource.getrlimit(res)
        soft, hard = (inf if n == UNLIMITED else int(n) for n in pair)

        def below(a: int, b: int) -> int:
            return b if a == inf else (a if b == inf else min(a, b))

        hard = below(hard, cur_hard)
        resource.setrlimit(res, (below(soft, hard), hard))
