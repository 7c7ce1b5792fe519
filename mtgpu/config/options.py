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

from mtgpu.config.units import parse_duration, parse_size
from mtgpu.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/mtgpu/mtgpu.yaml"

# systemd reserves these UID ranges (systemd's UIDS-GIDS.md); tenants stay clear.
_SYSTEMD_RESERVED = [(60001, 60513, "systemd-homed"), (61184, 65519, "systemd DynamicUser"),
                     (65534, 65534, "nobody"), (65535, 65535, "16-bit -1"),
                     (524288, 1879048191, "systemd-nspawn containers")]

# mtgpu.accounts.provision.SUBID_UID_MAX: 65536 subordinate IDs per UID from 2**31 up.
_UID_MAX_WITH_SUBIDS = 33767

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_SERVER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


@dataclass(frozen=True)
class SimulatedGpuSpec:
    """One ``SIMULATED_GPUS`` entry: ``count`` GPUs of ``type`` with ``vram`` bytes each."""

    type: str
    count: int
    vram: int
    brand: str = "nvidia"
    used: int = 0


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
    server_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    ssh_listen: tuple[str, int] = ("0.0.0.0", 2222)
    state_dir: str = "/var/lib/mtgpu"
    run_dir: str = "/run/mtgpu"
    tenant_home_root: str = "/home"
    tenant_uid_range: tuple[int, int] = (20000, 29999)
    tenant_shell: str = "/bin/bash"
    admins: tuple[str, ...] = ()
    containers: ContainersOptions = field(default_factory=ContainersOptions)
    datasets_directories: tuple[str, ...] = ()
    python_interpreters: tuple[InterpreterSpec, ...] = ()
    user_disk_limit: int | None = None
    user_disk_scan_interval: float = 60.0
    user_submit_rate: float | None = 20.0
    user_submit_burst: int = 200
    user_max_queued_jobs: int | None = 10000
    job_retention_days: float = 30
    tenant_retention_days: float | None = None
    tenant_retention_grace: float = 7 * 86400
    tenant_retention_home: str = "archive"
    tenant_retention_archive_dir: str = ""  # "" is STATE_DIR/retired-homes
    gpu_probes: tuple[GpuProbeSpec, ...] = ()
    simulated_gpus: tuple[SimulatedGpuSpec, ...] = ()
    simulated_cpus: int | None = None
    usage_sample_interval: float = 5.0
    priority_aging: float = 10.0
    invite_ttl: float = 7 * 86400
    invite_max_failures: int = 3
    ssh_login_grace_time: float = 120.0
    ssh_max_startups: int = 100
    ssh_max_auth_tries: int = 6
    ssh_penalty_failures: int = 10
    ssh_penalty_seconds: float = 60.0
    allow_agent_forwarding: bool = False
    wsl_lock_drives: bool = True
    log_level: str = "INFO"
    # Where the configuration was read from ("" for defaults); not a key.
    source: str = ""

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
    return float(v)


def _posint(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"expected a positive whole number, got {_kind(v)}")
    return v


def _duration(v: object) -> float:
    return parse_duration(v)


def _positive_duration(v: object, what: str) -> float:
    d = parse_duration(v)
    if d <= 0:
        raise ValueError(f"expected a duration longer than 0 for {what}, such as 60s")
    return d


def _days(v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"expected a number of days above 0, or null for never, got {_kind(v)}")
    return float(v)


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
                    raise ValueError("an entry with a name is one NAME: PATH pair, such as "
                                     "py311: /opt/python3.11/bin/python3")
                (name, path), = e.items()
                if not isinstance(name, str) or not _INTERPRETER_NAME_RE.match(name):
                    raise ValueError(f"{name!r} is not an interpreter name; use letters, digits, "
                                     "'.', '_', '+' or '-', such as py311")
                spec = InterpreterSpec(_abspath(path), name)
            else:
                spec = InterpreterSpec(_abspath(e))
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        for j, prev in enumerate(out):
            if prev.path == spec.path:
                raise _SubKeyError(f"[{i}]", f"{spec.path} is listed twice (also entry {j}); "
                                             "list each interpreter once")
            if spec.name and prev.name == spec.name:
                raise _SubKeyError(f"[{i}]", f"the name {spec.name!r} is given twice (also entry "
                                             f"{j}); give each interpreter its own name")
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
        raise ValueError(f"the range {lo}-{hi} ends above {_UID_MAX_WITH_SUBIDS}: each tenant gets "
                         "65536 subordinate IDs derived from its UID for rootless podman, and "
                         f"higher UIDs have none left; end the range at {_UID_MAX_WITH_SUBIDS} or below")
    for a, b, what in _SYSTEMD_RESERVED:
        if lo <= b and a <= hi:
            raise ValueError(f"the range {lo}-{hi} overlaps {what} ({a}-{b}), which systemd "
                             "reserves; choose a range below 60000, such as 20000-29999")
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


