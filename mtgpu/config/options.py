"""The typed options object and the validating loader behind :mod:`mtgpu.config`.

Each key has one validator. A validator gets the raw YAML value and either returns
the typed value or raises ``ValueError`` with what is expected; the loader adds the
key path and line. Adding a key is one entry in :data:`_KEYS` and one field on
:class:`Options`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtgpu.config.units import MAX_COUNT, finite_number, format_size, parse_duration, parse_size
from mtgpu.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/mtgpu/mtgpu.yaml"

# systemd reserves these UID ranges (systemd's UIDS-GIDS.md); tenants stay clear.
_SYSTEMD_RESERVED = [
    (60001, 60513, "systemd-homed"),
    (61184, 65519, "systemd DynamicUser"),
    (65534, 65534, "nobody"),
    (65535, 65535, "16-bit -1"),
    (524288, 1879048191, "systemd-nspawn containers"),
]

# mtgpu.accounts.provision.SUBID_UID_MAX: 65536 subordinate IDs per UID from 2**31 up.
_UID_MAX_WITH_SUBIDS = 33767

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
_SERVER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


#: A NODE_FEATURES name, and the most a member may list (and a --constraint name).
FEATURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
MAX_NODE_FEATURES = 64


def _node_features(value: Any) -> tuple[str, ...]:
    """``NODE_FEATURES``: a list of feature names (or one comma-separated string).

    >>> _node_features(["a100", "nvlink", "a100"]), _node_features("ib, nvme")
    (('a100', 'nvlink'), ('ib', 'nvme'))
    """
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of feature names, such as [a100, nvlink, ib]")
    if len(value) > MAX_NODE_FEATURES:
        raise ValueError(f"{len(value)} features; a member lists at most {MAX_NODE_FEATURES}")
    for v in value:
        if not FEATURE_NAME.fullmatch(v):
            raise ValueError(f"{v[:40]!r} is not a feature name (letters, digits, '_', '.', '-'; at most 64)")
    return tuple(dict.fromkeys(value))


#: The resource limits PROPAGATE_RESOURCE_LIMITS may name: Slurm's names, lower case.
RESOURCE_LIMIT_NAMES = ("as", "core", "cpu", "data", "fsize", "memlock", "nofile", "nproc", "rss", "stack")


@dataclass(frozen=True)
class SimulatedGpuSpec:
    """One ``SIMULATED_GPUS`` entry: ``count`` GPUs of ``type`` with ``vram`` bytes each."""

    type: str
    count: int
    vram: int
    brand: str = "nvidia"
    used: int = 0
    #: A directory of stand-in device files (``nvidiaN`` for GPU N), which the
    #: device cgroups of jobs then allow or deny as they would real ones.
    device_dir: str = ""
    #: MIG profiles each card of the entry is split into (``3g.40gb``...); each is a
    #: GPU of its own under its card, as a card in MIG mode is (see mtgpu.gpuinfo).
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuProbeSpec:
    """One ``GPU_PROBES`` entry: a command printing JSON for another GPU brand."""

    brand: str
    command: tuple[str, ...]
    visibility_env: str
    devices: tuple[str, ...] = ()
    name: str = ""
    timeout: float = 10.0


@dataclass(frozen=True)
class InterpreterSpec:
    """One ``PYTHON_INTERPRETERS`` entry: an interpreter's path and, optionally, its name.

    Without a name, the interpreter is named from its version (``python3.11``) when
    the daemon first runs it.
    """

    path: str
    name: str = ""


@dataclass(frozen=True)
class ContainersOptions:
    """The ``CONTAINERS`` mapping (workspaces). Details are validated per key.

    ``templates`` maps a name to a plain dict with ``image`` (always), ``gpus``,
    ``gpu_type``, ``cpus``, ``ram`` (bytes), ``ports`` (container ports), ``env``,
    ``mounts`` (``{source, target, readonly}``; a source may start with ``~/``),
    ``command`` and ``description``. ``registry`` is ``{url, credentials,
    tls_verify}``. ``archive_dir`` holds the pre-pulled images as archives that
    tenants' own podman loads.
    """

    enabled: bool = False
    templates: Mapping[str, Any] = field(default_factory=dict)
    prepull: tuple[str, ...] = ()
    registry: Mapping[str, Any] | None = None
    cache_volumes: tuple[str, ...] = ()
    network: bool = True
    port_publishing: str = "loopback"
    allow_user_images: bool = False
    archive_dir: str = "/var/cache/mtgpu/images"
    #: Most bytes of images streamed from other members kept here (least recently
    #: used go first).
    image_cache: int = 20 << 30
    #: The network of containerized jobs: ``host`` (the member's, as native jobs have,
    #: so the parts of a ``nodes=N`` job reach each other) or ``private`` (as workspaces).
    job_network: str = "host"
    #: Where tenants' container stores live: ``home``, ``auto`` (local disk when the
    #: homes are on a network filesystem) or a local directory (``PATH/UID/storage``).
    storage: str = "auto"


@dataclass(frozen=True)
class Options:
    """Every configuration key, typed. Field names are the keys in lower case."""

    cluster_mode: str = "standalone"
    cluster_id: str = ""
    cluster_key: str = ""
    cluster_peers: tuple[str, ...] = ()
    cluster_advertise: str = ""
    cluster_voter_grace: float = 60.0
    cluster_lost_after: float = 30.0
    cluster_fence_grace: float = 5.0
    cluster_connect_timeout: float = 5.0
    server_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    ssh_listen: tuple[str, int] = ("0.0.0.0", 2222)
    state_dir: str = "/var/lib/mtgpu"
    run_dir: str = "/run/mtgpu"
    tenant_home_root: str = "/home"
    tenant_uid_range: tuple[int, int] = (20000, 29999)
    rendezvous_ports: tuple[int, int] = (29500, 39499)
    tenant_shell: str = "/bin/bash"
    # Tenant sessions' cgroup and private temporary places (mtgpu/schedd/fence.py).
    session_memory: int | str | None = "50%"
    # All tenants' sessions together (mtgpu.slice); jobs are offered the rest.
    sessions_memory: int | str | None = "25%"
    session_pids: int | None = 4096
    session_cpu_weight: int = 100
    session_gpus: str = "none"
    private_tmp: bool = True
    private_tmp_size: int = 4 << 30
    # Each tenant's own network namespace (mtgpu/schedd/netns.py).
    tenant_network: str = "private"
    tenant_network_subnet: str = "100.72.0.0/16"
    admins: tuple[str, ...] = ()
    containers: ContainersOptions = field(default_factory=ContainersOptions)
    datasets_directories: tuple[str, ...] = ()
    python_interpreters: tuple[InterpreterSpec, ...] = ()
    user_disk_limit: int | None = None
    user_disk_scan_interval: float = 60.0
    user_submit_rate: float | None = 20.0
    user_submit_burst: int = 200
    user_max_queued_jobs: int | None = 10000
    job_script_max: int = 1 << 20
    #: This member's features, for sbatch's --constraint.
    node_features: tuple[str, ...] = ()
    #: The submitting shell's limits a job takes (lower-case names; empty: none).
    propagate_resource_limits: frozenset[str] = frozenset(RESOURCE_LIMIT_NAMES)
    user_max_queued_script_bytes: int | None = 64 << 20
    job_retention_days: float = 30
    #: Days the usage sums per tenant and day (``mtgpu-admin report``) are kept.
    usage_retention_days: float = 400
    tenant_retention_days: float | None = None
    tenant_retention_grace: float = 7 * 86400
    tenant_retention_warn_days: float = 7
    tenant_retention_home: str = "archive"
    tenant_retention_archive_dir: str = ""  # "" is STATE_DIR/retired-homes
    gpu_probes: tuple[GpuProbeSpec, ...] = ()
    simulated_gpus: tuple[SimulatedGpuSpec, ...] = ()
    simulated_cpus: int | None = None
    usage_sample_interval: float = 5.0
    vram_watch_interval: float = 1.0
    vram_tolerance: float = 5.0
    priority_aging: float = 10.0
    invite_ttl: float = 7 * 86400
    invite_max_failures: int = 3
    ssh_login_grace_time: float = 30.0
    ssh_max_startups: str = "30:30:100"  # START:RATE:FULL, see max_startups()
    ssh_max_startups_per_source: int = 10
    ssh_max_auth_tries: int = 6
    ssh_penalty_failures: int = 10
    ssh_penalty_seconds: float = 60.0
    ssh_max_connections_per_source: int = 128
    ssh_max_connections_per_user: int = 32
    ssh_max_sessions_per_user: int = 64
    ssh_max_forwards_per_user: int = 256
    api_max_connections_per_user: int = 64
    api_max_connections: int = 1024
    local_accounts: str = "allow"
    allow_agent_forwarding: bool = False
    wsl_lock_drives: bool = True
    log_level: str = "INFO"
    log_max_size: int = 64 << 20
    log_keep: int = 5
    # Where the configuration was read from ("" for defaults); not a key.
    source: str = ""
    # The line each key was set on in ``source`` (``--check --show``); not a key.
    key_lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def retention_archive_dir(self) -> str:
        return self.tenant_retention_archive_dir or str(Path(self.state_dir) / "retired-homes")

    @property
    def api_socket(self) -> str:
        return str(Path(self.run_dir) / "api.sock")

    @property
    def cluster_name(self) -> str:
        """The name users are granted this cluster by: ``CLUSTER_ID``, or for a
        standalone host without one, its ``SERVER_NAME``."""
        return self.cluster_id or self.server_name


# ---------------------------------------------------------------- validators


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {_kind(v)}")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {_kind(v)}")
    return v


def _kind(v: object) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return f"a boolean ({v!r})"
    if isinstance(v, (int, float)):
        return f"a number ({v!r})"
    if isinstance(v, str):
        return f"a string ({v!r})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__


def _posnum(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"expected a positive number, got {_kind(v)}")
    n = finite_number(v, "a positive number")  # NaN compares False with everything
    if n > MAX_COUNT:
        raise ValueError(f"expected a positive number up to {MAX_COUNT}, got {v!r}")
    return n


def _tolerance(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a percentage from 0 to 100, got {_kind(v)}")
    n = finite_number(v, "a percentage from 0 to 100")
    if not 0 <= n <= 100:
        raise ValueError(f"expected a percentage from 0 to 100, got {v!r}")
    return n


def _posint(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"expected a positive whole number, got {_kind(v)}")
    if v > MAX_COUNT:
        raise ValueError(
            f"expected a positive whole number up to {MAX_COUNT}, got a number of {len(str(v))} digits"
        )
    return v


def max_startups(text: str) -> tuple[int, int, int]:
    """``SSH_MAX_STARTUPS`` as (start, rate, full), as OpenSSH's ``MaxStartups``: past
    ``start`` unauthenticated connections a new one is dropped with probability
    ``rate`` percent, rising linearly to 100 at ``full``. A plain number ``N`` is
    ``N:100:N``: every connection past ``N`` is dropped.

    >>> max_startups("10:30:100"), max_startups("100")
    ((10, 30, 100), (100, 100, 100))
    >>> max_startups("10:0:100")
    Traceback (most recent call last):
    ...
    ValueError: RATE is 0; it is a percentage from 1 to 100, as in 10:30:100
    """
    parts = text.strip().split(":")
    shape = "a positive whole number such as 100, or START:RATE:FULL such as 10:30:100"
    if len(parts) not in (1, 3) or not all(p.strip().isdigit() and p.strip().isascii() for p in parts):
        raise ValueError(f"expected {shape}, got {text[:40]!r}")
    if any(len(p.strip()) > len(str(MAX_COUNT)) for p in parts):
        raise ValueError(f"expected {shape}, each at most {MAX_COUNT}; got {text[:40]!r}")
    if len(parts) == 1:
        n = int(parts[0])
        start, rate, full = n, 100, n
    else:
        start, rate, full = (int(p) for p in parts)
    if min(start, full) <= 0 or max(start, full) > MAX_COUNT:
        raise ValueError(f"expected {shape}, START and FULL from 1 to {MAX_COUNT}; got {text!r}")
    if not 1 <= rate <= 100:
        raise ValueError(f"RATE is {rate}; it is a percentage from 1 to 100, as in 10:30:100")
    if start > full:
        raise ValueError(f"START ({start}) is above FULL ({full}); write START:RATE:FULL with START <= FULL")
    return start, rate, full


def _startups(v: object) -> str:
    """SSH_MAX_STARTUPS, kept as START:RATE:FULL (``--show`` prints it so)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(
            f"expected a positive whole number such as 100, or START:RATE:FULL such as 10:30:100, got {_kind(v)}"
        )
    return ":".join(str(n) for n in max_startups(str(v)))


#: Every key that is a length of time, with the unit of a bare number (``s`` or ``d``):
#: each is read by :func:`duration_key`, so each takes ``30s``, ``15m``, ``2h``, ``7d``.
DURATION_KEYS: dict[str, str] = {}


def duration_key(
    key: str,
    *,
    unit: str = "s",
    positive: bool = False,
    most: float | None = None,
    never: bool = False,
    note: str = "",
    register: bool = True,
) -> Callable[[Any], Any]:
    """The validator of the duration key ``key``: :func:`parse_duration` with a bare
    number in ``unit``; the result is in that unit too (seconds, or days for the
    ``*_DAYS`` keys). ``positive`` refuses 0, ``most`` (seconds) caps it, ``never``
    lets null stand for "never" (None). A key inside an entry (``GPU_PROBES[].timeout``)
    is not ``register``-ed in :data:`DURATION_KEYS`, which lists top-level keys."""
    if register:
        DURATION_KEYS[key] = unit
    scale = 86400.0 if unit == "d" else 1.0
    shown = "7d" if unit == "d" else "60s"

    def check(v: object) -> float | None:
        if v is None and never:
            return None
        if v is None:
            raise ValueError(f"expected a duration such as {shown}, got nothing")
        seconds = parse_duration(v, default_unit=unit)
        if positive and seconds <= 0:
            raise ValueError(f"expected a duration longer than 0, such as {shown}")
        if most is not None and seconds > most:
            raise ValueError(f"expected a duration of at most {most:g}s{note}, got {v!r}")
        return seconds / scale

    return check


def _abspath(v: object) -> str:
    s = _str(v)
    if not s.startswith("/"):
        raise ValueError(f"expected an absolute path, got {s!r}")
    return s.rstrip("/") or "/"