def _size_or_none(v: object) -> int | None:
    if v is None:
        return None
    return parse_size(v)


def _retention_home(v: object) -> str:
    s = _str(v)
    if s not in ("archive", "remove"):
        raise ValueError(f"expected archive (a tar of the home is kept) or remove, got {s!r}")
    return s


def _log_level(v: object) -> str:
    s = _str(v).upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"expected DEBUG, INFO, WARNING or ERROR, got {v!r}")
    return s


def _sub(mapping: object, allowed: Mapping[str, Callable[[Any], Any]], what: str,
         required: tuple[str, ...] = ()) -> dict[str, Any]:
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
        raise ValueError(f"{v!r} is not a GPU type name; use lower-case letters, digits and dashes, such as rtx4090")
    return s


def _brand(v: object) -> str:
    s = _str(v).strip().lower()
    if not re.match(r"^[a-z][a-z0-9_-]*$", s):
        raise ValueError(f"{v!r} is not a brand name; use a lower-case word such as nvidia")
    return s


def _simulated(v: object) -> tuple[SimulatedGpuSpec, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"expected a list of entries like {{type: rtx4090, count: 2, vram: 24G}}, got {_kind(v)}")
    out = []
    for i, e in enumerate(v):
        try:
            d = _sub(e, {"type": _gpu_type, "count": _posint, "vram": parse_size,
                         "brand": _brand, "used": parse_size},
                     "a simulated GPU entry", required=("type", "vram"))
        except _SubKeyError as exc:
            raise _SubKeyError(f"[{i}].{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        if d.get("used", 0) > d["vram"]:
            raise _SubKeyError(f"[{i}].used", "used VRAM cannot exceed the card's vram")
        out.append(SimulatedGpuSpec(type=d["type"], count=d.get("count", 1), vram=d["vram"],
                                    brand=d.get("brand", "nvidia"), used=d.get("used", 0)))
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
            d = _sub(e, {"name": _str, "brand": _brand, "command": _argv,
                         "visibility_env": _env_name, "devices": _paths, "timeout": _posnum},
                     "a GPU probe entry", required=("brand", "command", "visibility_env"))
        except _SubKeyError as exc:
            raise _SubKeyError(f"[{i}].{exc.sub}", str(exc)) from exc
        except ValueError as exc:
            raise _SubKeyError(f"[{i}]", str(exc)) from exc
        out.append(GpuProbeSpec(brand=d["brand"], command=d["command"],
                                visibility_env=d["visibility_env"], devices=d.get("devices", ()),
                                name=d.get("name", d["brand"]), timeout=d.get("timeout", 10.0)))
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
        d: dict[str, Any] = {"source": parts[0], "target": parts[1],
                             "readonly": len(parts) == 3 and parts[2] == "ro"}
    elif isinstance(v, dict):
        d = _sub(v, {"source": _str, "target": _str, "readonly": _bool}, "a mount",
                 required=("source", "target"))
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
    d = _sub(v, {"image": _str, "gpus": _template_gpus, "cpus": _posint, "ram": parse_size,
                 "ports": lambda x: tuple(_port(p) for p in _list(x, "container ports")),
                 "env": _env_map, "mounts": lambda x: [_mount(m) for m in _list(x, "mounts")],
                 "command": _argv, "description": _str}, "a template", required=("image",))
    if not d["image"]:
        raise _SubKeyError("image", "the image name is empty")
    gpus, gpu_type = d.pop("gpus", (0, None))
    return {"image": d["image"], "gpus": gpus, "gpu_type": gpu_type, "cpus": d.get("cpus", 1),
            "ram": d.get("ram", 1 << 30), "ports": d.get("ports", ()), "env": d.get("env", {}),
            "mounts": d.get("mounts", []), "command": d.get("command", ()),
            "description": d.get("description", "")}


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
    d = _sub(v, {"url": _str, "credentials": lambda x: None if x is None else _abspath(x),
                 "tls_verify": _bool}, "the registry", required=("url",))
    url = d["url"].strip()
    for scheme in ("https://", "http://", "docker://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    if not url or "/" in url.rstrip("/") or " " in url:
        raise _SubKeyError("url", f"expected a registry host[:port] such as registry.example.com, got {d['url']!r}")
    return {"url": url.rstrip("/"), "credentials": d.get("credentials"),
            "tls_verify": d.get("tls_verify", True)}


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
        "enabled": _bool, "templates": _templates, "prepull": _image_list, "registry": _registry,
        "cache_volumes": _volume_list, "network": _bool, "port_publishing": _port_policy,
        "allow_user_images": _bool, "archive_dir": _abspath, "image_cache": _positive_size,
        "job_network": _job_network, "storage": _container_storage}
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
        raise ValueError("the cluster key is too short; use at least 16 characters "
                         "(mtgpu-setup generates one)")
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
    "CLUSTER_ADVERTISE": lambda v: "" if v is None else "%s:%d" % _listen(v),
    "CLUSTER_VOTER_GRACE": _duration,
    "CLUSTER_LOST_AFTER": _duration,
    "SERVER_NAME": _server_name,
    "SSH_LISTEN": _listen,
    "STATE_DIR": _abspath,
    "RUN_DIR": _abspath,
    "TENANT_HOME_ROOT": _abspath,
    "TENANT_UID_RANGE": _uid_range,
    "TENANT_SHELL": _shell,
    "ADMINS": _names,
    "CONTAINERS": _containers,
    "DATASETS_DIRECTORIES": _paths,
    "PYTHON_INTERPRETERS": _interpreters,
    "USER_DISK_LIMIT": _size_or_none,
    "USER_DISK_SCAN_INTERVAL": lambda v: _positive_duration(v, "USER_DISK_SCAN_INTERVAL"),
    "USER_SUBMIT_RATE": lambda v: None if v is None else _posnum(v),
    "USER_SUBMIT_BURST": _posint,
    "USER_MAX_QUEUED_JOBS": lambda v: None if v is None else _posint(v),
    "JOB_RETENTION_DAYS": _days,
    "TENANT_RETENTION_DAYS": _days,
    "TENANT_RETENTION_GRACE": _duration,
    "TENANT_RETENTION_HOME": _retention_home,
    "TENANT_RETENTION_ARCHIVE_DIR": lambda v: "" if v is None else _abspath(v),
    "GPU_PROBES": _probes,
    "SIMULATED_GPUS": _simulated,
    "SIMULATED_CPUS": lambda v: None if v is None else _posint(v),
    "USAGE_SAMPLE_INTERVAL": _posnum,
    "PRIORITY_AGING": _posnum,
    "INVITE_TTL": _duration,
    "INVITE_MAX_FAILURES": _posint,
    "SSH_LOGIN_GRACE_TIME": _duration,
    "SSH_MAX_STARTUPS": _posint,
    "SSH_MAX_AUTH_TRIES": _posint,
    "SSH_PENALTY_FAILURES": _posint,
    "SSH_PENALTY_SECONDS": _duration,
    "ALLOW_AGENT_FORWARDING": _bool,
    "WSL_LOCK_DRIVES": _bool,
    "LOG_LEVEL": _log_level,
}


# -------------------------------------------------------------------- loader

def _lines(node: yaml.Node, path: str, out: dict[str, int]) -> None:
    """Record the 1-based line of every key path (``A.b``, ``A[0].c``) in ``node``."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = str(k.value)
            sub = f"{path}.{key}" if path else key
            out[sub] = k.start_mark.line + 1
            _lines(v, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            sub = f"{path}[{i}]"
            out[sub] = v.start_mark.line + 1
            _lines(v, sub, out)


def load_text(text: str, path: str = "<config>") -> Options:
    """Validate configuration ``text`` and return the options; raise ConfigError."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML ({problem}); fix the syntax", line=line, path=path) from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("the file must be a mapping of KEY: value lines", path=path, line=1)
    lines: dict[str, int] = {}
    if node is not None:
        _lines(node, "", lines)
    values: dict[str, Any] = {}
    for key, val in raw.items():
        k = str(key)
        if k not in _KEYS:
            close = [c for c in _KEYS if c.replace("_", "") == k.upper().replace("_", "")]
            hint = f"did you mean {close[0]}?" if close else "see etc/mtgpu.yaml for the keys"
            raise ConfigError(f"unknown key; {hint}", key=k, line=lines.get(k), path=path)
        try:
            values[k.lower()] = _KEYS[k](val)
        except _SubKeyError as exc:
            sub = f"{k}{exc.sub}" if exc.sub.startswith("[") else f"{k}.{exc.sub}"
            raise ConfigError(str(exc), key=sub, line=lines.get(sub, lines.get(k)), path=path) from exc
        except ValueError as exc:
            raise ConfigError(str(exc), key=k, line=lines.get(k), path=path) from exc
    opts = Options(**values, source=path)
    _check_whole(opts, lines, path)
    return opts