def _paths(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of absolute paths, got {_kind(v)}")
    return tuple(_abspath(x) for x in v)


_INTERPRETER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def _interpreters(v: object) -> tuple[InterpreterSpec, ...]:
    """A list of interpreter paths, or of ``NAME: PATH`` entries, or both."""
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of interpreter paths (or NAME: PATH entries), got {_kind(v)}")
    out: list[InterpreterSpec] = []
    for i, e in enumerate(v):
        try:
            if isinstance(e, dict):
                if len(e) != 1:
                    raise ValueError(
                        "an entry with a name is one NAME: PATH pair, such as "
                        "py311: /opt/python3.11/bin/python3"
                    )
                ((name, path),) = e.items()
                if not isinstance(name, str) or not _INTERPRETER_NAME_RE.match(name):
                    raise ValueError(
                        f"{name!r} is not an interpreter name; use letters, digits, "
                        "'.', '_', '+' or '-', such as py311"
                    )
                spec = InterpreterSpec(_abspath(path), name)
            else:
                spec = InterpreterSpec(_abspath(e))
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        for j, prev in enumerate(out):
            if prev.path == spec.path:
                raise _SubKeyError(
                    f"[{i}]", f"{spec.path} is listed twice (also entry {j}); list each interpreter once"
                )
            if spec.name and prev.name == spec.name:
                raise _SubKeyError(
                    f"[{i}]",
                    f"the name {spec.name!r} is given twice (also entry "
                    f"{j}); give each interpreter its own name",
                )
        out.append(spec)
    return tuple(out)


def _mode(v: object) -> str:
    s = _str(v)
    if s not in ("standalone", "cluster"):
        raise ValueError(f"expected standalone or cluster, got {s!r}")
    return s


def _server_name(v: object) -> str:
    s = _str(v)
    if not _SERVER_RE.match(s):
        raise ValueError(f"{s!r} is not a valid server name; use letters, digits, dots and dashes")
    return s


def _listen(v: object) -> tuple[str, int]:
    s = _str(v)
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT such as 0.0.0.0:2222, got {s!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _peers(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of HOST:PORT seed addresses, got {_kind(v)}")
    out = []
    for x in v:
        host, port = _listen(x)
        out.append(f"{host}:{port}")
    return tuple(out)


def _uid_range(v: object) -> tuple[int, int]:
    s = str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None
    m = re.match(r"^\s*(\d+)\s*-\s*(\d+)\s*$", s or "")
    if not m:
        raise ValueError(f"expected FIRST-LAST such as 20000-29999, got {_kind(v)}")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo > hi:
        raise ValueError(f"the range {lo}-{hi} is empty; FIRST must not exceed LAST")
    if lo < 1000:
        raise ValueError(f"the range {lo}-{hi} overlaps system accounts (below 1000); start at 1000 or above")
    if hi > _UID_MAX_WITH_SUBIDS:
        raise ValueError(
            f"the range {lo}-{hi} ends above {_UID_MAX_WITH_SUBIDS}: each tenant gets "
            "65536 subordinate IDs derived from its UID for rootless podman, and "
            f"higher UIDs have none left; end the range at {_UID_MAX_WITH_SUBIDS} or below"
        )
    for a, b, what in _SYSTEMD_RESERVED:
        if lo <= b and a <= hi:
            raise ValueError(
                f"the range {lo}-{hi} overlaps {what} ({a}-{b}), which systemd "
                "reserves; choose a range below 60000, such as 20000-29999"
            )
    return lo, hi


def _port_range(v: object) -> tuple[int, int]:
    """``RENDEZVOUS_PORTS``: where multi-member jobs' ``MASTER_PORT`` is drawn from.

    >>> _port_range("29500-39499")
    (29500, 39499)
    """
    s = str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None
    m = re.match(r"^\s*(\d+)\s*-\s*(\d+)\s*$", s or "")
    if not m:
        raise ValueError(f"expected FIRST-LAST such as 29500-39499, got {_kind(v)}")
    lo, hi = int(m.group(1)), int(m.group(2))
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"the range {lo}-{hi} is not within 1024-65535 with FIRST <= LAST")
    if hi - lo + 1 < 256:
        raise ValueError(
            f"the range {lo}-{hi} has {hi - lo + 1} ports; give at least 256, so "
            "that the port a job gets cannot be guessed"
        )
    return lo, hi


def _names(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of user names, got {_kind(v)}")
    for x in v:
        if not isinstance(x, str) or not _NAME_RE.match(x):
            raise ValueError(f"{x!r} is not a valid user name")
    return tuple(v)


def _propagate(value: Any) -> frozenset[str]:
    """``PROPAGATE_RESOURCE_LIMITS``: ``ALL``, ``NONE`` or a list of limit names.

    >>> sorted(_propagate(["NOFILE", "core"]))
    ['core', 'nofile']
    >>> _propagate("NONE"), len(_propagate("ALL"))
    (frozenset(), 10)
    """
    if value is None:
        return frozenset()
    if isinstance(value, str):
        v = value.strip().upper()
        if v == "ALL":
            return frozenset(RESOURCE_LIMIT_NAMES)
        if v == "NONE":
            return frozenset()
        value = [p for p in re.split(r"[,\s]+", value) if p]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError("expected ALL, NONE or a list of limit names such as [NOFILE, STACK]")
    names = {p.strip().lower() for p in value}
    unknown = sorted(names - set(RESOURCE_LIMIT_NAMES))
    if unknown:
        raise ValueError(
            f"{unknown[0][:20]!r} is not a limit; expected ALL, NONE or names from "
            + ", ".join(n.upper() for n in RESOURCE_LIMIT_NAMES)
        )
    return frozenset(names)


#: The largest JOB_SCRIPT_MAX: a submission carries its script in one API request line,
#: and those are bounded (MAX_REQUEST_BYTES, 4 MiB, with room for JSON's escapes).
MAX_JOB_SCRIPT = 2 << 20


def _bounded_size(v: object, low: int, high: int) -> int:
    n = parse_size(v)
    if not low <= n <= high:
        raise ValueError(f"expected a size from {format_size(low)} to {format_size(high)}, got {v!r}")
    return n


def _size_or_none(v: object) -> int | None:
    if v is None:
        return None
    return parse_size(v)


def _size_or_share(v: object) -> int | str | None:
    """A size, a share of the host's memory (``50%``), or none."""
    if v is None:
        return None
    if isinstance(v, str) and v.endswith("%"):
        try:
            pct = float(v[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise ValueError(f"{v!r} is not a share of memory; use 1% to 100%, a size such as 16G, or none")
        return v
    return parse_size(v)


def _choice(v: object, allowed: tuple[str, ...], expected: str) -> str:
    """``v`` if it is one of ``allowed``; else the error says what was ``expected``."""
    s = _str(v)
    if s not in allowed:
        raise ValueError(f"expected {expected}, got {s!r}")
    return s


def _session_gpus(v: object) -> str:
    return _choice(
        v,
        ("none", "free"),
        "none (sessions open no GPU) or free (the GPUs no job holds, for a single-person host)",
    )


def _tenant_network(v: object) -> str:
    return _choice(
        v,
        ("private", "shared"),
        "private (each tenant has its own loopback and "
        "network namespace) or shared (all tenants share the host's)",
    )


def _ipv4_subnet(v: object) -> str:
    import ipaddress

    s = _str(v)
    try:
        net = ipaddress.IPv4Network(s)
    except ValueError:
        raise ValueError(f"expected an IPv4 subnet such as 100.72.0.0/16, got {s!r}") from None
    if net.prefixlen > 24:
        raise ValueError(f"expected a subnet of /24 or wider (each tenant takes a /30), got {s!r}")
    if net.is_loopback or net.is_multicast:
        raise ValueError(f"expected a private, unused subnet, not the loopback or multicast {s!r}")
    return str(net)


def _cpu_weight(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10000:
        raise ValueError(f"expected a CPU weight from 1 to 10000 (100 is the default share), got {_kind(v)}")
    return v


def _retention_home(v: object) -> str:
    s = _str(v)
    if s not in ("archive", "remove"):
        raise ValueError(f"expected archive (a tar of the home is kept) or remove, got {s!r}")
    return s


def _local_accounts(v: object) -> str:
    s = _str(v).strip().lower()
    if s not in ("allow", "admins", "deny"):
        raise ValueError(f"expected allow, admins or deny, got {v!r}")
    return s


def _log_level(v: object) -> str:
    s = _str(v).upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"expected DEBUG, INFO, WARNING or ERROR, got {v!r}")
    return s


def _log_keep(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
        raise ValueError(f"expected how many rotated log files to keep, 0 to 100, got {_kind(v)}")
    return v


def _sub(
    mapping: object, allowed: Mapping[str, Callable[[Any], Any]], what: str, required: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(mapping, dict):
        raise ValueError(f"expected a mapping for {what}, got {_kind(mapping)}")
    out = {}
    for k, val in mapping.items():
        if k not in allowed:
            raise _SubKeyError(str(k), f"unknown key; expected one of {', '.join(sorted(allowed))}")
        try:
            out[k] = allowed[k](val)
        except ValueError as exc:
            raise _SubKeyError(str(k), str(exc)) from exc
    for k in required:
        if k not in out:
            raise ValueError(f"{what} needs {k!r}")
    return out


class _SubKeyError(ValueError):
    def __init__(self, sub: str, message: str) -> None:
        self.sub = sub
        super().__init__(message)


def _gpu_type(v: object) -> str:
    s = _str(v).strip().lower()
    if not re.match(r"^[a-z0-9][a-z0-9_.-]*$", s):
        raise ValueError(
            f"{v!r} is not a GPU type name; use lower-case letters, digits and dashes, such as rtx4090"
        )
    return s


def _brand(v: object) -> str:
    s = _str(v).strip().lower()
    if not re.match(r"^[a-z][a-z0-9_-]*$", s):
        raise ValueError(f"{v!r} is not a brand name; use a lower-case word such as nvidia")
    return s


#: Simulated GPUs a host may have, in one ``SIMULATED_GPUS`` entry and in all: the
#: daemon makes each one's state (and device files) when it starts.
MAX_SIMULATED_GPUS = 1024


def _simulated_count(v: object) -> int:
    n = _posint(v)
    if n > MAX_SIMULATED_GPUS:
        raise ValueError(f"expected at most {MAX_SIMULATED_GPUS} simulated GPUs, got {n}")
    return n


def _simulated(v: object) -> tuple[SimulatedGpuSpec, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(
            f"expected a list of entries like {{type: rtx4090, count: 2, vram: 24G}}, got {_kind(v)}"
        )
    out = []
    for i, e in enumerate(v):
        try:
            d = _sub(
                e,
                {
                    "type": _gpu_type,
                    "count": _simulated_count,
                    "vram": parse_size,
                    "brand": _brand,
                    "used": parse_size,
                    "device_dir": _abspath,
                    "mig": _mig_profiles,
                },
                "a simulated GPU entry",
                required=("type", "vram"),
            )
        except _SubKeyError as exc:
            raise _SubKeyError(f"[{i}].{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        if d.get("used", 0) > d["vram"]:
            raise _SubKeyError(f"[{i}].used", "used VRAM cannot exceed the card's vram")
        mig = d.get("mig", ())
        if mig and d.get("brand", "nvidia") != "nvidia":
            raise _SubKeyError(f"[{i}].mig", "MIG profiles are for nvidia cards")
        if mig and d.get("used", 0):
            raise _SubKeyError(
                f"[{i}].used",
                "a MIG card's use is its MIG devices'; set each "
                "device's with mtgpu-admin simulate NODE INDEX --used SIZE",
            )
        if sum(mig_profile_vram(p) for p in mig) > d["vram"]:
            raise _SubKeyError(f"[{i}].mig", "the profiles' memory adds up to more than the card's vram")
        out.append(
            SimulatedGpuSpec(
                type=d["type"],
                count=d.get("count", 1),
                vram=d["vram"],
                brand=d.get("brand", "nvidia"),
                used=d.get("used", 0),
                device_dir=d.get("device_dir", ""),
                mig=mig,
            )
        )
    total = sum(g.count for g in out)
    if total > MAX_SIMULATED_GPUS:
        raise ValueError(f"the entries add up to {total} simulated GPUs; at most {MAX_SIMULATED_GPUS} in all")
    return tuple(out)


#: A MIG profile name as nvidia-smi prints it: compute slices, then memory.
MIG_PROFILE = re.compile(r"^([1-8])g\.(\d{1,4})gb$")
#: Compute slices a card with MIG has at most (A100, H100, H200: 7).
MIG_COMPUTE_SLICES = 7


def mig_profile_vram(profile: str) -> int:
    """The memory of a MIG profile in bytes, from its name.

    >>> mig_profile_vram("3g.40gb") == 40 << 30
    True
    """
    m = MIG_PROFILE.match(profile)
    return int(m.group(2)) << 30 if m else 0


def _mig_profiles(v: object) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or len(v) > MIG_COMPUTE_SLICES:
        raise ValueError(
            f"expected a list of 1 to {MIG_COMPUTE_SLICES} MIG profiles such as "
            f"[3g.40gb, 2g.20gb, 1g.10gb], got {_kind(v)}"
        )
    out = []
    for p in v:
        s = _str(p).strip().lower()
        if not MIG_PROFILE.match(s):
            raise ValueError(
                f"{p!r} is not a MIG profile; write it as nvidia-smi mig -lgip names it, such as 3g.40gb"
            )
        out.append(s)
    if sum(int(p.split("g.")[0]) for p in out) > MIG_COMPUTE_SLICES:
        raise ValueError(
            f"the profiles {', '.join(out)} need more than the card's {MIG_COMPUTE_SLICES} compute slices"
        )
    return tuple(out)


def _argv(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        import shlex

        argv = shlex.split(v)
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        argv = list(v)
    else:
        raise ValueError(f"expected a command (a string or a list of strings), got {_kind(v)}")
    if not argv:
        raise ValueError("the command is empty")
    return tuple(argv)


def _env_name(v: object) -> str:
    s = _str(v)
    if not re.match(r"^[A-Z_][A-Z0-9_]*$", s):
        raise ValueError(f"{s!r} is not an environment variable name")
    return s


def _probes(v: object) -> tuple[GpuProbeSpec, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of probe entries, got {_kind(v)}")
    out = []
    for i, e in enumerate(v):
        try:
            d = _sub(
                e,
                {
                    "name": _str,
                    "brand": _brand,
                    "command": _argv,
                    "visibility_env": _env_name,
                    "devices": _paths,
                    "timeout": duration_key("GPU_PROBES[].timeout", positive=True, register=False),
                },
                "a GPU probe entry",
                required=("brand", "command", "visibility_env"),
            )
        except _SubKeyError as exc:
            raise _SubKeyError(f"[{i}].{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        out.append(
            GpuProbeSpec(
                brand=d["brand"],
                command=d["command"],
                visibility_env=d["visibility_env"],
                devices=d.get("devices", ()),
                name=d.get("name", d["brand"]),
                timeout=d.get("timeout", 10.0),
            )
        )
    return tuple(out)


def _port_policy(v: object) -> str:
    s = _str(v)
    if s not in ("none", "loopback", "any"):
        raise ValueError(f"expected none, loopback or any, got {s!r}")
    return s


def _image_list(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ValueError(f"expected a list of image names, got {_kind(v)}")
    return tuple(v)


def _volume_list(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of container paths such as /root/.cache, got {_kind(v)}")
    return tuple(_abspath(x) for x in v)


def _mapping(v: object) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"expected a mapping, got {_kind(v)}")
    return v


_TEMPLATE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def _port(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise ValueError(f"expected a port number from 1 to 65535, got {_kind(v)}")
    return v


def _env_map(v: object) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"expected a mapping of NAME: value, got {_kind(v)}")
    out = {}
    for k, val in v.items():
        if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise ValueError(f"{k!r} is not an environment variable name")
        if isinstance(val, (dict, list)) or val is None:
            raise ValueError(f"the value of {k} must be a string or a number, got {_kind(val)}")
        out[k] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


def _mount(v: object) -> dict[str, Any]:
    """``SOURCE:TARGET[:ro]`` or ``{source, target, readonly}``; SOURCE absolute or ``~/``."""
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ValueError(f"expected SOURCE:TARGET or SOURCE:TARGET:ro, got {v!r}")
        d: dict[str, Any] = {
            "source": parts[0],
            "target": parts[1],
            "readonly": len(parts) == 3 and parts[2] == "ro",
        }
    elif isinstance(v, dict):
        d = _sub(
            v, {"source": _str, "target": _str, "readonly": _bool}, "a mount", required=("source", "target")
        )
        d.setdefault("readonly", False)
    else:
        raise ValueError(f"expected SOURCE:TARGET[:ro] or a mapping, got {_kind(v)}")
    if not (d["source"].startswith("/") or d["source"].startswith("~/")):
        raise ValueError(f"the source {d['source']!r} must be an absolute path or start with ~/")
    if not d["target"].startswith("/"):
        raise ValueError(f"the target {d['target']!r} must be an absolute path in the container")
    return d


def _template_gpus(v: object) -> tuple[int, str | None]:
    """``2`` or ``"rtx4090:2"``/``"nvidia:1"``: a count and an optional type or brand."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v, None
    if isinstance(v, str):
        kind, _, count = v.rpartition(":")
        if count.isdigit() and (not kind or re.match(r"^[a-z0-9][a-z0-9_.-]*$", kind)):
            return int(count), kind or None
    raise ValueError(f"expected a GPU count such as 1, or TYPE:COUNT such as nvidia:1, got {_kind(v)}")


def _template(v: object) -> dict[str, Any]:
    d = _sub(
        v,
        {
            "image": _str,
            "gpus": _template_gpus,
            "cpus": _posint,
            "ram": parse_size,
            "ports": lambda x: tuple(_port(p) for p in _list(x, "container ports")),
            "env": _env_map,
            "mounts": lambda x: [_mount(m) for m in _list(x, "mounts")],
            "command": _argv,
            "description": _str,
        },
        "a template",
        required=("image",),
    )
    if not d["image"]:
        raise _SubKeyError("image", "the image name is empty")
    gpus, gpu_type = d.pop("gpus", (0, None))
    return {
        "image": d["image"],
        "gpus": gpus,
        "gpu_type": gpu_type,
        "cpus": d.get("cpus", 1),
        "ram": d.get("ram", 1 << 30),
        "ports": d.get("ports", ()),
        "env": d.get("env", {}),
        "mounts": d.get("mounts", []),
        "command": d.get("command", ()),
        "description": d.get("description", ""),
    }


def _list(v: object, what: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ValueError(f"expected a list of {what}, got {_kind(v)}")
    return v


def _templates(v: object) -> dict[str, dict[str, Any]]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"expected a mapping of template name to {{image: ..., gpus: ...}}, got {_kind(v)}")
    out = {}
    for name, t in v.items():
        if not isinstance(name, str) or not _TEMPLATE_NAME_RE.match(name):
            raise _SubKeyError(str(name), "a template name is lower-case letters, digits, '.', '_' or '-'")
        try:
            out[name] = _template(t)
        except _SubKeyError as exc:
            raise _SubKeyError(f"{name}.{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(name, str(exc)) from exc
    return out


def _registry(v: object) -> dict[str, Any] | None:
    if v is None:
        return None
    d = _sub(
        v,
        {"url": _str, "credentials": lambda x: None if x is None else _abspath(x), "tls_verify": _bool},
        "the registry",
        required=("url",),
    )
    url = d["url"].strip()
    for scheme in ("https://", "http://", "docker://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    if not url or "/" in url.rstrip("/") or " " in url:
        raise _SubKeyError(
            "url", f"expected a registry host[:port] such as registry.example.com, got {d['url']!r}"
        )
    return {
        "url": url.rstrip("/"),
        "credentials": d.get("credentials"),
        "tls_verify": d.get("tls_verify", True),
    }


def _positive_size(v: object) -> int:
    n = _size_or_none(v)
    if not n:
        raise ValueError("expected a size such as 20G")
    return n


def _job_network(v: object) -> str:
    s = _str(v)
    if s not in ("host", "private"):
        raise ValueError(f"expected host or private, got {s!r}")
    return s


def _container_storage(v: object) -> str:
    s = _str(v).strip()
    if s in ("home", "auto"):
        return s
    if not s.startswith("/"):
        raise ValueError(f"expected home, auto or an absolute path on this member's disk, got {s!r}")
    s = os.path.normpath(s)
    if s == "/":
        raise ValueError("the stores need a directory of their own, not /")
    return s


def _containers(v: object) -> ContainersOptions:
    if v is None:
        return ContainersOptions()
    keys: dict[str, Callable[[Any], Any]] = {
        "enabled": _bool,
        "templates": _templates,
        "prepull": _image_list,
        "registry": _registry,
        "cache_volumes": _volume_list,
        "network": _bool,
        "port_publishing": _port_policy,
        "allow_user_images": _bool,
        "archive_dir": _abspath,
        "image_cache": _positive_size,
        "job_network": _job_network,
        "storage": _container_storage,
    }
    if not isinstance(v, dict):
        raise ValueError(f"expected a mapping for CONTAINERS, got {_kind(v)}")
    d = {}
    for k, val in v.items():
        if k not in keys:
            raise _SubKeyError(str(k), f"unknown key; expected one of {', '.join(sorted(keys))}")
        try:
            d[k] = keys[k](val)
        except _SubKeyError as exc:  # a nested key: CONTAINERS.templates.NAME.ports
            raise _SubKeyError(f"{k}.{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(str(k), str(exc)) from exc
    return ContainersOptions(**d)


def _shell(v: object) -> str:
    return _abspath(v)


def _secret(v: object) -> str:
    s = _str(v)
    if s and len(s) < 16:
        raise ValueError(
            "the cluster key is too short; use at least 16 characters (mtgpu-setup generates one)"
        )
    return s


def _cluster_id(v: object) -> str:
    s = _str(v) if not isinstance(v, int) or isinstance(v, bool) else str(v)
    if s and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", s):
        raise ValueError(f"{s!r} is not a valid cluster ID; use letters, digits, dots, dashes")
    return s


_KEYS: dict[str, Callable[[Any], Any]] = {
    "CLUSTER_MODE": _mode,
    "CLUSTER_ID": _cluster_id,
    "CLUSTER_KEY": _secret,
    "CLUSTER_PEERS": _peers,
    "CLUSTER_ADVERTISE": lambda v: "" if v is None else "{}:{}".format(*_listen(v)),
    "CLUSTER_VOTER_GRACE": duration_key("CLUSTER_VOTER_GRACE"),
    "CLUSTER_LOST_AFTER": duration_key("CLUSTER_LOST_AFTER"),
    "CLUSTER_FENCE_GRACE": duration_key("CLUSTER_FENCE_GRACE"),
    "CLUSTER_CONNECT_TIMEOUT": duration_key("CLUSTER_CONNECT_TIMEOUT", positive=True),
    "SERVER_NAME": _server_name,
    "SSH_LISTEN": _listen,
    "STATE_DIR": _abspath,
    "RUN_DIR": _abspath,
    "TENANT_HOME_ROOT": _abspath,
    "TENANT_UID_RANGE": _uid_range,
    "RENDEZVOUS_PORTS": _port_range,
    "TENANT_SHELL": _shell,
    "SESSION_MEMORY": _size_or_share,
    "SESSIONS_MEMORY": _size_or_share,
    "SESSION_PIDS": lambda v: None if v is None else _posint(v),
    "SESSION_CPU_WEIGHT": _cpu_weight,
    "SESSION_GPUS": _session_gpus,
    "PRIVATE_TMP": _bool,
    "PRIVATE_TMP_SIZE": parse_size,
    "TENANT_NETWORK": _tenant_network,
    "TENANT_NETWORK_SUBNET": _ipv4_subnet,
    "ADMINS": _names,
    "CONTAINERS": _containers,
    "DATASETS_DIRECTORIES": _paths,
    "PYTHON_INTERPRETERS": _interpreters,
    "USER_DISK_LIMIT": _size_or_none,
    "USER_DISK_SCAN_INTERVAL": duration_key("USER_DISK_SCAN_INTERVAL", positive=True),
    "USER_SUBMIT_RATE": lambda v: None if v is None else _posnum(v),
    "USER_SUBMIT_BURST": _posint,
    "USER_MAX_QUEUED_JOBS": lambda v: None if v is None else _posint(v),
    "JOB_SCRIPT_MAX": lambda v: _bounded_size(v, 1 << 10, MAX_JOB_SCRIPT),
    "PROPAGATE_RESOURCE_LIMITS": _propagate,
    "NODE_FEATURES": _node_features,
    "USER_MAX_QUEUED_SCRIPT_BYTES": lambda v: None if v is None else _bounded_size(v, 1 << 10, 1 << 50),
    "JOB_RETENTION_DAYS": duration_key("JOB_RETENTION_DAYS", unit="d", positive=True, never=True),
    "USAGE_RETENTION_DAYS": duration_key("USAGE_RETENTION_DAYS", unit="d", positive=True),
    "TENANT_RETENTION_DAYS": duration_key("TENANT_RETENTION_DAYS", unit="d", positive=True, never=True),
    "TENANT_RETENTION_GRACE": duration_key("TENANT_RETENTION_GRACE"),
    "TENANT_RETENTION_WARN_DAYS": duration_key("TENANT_RETENTION_WARN_DAYS", unit="d"),
    "TENANT_RETENTION_HOME": _retention_home,
    "TENANT_RETENTION_ARCHIVE_DIR": lambda v: "" if v is None else _abspath(v),
    "GPU_PROBES": _probes,
    "SIMULATED_GPUS": _simulated,
    "SIMULATED_CPUS": lambda v: None if v is None else _posint(v),
    "USAGE_SAMPLE_INTERVAL": duration_key("USAGE_SAMPLE_INTERVAL", positive=True),
    "VRAM_WATCH_INTERVAL": duration_key(
        "VRAM_WATCH_INTERVAL", positive=True, most=1, note=" (the VRAM watchdog reads at least once a second)"
    ),
    "VRAM_TOLERANCE": _tolerance,
    "PRIORITY_AGING": _posnum,
    "INVITE_TTL": duration_key("INVITE_TTL"),
    "INVITE_MAX_FAILURES": _posint,
    "SSH_LOGIN_GRACE_TIME": duration_key("SSH_LOGIN_GRACE_TIME"),
    "SSH_MAX_STARTUPS": _startups,
    "SSH_MAX_STARTUPS_PER_SOURCE": _posint,
    "SSH_MAX_AUTH_TRIES": _posint,
    "SSH_PENALTY_FAILURES": _posint,
    "SSH_PENALTY_SECONDS": duration_key("SSH_PENALTY_SECONDS"),
    "SSH_MAX_CONNECTIONS_PER_SOURCE": _posint,
    "SSH_MAX_CONNECTIONS_PER_USER": _posint,
    "SSH_MAX_SESSIONS_PER_USER": _posint,
    "SSH_MAX_FORWARDS_PER_USER": _posint,
    "API_MAX_CONNECTIONS_PER_USER": _posint,
    "API_MAX_CONNECTIONS": _posint,
    "LOCAL_ACCOUNTS": _local_accounts,
    "ALLOW_AGENT_FORWARDING": _bool,
    "WSL_LOCK_DRIVES": _bool,
    "LOG_LEVEL": _log_level,
    "LOG_MAX_SIZE": lambda v: _bounded_size(v, 64 << 10, 1 << 40),
    "LOG_KEEP": _log_keep,
}


# ----------------------------------------------------------------- reloading

#: A reload (SIGHUP, ``systemctl reload mtgpu``, ``mtgpu-setup reload``) uses the new
#: value of an ``applied`` key from then on. A ``restart`` key is read once, at start
#: (it shapes the listeners, the state, accounts, probes, the cluster or a loop that
#: was started with it): a reload keeps its old value in force and names it as
#: needing a restart (``systemctl restart mtgpu``).
APPLIED, RESTART = "applied", "restart"
RELOAD: dict[str, str] = {
    "CLUSTER_MODE": RESTART,
    "CLUSTER_ID": RESTART,
    "CLUSTER_KEY": RESTART,
    "CLUSTER_PEERS": RESTART,
    "CLUSTER_ADVERTISE": RESTART,
    "CLUSTER_VOTER_GRACE": RESTART,
    "CLUSTER_LOST_AFTER": RESTART,
    "CLUSTER_FENCE_GRACE": RESTART,
    "CLUSTER_CONNECT_TIMEOUT": RESTART,
    "SERVER_NAME": RESTART,
    "SSH_LISTEN": RESTART,
    "STATE_DIR": RESTART,
    "RUN_DIR": RESTART,
    "TENANT_HOME_ROOT": RESTART,
    "TENANT_UID_RANGE": RESTART,
    "RENDEZVOUS_PORTS": APPLIED,
    "TENANT_SHELL": RESTART,
    "SESSION_MEMORY": RESTART,
    "SESSIONS_MEMORY": RESTART,
    "SESSION_PIDS": RESTART,
    "SESSION_CPU_WEIGHT": RESTART,
    "SESSION_GPUS": RESTART,
    "PRIVATE_TMP": RESTART,
    "PRIVATE_TMP_SIZE": RESTART,
    "ADMINS": APPLIED,
    "CONTAINERS": RESTART,
    "DATASETS_DIRECTORIES": APPLIED,
    "PYTHON_INTERPRETERS": APPLIED,
    "USER_DISK_LIMIT": APPLIED,
    "USER_DISK_SCAN_INTERVAL": APPLIED,
    "USER_SUBMIT_RATE": RESTART,
    "USER_SUBMIT_BURST": RESTART,
    "USER_MAX_QUEUED_JOBS": RESTART,
    "JOB_SCRIPT_MAX": RESTART,
    "PROPAGATE_RESOURCE_LIMITS": APPLIED,
    "NODE_FEATURES": RESTART,
    "USER_MAX_QUEUED_SCRIPT_BYTES": RESTART,
    "JOB_RETENTION_DAYS": APPLIED,
    "USAGE_RETENTION_DAYS": APPLIED,
    "TENANT_RETENTION_DAYS": APPLIED,
    "TENANT_RETENTION_GRACE": APPLIED,
    "TENANT_RETENTION_WARN_DAYS": APPLIED,
    "TENANT_RETENTION_HOME": APPLIED,
    "TENANT_RETENTION_ARCHIVE_DIR": RESTART,
    "GPU_PROBES": RESTART,
    "SIMULATED_GPUS": RESTART,
    "VRAM_WATCH_INTERVAL": RESTART,
    "VRAM_TOLERANCE": RESTART,
    "TENANT_NETWORK": RESTART,
    "TENANT_NETWORK_SUBNET": RESTART,
    "SIMULATED_CPUS": APPLIED,
    "USAGE_SAMPLE_INTERVAL": RESTART,
    "PRIORITY_AGING": RESTART,
    "INVITE_TTL": APPLIED,
    "INVITE_MAX_FAILURES": APPLIED,
    "SSH_LOGIN_GRACE_TIME": RESTART,
    "SSH_MAX_STARTUPS": RESTART,
    "SSH_MAX_STARTUPS_PER_SOURCE": APPLIED,
    "SSH_MAX_AUTH_TRIES": APPLIED,
    "SSH_PENALTY_FAILURES": APPLIED,
    "SSH_PENALTY_SECONDS": APPLIED,
    "SSH_MAX_CONNECTIONS_PER_SOURCE": APPLIED,
    "SSH_MAX_CONNECTIONS_PER_USER": APPLIED,
    "SSH_MAX_SESSIONS_PER_USER": APPLIED,
    "SSH_MAX_FORWARDS_PER_USER": APPLIED,
    "API_MAX_CONNECTIONS_PER_USER": APPLIED,
    "API_MAX_CONNECTIONS": APPLIED,
    "LOCAL_ACCOUNTS": APPLIED,
    "ALLOW_AGENT_FORWARDING": RESTART,
    "WSL_LOCK_DRIVES": RESTART,
    "LOG_LEVEL": APPLIED,
    "LOG_MAX_SIZE": APPLIED,
    "LOG_KEEP": APPLIED,
}


@dataclass(frozen=True)
class Reload:
    """What a reload does: the changed keys it applied, and the changed keys whose old
    values stay in force until a restart (``needs_restart``)."""

    options: Options
    applied: tuple[str, ...]
    needs_restart: tuple[str, ...]


def plan_reload(old: Options, new: Options) -> Reload:
    """The options a reload from ``old`` to ``new`` puts in force: ``new``, with every
    ``restart`` key as in ``old``; and which changed keys fall in each class.

    >>> r = plan_reload(Options(), Options(admins=("ann",), tenant_uid_range=(30000, 39999)))
    >>> r.applied, r.needs_restart, r.options.admins, r.options.tenant_uid_range
    (('ADMINS',), ('TENANT_UID_RANGE',), ('ann',), (20000, 29999))
    """
    applied: list[str] = []
    restart: list[str] = []
    for key, kind in RELOAD.items():
        name = key.lower()
        if getattr(old, name) != getattr(new, name):
            (applied if kind == APPLIED else restart).append(key)
    kept = replace(new, **{k.lower(): getattr(old, k.lower()) for k in restart})
    return Reload(kept, tuple(applied), tuple(restart))


# -------------------------------------------------------------------- loader

#: The largest configuration file: far beyond any real one, so reading it is cheap.
MAX_CONFIG_BYTES = 1 << 20
#: The deepest nesting of lists and mappings in it (the deepest key needs 4).
MAX_CONFIG_DEPTH = 16
_STR_TAG = "tag:yaml.org,2002:str"
_TOP_KEY_RE = re.compile(r"^([^\s#:'\"][^:\n]*):", re.MULTILINE)
_FLOW_RE = re.compile(r"""'[^']*'|"(?:[^"\\]|\\.)*"|#[^\n]*|[\[\]{}]""")


def _check_shape(text: str, path: str) -> None:
    """Refuse, from the event stream alone (nothing is built), a file that is too large,
    nested too deep or uses aliases: a few lines of ``&a [*a, *a]`` expand into billions
    of values, and a self-referencing anchor into a loop."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"the file is {len(text)} characters; a configuration file is at most {MAX_CONFIG_BYTES} (1 MiB)",
            path=path,
        )
    # PyYAML's scanner costs the square of the depth of flow collections ([[[...),
    # so their depth is counted first, in one pass (quoted strings and comments skipped).
    depth = 0
    for m in _FLOW_RE.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                line = text.count("\n", 0, m.start()) + 1
                keys = _TOP_KEY_RE.findall(text, 0, m.start())
                raise ConfigError(
                    f"nested more than {MAX_CONFIG_DEPTH} levels deep; no key takes that much nesting",
                    key=keys[-1][:60] if keys else None,
                    line=line,
                    path=path,
                )
        elif c in "]}":
            depth = max(0, depth - 1)
    depth = 0
    top: list[str | None] = [None]  # the top-level key being read, for the message
    expect_key = False
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        line = ev.start_mark.line + 1 if ev.start_mark is not None else 0
        if isinstance(ev, yaml.AliasEvent):
            raise ConfigError(
                f"YAML aliases (*{ev.anchor}) are not accepted; write the value out in full",
                key=top[0],
                line=line,
                path=path,
            )
        if depth == 1 and expect_key and isinstance(ev, yaml.ScalarEvent):
            top[0] = ev.value[:60]
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(
                    f"nested more than {MAX_CONFIG_DEPTH} levels deep; no key takes that much nesting",
                    key=top[0],
                    line=line,
                    path=path,
                )
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        # At the top level, a mapping alternates key, value: track which comes next.
        if depth == 1 and isinstance(ev, (yaml.ScalarEvent, yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            expect_key = not expect_key
        elif depth == 1 and isinstance(ev, yaml.MappingStartEvent):
            expect_key = True


def _lines(node: yaml.Node, path: str, out: dict[str, int], file: str = "<config>") -> None:
    """Record the 1-based line of every key path (``A.b``, ``A[0].c``) in ``node``, and
    refuse a key that YAML does not read as a string (``null:``, ``true:``, ``1:``)."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = str(k.value)[:60] if isinstance(k, yaml.ScalarNode) else "(a collection)"
            sub = f"{path}.{key}" if path else key
            if not isinstance(k, yaml.ScalarNode) or k.tag != _STR_TAG:
                kind = k.tag.rpartition(":")[2] if isinstance(k, yaml.ScalarNode) else "collection"
                kind = {"null": "null", "bool": "true/false", "int": "number", "float": "number"}.get(
                    kind, kind
                )
                raise ConfigError(
                    f"a key must be a name, but YAML reads {key!r} as {kind}; quote it or remove it",
                    key=sub,
                    line=k.start_mark.line + 1,
                    path=file,
                )
            if sub in out:  # YAML would silently keep the last one
                raise ConfigError(
                    f"the key is given twice (lines {out[sub]} and {k.start_mark.line + 1}); keep one",
                    key=sub,
                    line=k.start_mark.line + 1,
                    path=file,
                )
            out[sub] = k.start_mark.line + 1
            _lines(v, sub, out, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            sub = f"{path}[{i}]"
            out[sub] = v.start_mark.line + 1
            _lines(v, sub, out, file)


#: Keys whose plain value YAML 1.1 would read as a base-60 number (``10:30:50`` is
#: 37850): the text as written is validated instead.
_AS_WRITTEN = ("SSH_MAX_STARTUPS",)


def _as_written(node: yaml.Node, raw: dict[Any, Any]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for k, v in node.value:
        if (
            isinstance(k, yaml.ScalarNode)
            and k.value in _AS_WRITTEN
            and isinstance(v, yaml.ScalarNode)
            and v.style is None
            and ":" in v.value
        ):
            raw[k.value] = v.value


def load_text(text: str, path: str = "<config>") -> Options:
    """Validate configuration ``text`` and return the options; raise ConfigError."""
    try:
        _check_shape(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[str, int] = {}
        if node is not None:
            _lines(node, "", lines, path)
        raw = yaml.safe_load(text)
        if node is not None and isinstance(raw, dict):
            _as_written(node, raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML ({problem}); fix the syntax", line=line, path=path) from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("the file must be a mapping of KEY: value lines", path=path, line=1)
    values: dict[str, Any] = {}
    for key, val in raw.items():
        k = str(key)
        if k not in _KEYS:
            raise ConfigError(f"unknown key; {_unknown_hint(k)}", key=k, line=lines.get(k), path=path)
        try:
            _refuse_nul(val)
            values[k.lower()] = _KEYS[k](val)
        except _SubKeyError as exc:
            sub = f"{k}{exc.sub}" if exc.sub.startswith("[") else f"{k}.{exc.sub}"
            raise ConfigError(str(exc), key=sub, line=lines.get(sub, lines.get(k)), path=path) from exc
        except ValueError as exc:
            raise ConfigError(str(exc), key=k, line=lines.get(k), path=path) from exc
    if "ssh_max_startups_per_source" not in values and "ssh_max_startups" in values:
        # A low SSH_MAX_STARTUPS of an older configuration: the per-address cap, which it
        # did not set, follows it (half its FULL) rather than stopping the daemon.
        full = max_startups(values["ssh_max_startups"])[2]
        default = Options.__dataclass_fields__["ssh_max_startups_per_source"].default
        if isinstance(default, int) and default >= full:
            values["ssh_max_startups_per_source"] = max(1, full // 2)
    top = {k: n for k, n in lines.items() if k in _KEYS}
    opts = Options(**values, source=path, key_lines=top)
    _check_whole(opts, lines, path)
    return opts


def _refuse_nul(v: object, at: str = "") -> None:
    """Refuse a NUL byte in any string of a value, mapping keys too: no path, name or
    command can hold one (the kernel ends a path at it), so the daemon could not start.
    ``at`` is where ``v`` is inside its key, as ``[0].device_dir``."""
    if isinstance(v, str):
        if "\0" in v:
            message = "contains a NUL byte (\\0), which no path or name can hold; remove it"
            raise _SubKeyError(at, message) if at else ValueError(message)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _refuse_nul(x, f"{at}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            _refuse_nul(k, at)  # the key's own name: reported where its mapping is
            name = str(k)
            _refuse_nul(x, f"{at}.{name}" if at else name)


def _unknown_hint(key: str) -> str:
    """What to say of an unknown top-level ``key``: the key it is closest to, if any.

    >>> _unknown_hint("USAGE_SAMPLE_INTERVALL")
    'did you mean USAGE_SAMPLE_INTERVAL?'
    """
    import difflib

    want = key.upper()
    close = [c for c in _KEYS if c.replace("_", "") == want.replace("_", "")]
    close = close or difflib.get_close_matches(want, _KEYS, n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]}?"
    return "`mtgpu-server --check --show` lists every key, and the example configuration explains each"


def decode_config(data: bytes, path: str) -> str:
    """The text of a configuration file, refused with its line if it is not UTF-8.

    >>> decode_config(b"A: 1\nB: caf\xe9\n", "/etc/mtgpu/mtgpu.yaml")
    Traceback (most recent call last):
    ...
    mtgpu.errors.ConfigError: /etc/mtgpu/mtgpu.yaml:2: the byte 0xe9 at column 8 is not UTF-8; save the file as UTF-8
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"the byte 0x{data[exc.start]:02x} at column {column} is not UTF-8; save the file as UTF-8",
            line=line,
            path=path,
        ) from None


def _check_whole(o: Options, lines: dict[str, int], path: str) -> None:
    """Checks that span several keys."""
    if o.cluster_mode == "cluster":
        if not o.cluster_id:
            raise ConfigError(
                "CLUSTER_MODE is cluster, so CLUSTER_ID must be set",
                key="CLUSTER_ID",
                line=lines.get("CLUSTER_MODE"),
                path=path,
            )
        if not o.cluster_key:
            raise ConfigError(
                "CLUSTER_MODE is cluster, so CLUSTER_KEY must be set (mtgpu-setup install generates one)",
                key="CLUSTER_KEY",
                line=lines.get("CLUSTER_MODE"),
                path=path,
            )
    if o.cluster_lost_after < 2 * o.usage_sample_interval:
        raise ConfigError(
            f"CLUSTER_LOST_AFTER ({o.cluster_lost_after:g}s) must be at least twice "
            f"USAGE_SAMPLE_INTERVAL ({o.usage_sample_interval:g}s), the time between "
            "a member's reports, or healthy members would be declared lost",
            key="CLUSTER_LOST_AFTER",
            line=lines.get("CLUSTER_LOST_AFTER"),
            path=path,
        )
    if o.cluster_mode == "cluster":
        from mtgpu.cluster.lease import LEASE_MARGIN, lease_seconds

        lease = lease_seconds(o.cluster_lost_after, o.cluster_fence_grace)
        if lease < 2 * o.usage_sample_interval:
            raise ConfigError(
                f"CLUSTER_LOST_AFTER ({o.cluster_lost_after:g}s) must be at least CLUSTER_FENCE_GRACE "
                f"+ {LEASE_MARGIN:g}s + twice USAGE_SAMPLE_INTERVAL: the lease it leaves members "
                f"({lease:g}s) must outlast two reports; raise it or lower CLUSTER_FENCE_GRACE",
                key="CLUSTER_LOST_AFTER",
                line=lines.get("CLUSTER_LOST_AFTER"),
                path=path,
            )
    full = max_startups(o.ssh_max_startups)[2]
    if o.ssh_max_startups_per_source >= full:
        raise ConfigError(
            f"{o.ssh_max_startups_per_source} is not below the FULL of SSH_MAX_STARTUPS ({full}): one "
            f"address could take every unauthenticated slot; set it below {full} or raise SSH_MAX_STARTUPS",
            key="SSH_MAX_STARTUPS_PER_SOURCE",
            line=lines.get("SSH_MAX_STARTUPS_PER_SOURCE", lines.get("SSH_MAX_STARTUPS")),
            path=path,
        )
    host = o.ssh_listen[0]
    if host not in ("0.0.0.0", "::", "localhost"):
        try:
            ipaddress.ip_address(host)
        except ValueError as exc:
            raise ConfigError(
                f"{host!r} is not an IP address to listen on",
                key="SSH_LISTEN",
                line=lines.get("SSH_LISTEN"),
                path=path,
            ) from exc
    names: dict[str, int] = {}
    for i, d in enumerate(o.datasets_directories):
        name = Path(d).name
        where = f"DATASETS_DIRECTORIES[{i}]"
        if not name:
            raise ConfigError(
                "/ cannot be published as a dataset; list the directories to publish",
                key=where,
                line=lines.get(where),
                path=path,
            )
        if name in names:
            first = o.datasets_directories[names[name]]
            what = (
                "is listed twice"
                if first == d
                else f"has the same name as {first}: both would be published at /datasets/{name}"
            )
            raise ConfigError(
                f"{d} {what}; each dataset is published under its directory's "
                "name, so list each once and rename one of the directories",
                key=where,
                line=lines.get(where),
                path=path,
            )
        names[name] = i
    store = o.containers.storage
    if store.startswith("/") and (store + "/").startswith(o.tenant_home_root.rstrip("/") + "/"):
        raise ConfigError(
            f"{store} is under TENANT_HOME_ROOT ({o.tenant_home_root}); local container "
            "stores belong on this member's own disk, such as /var/lib/mtgpu-containers "
            "(or set home to keep them in the homes)",
            key="CONTAINERS.storage",
            line=lines.get("CONTAINERS.storage", lines.get("CONTAINERS")),
            path=path,
        )
    seen: dict[str, int] = {}
    for i, spec in enumerate(o.simulated_gpus):
        if spec.type in seen and o.simulated_gpus[seen[spec.type]].brand != spec.brand:
            raise ConfigError(
                f"type {spec.type!r} is given two brands",
                key=f"SIMULATED_GPUS[{i}].brand",
                line=lines.get(f"SIMULATED_GPUS[{i}]"),
                path=path,
            )
        seen.setdefault(spec.type, i)


def load(path: str | None = None) -> Options:
    """Read and validate the configuration file at ``path`` (see :func:`config_path`).

    A missing file at the default path gives the defaults; a missing file that was
    named explicitly is an error.
    """
    explicit = path or os.environ.get("MTGPU_CONFIG")
    p = explicit or DEFAULT_CONFIG_PATH
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES * 4 + 1)  # UTF-8 takes up to 4 bytes a character
    except FileNotFoundError as exc:
        if explicit:
            raise ConfigError(
                "the configuration file does not exist; create it or run mtgpu-setup install", path=p
            ) from exc
        return Options(source="")
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration: {exc.strerror}", path=p) from exc
    opts = load_text(decode_config(data, p), p)
    if opts.cluster_key:
        check_secret_file(p)
    return opts


def check_secret_file(path: str) -> None:
    """Refuse a file holding ``CLUSTER_KEY`` that others may read or change, as sshd
    refuses a host key others can read: the key gives root on every member."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return
    if mode & 0o077:
        raise ConfigError(
            f"this file holds the cluster key and is open to its group or others "
            f"(mode {mode:04o}); make it root's alone: chmod 600 {path}",
            key="CLUSTER_KEY",
            path=path,
        )


def replace(opts: Options, **changes: Any) -> Options:
    """A copy of ``opts`` with ``changes`` (for tests and reloads)."""
    return dataclasses.replace(opts, **changes)


#: Keys whose value ``--show`` never prints: it gives root on every member.
SECRET_KEYS = frozenset({"CLUSTER_KEY"})


def _plain(v: object) -> object:
    """``v`` as YAML would write it: tuples as lists, dataclasses as mappings."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(_plain(x) for x in v)  # type: ignore[type-var]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def show(opts: Options) -> list[str]:
    """Every key's effective value and where it came from, one line each, as
    ``sshd -T`` prints them: ``KEY: VALUE  # FILE:LINE`` or ``# default``.

    Durations are in seconds (days for ``*_DAYS``), sizes in bytes, as the daemon
    uses them.

    >>> [line for line in show(Options()) if line.startswith("CLUSTER_MODE")]
    ['CLUSTER_MODE: standalone  # default']
    """
    import json

    out = []
    for key in _KEYS:
        value = getattr(opts, key.lower())
        if key in SECRET_KEYS:
            text = "(set, not shown)" if value else '""'
        else:
            text = json.dumps(_plain(value), ensure_ascii=False, sort_keys=True)
            if isinstance(value, str) and re.match(r"^[A-Za-z0-9_./:%@-]+$", value):
                text = value
        line = opts.key_lines.get(key)
        origin = f"{opts.source}:{line}" if line else "default"
        out.append(f"{key}: {text}  # {origin}")
    return out