def _check_whole(o: Options, lines: dict[str, int], path: str) -> None:
    """Checks that span several keys."""
    if o.cluster_mode == "cluster":
        if not o.cluster_id:
            raise ConfigError("CLUSTER_MODE is cluster, so CLUSTER_ID must be set",
                              key="CLUSTER_ID", line=lines.get("CLUSTER_MODE"), path=path)
        if not o.cluster_key:
            raise ConfigError("CLUSTER_MODE is cluster, so CLUSTER_KEY must be set "
                              "(mtgpu-setup install generates one)",
                              key="CLUSTER_KEY", line=lines.get("CLUSTER_MODE"), path=path)
    if o.cluster_lost_after < 2 * o.usage_sample_interval:
        raise ConfigError(f"CLUSTER_LOST_AFTER ({o.cluster_lost_after:g}s) must be at least twice "
                          f"USAGE_SAMPLE_INTERVAL ({o.usage_sample_interval:g}s), the time between "
                          "a member's reports, or healthy members would be declared lost",
                          key="CLUSTER_LOST_AFTER", line=lines.get("CLUSTER_LOST_AFTER"), path=path)
    host = o.ssh_listen[0]
    if host not in ("0.0.0.0", "::", "localhost"):
        try:
            ipaddress.ip_address(host)
        except ValueError as exc:
            raise ConfigError(f"{host!r} is not an IP address to listen on",
                              key="SSH_LISTEN", line=lines.get("SSH_LISTEN"), path=path) from exc
    names: dict[str, int] = {}
    for i, d in enumerate(o.datasets_directories):
        name = Path(d).name
        where = f"DATASETS_DIRECTORIES[{i}]"
        if not name:
            raise ConfigError("/ cannot be published as a dataset; list the directories to publish",
                              key=where, line=lines.get(where), path=path)
        if name in names:
            first = o.datasets_directories[names[name]]
            what = ("is listed twice" if first == d else
                    f"has the same name as {first}: both would be published at /datasets/{name}")
            raise ConfigError(f"{d} {what}; each dataset is published under its directory's "
                              "name, so list each once and rename one of the directories",
                              key=where, line=lines.get(where), path=path)
        names[name] = i
    store = o.containers.storage
    if store.startswith("/") and (store + "/").startswith(o.tenant_home_root.rstrip("/") + "/"):
        raise ConfigError(f"{store} is under TENANT_HOME_ROOT ({o.tenant_home_root}); local container "
                          "stores belong on this member's own disk, such as /var/lib/mtgpu-containers "
                          "(or set home to keep them in the homes)",
                          key="CONTAINERS.storage", line=lines.get("CONTAINERS.storage", lines.get("CONTAINERS")),
                          path=path)
    seen: dict[str, int] = {}
    for i, spec in enumerate(o.simulated_gpus):
        if spec.type in seen and o.simulated_gpus[seen[spec.type]].brand != spec.brand:
            raise ConfigError(f"type {spec.type!r} is given two brands",
                              key=f"SIMULATED_GPUS[{i}].brand", line=lines.get(f"SIMULATED_GPUS[{i}]"),
                              path=path)
        seen.setdefault(spec.type, i)


def load(path: str | None = None) -> Options:
    """Read and validate the configuration file at ``path`` (see :func:`config_path`).

    A missing file at the default path gives the defaults; a missing file that was
    named explicitly is an error.
    """
    explicit = path or os.environ.get("MTGPU_CONFIG")
    p = explicit or DEFAULT_CONFIG_PATH
    try:
        text = Path(p).read_text()
    except FileNotFoundError as exc:
        if explicit:
            raise ConfigError("the configuration file does not exist; create it or run "
                              "mtgpu-setup install", path=p) from exc
        return Options(source="")
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration: {exc.strerror}", path=p) from exc
    return load_text(text, p)


def replace(opts: Options, **changes: Any) -> Options:
    """A copy of ``opts`` with ``changes`` (for tests and reloads)."""
    return dataclasses.replace(opts, **changes)
