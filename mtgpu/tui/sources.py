"""Where remotegpu-cli finds servers: its own list, the user's ``~/.ssh/config`` and
the members of clusters it already knows.

The list lives in ``~/.config/remotegpu/servers.yaml``::

    servers:
      - gpu01                       # a Host of ~/.ssh/config, or [user@]host[:port]
      - name: lab                   # or spelled out
        host: lab.example.org
        port: 2222
        user: alice
        identity: ~/.ssh/id_lab
    ssh_config: true                # also try the Host entries of ~/.ssh/config

Only pure functions and file reading here: no network, nothing POSIX-only.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from mtgpu.errors import MtgpuError

#: Where each server came from, as shown in ``servers --json``.
LIST, SSH_CONFIG, CLUSTER = "list", "ssh_config", "cluster"


class ServerListError(MtgpuError):
    """servers.yaml is not what remotegpu-cli expects."""


@dataclass(frozen=True)
class Target:
    """One server to connect to. ``host`` may be a Host alias of ``~/.ssh/config``."""

    name: str
    host: str
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    source: str = LIST

    def key(self) -> tuple[str, int | None, str | None]:
        return (self.host.lower(), self.port, self.user)

    def destination(self) -> str:
        """The ``[user@]host[:port]`` form, as written in servers.yaml.

        >>> Target("x", "gpu01", 2222, "alice").destination()
        'alice@gpu01:2222'
        """
        host = f"[{self.host}]" if ":" in self.host and self.port else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def ssh_argv(self, *command: str, tty: bool = False) -> list[str]:
        """The system ``ssh`` command line that reaches this server.

        >>> Target("x", "10.0.0.5", 2222, "alice").ssh_argv("mt-job", "list")
        ['ssh', '-p', '2222', '-l', 'alice', '10.0.0.5', 'mt-job', 'list']
        """
        argv = ["ssh"]
        if tty:
            argv.append("-t")
        if self.port:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        if self.identity:
            argv += ["-i", os.path.expanduser(self.identity)]
        return argv + [self.host, *command]


_DEST = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\s\[\]]+))"
    r"(?::(?P<port>\d{1,5}))?$"
)


def parse_destination(text: str, name: str | None = None, source: str = LIST) -> Target:
    """``[user@]host[:port]`` (IPv6 in brackets) as a :class:`Target`.

    >>> parse_destination("alice@gpu01:2222")
    Target(name='gpu01', host='gpu01', port=2222, user='alice', identity=None, source='list')
    >>> parse_destination("gpu 01")
    Traceback (most recent call last):
    ...
    mtgpu.tui.sources.ServerListError: 'gpu 01' is not a server: write [user@]host[:port], such as alice@gpu01:2222, or a Host of ~/.ssh/config
    """
    m = _DEST.match(text.strip())
    port = int(m["port"]) if m and m["port"] else None
    if m is None or (port is not None and not 1 <= port <= 65535):
        raise ServerListError(
            f"{text!r} is not a server: write [user@]host[:port], such as "
            "alice@gpu01:2222, or a Host of ~/.ssh/config"
        )
    host = m["v6"] or m["host"]
    return Target(name=name or host, host=host, port=port, user=m["user"], source=source)


def config_dir() -> Path:
    """``~/.config/remotegpu`` (``$XDG_CONFIG_HOME/remotegpu``; ``%APPDATA%`` on Windows)."""
    base = os.environ.get("XDG_CONFIG_HOME") or (os.environ.get("APPDATA") if os.name == "nt" else None)
    return Path(base).expanduser() / "remotegpu" if base else Path.home() / ".config" / "remotegpu"


def servers_file() -> Path:
    return Path(os.environ.get("REMOTEGPU_SERVERS") or config_dir() / "servers.yaml")


@dataclass(frozen=True)
class ServerList:
    """The user's own list and its settings."""

    targets: tuple[Target, ...] = ()
    ssh_config: bool = True
    path: Path | None = None


def load_server_list(path: Path | None = None) -> ServerList:
    """Read servers.yaml (a missing file is an empty list); errors name the entry."""
    path = path or servers_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ServerList(path=path)
    except OSError as exc:
        raise ServerListError(f"{path}: cannot be read ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ServerListError(f"{path}: not valid YAML ({exc}); fix or remove the file") from exc
    if not isinstance(data, dict):
        raise ServerListError(f"{path}: expected a mapping with a `servers:` list")
    unknown = sorted(set(data) - {"servers", "ssh_config"})
    if unknown:
        raise ServerListError(f"{path}: unknown key {unknown[0]!r}; the keys are `servers` and `ssh_config`")
    raw = data.get("servers") or []
    if not isinstance(raw, list):
        raise ServerListError(f"{path}: `servers` must be a list")
    targets: list[Target] = []
    for i, entry in enumerate(raw, 1):
        where = f"{path}: servers entry {i}"
        if isinstance(entry, str):
            try:
                targets.append(parse_destination(entry))
            except ServerListError as exc:
                raise ServerListError(f"{where}: {exc}") from None
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("host"), str):
            raise ServerListError(
                f"{where}: write a destination such as alice@gpu01:2222, or a mapping with at least `host:`"
            )
        bad = sorted(set(entry) - {"name", "host", "port", "user", "identity"})
        if bad:
            raise ServerListError(f"{where}: unknown key {bad[0]!r}; use name, host, port, user, identity")
        port = entry.get("port")
        if port is not None and (not isinstance(port, int) or not 1 <= port <= 65535):
            raise ServerListError(f"{where}: port must be a number from 1 to 65535")
        targets.append(
            Target(
                name=str(entry.get("name") or entry["host"]),
                host=entry["host"],
                port=port,
                user=_opt_str(entry, "user", where),
                identity=_opt_str(entry, "identity", where),
            )
        )
    flag = data.get("ssh_config", True)
    if not isinstance(flag, bool):
        raise ServerListError(f"{path}: ssh_config must be true or false")
    return ServerList(tuple(targets), flag, path)


def _opt_str(entry: dict[str, Any], key: str, where: str) -> str | None:
    v = entry.get(key)
    if v is not None and not isinstance(v, str):
        raise ServerListError(f"{where}: {key} must be text")
    return v


def save_server_list(sl: ServerList) -> Path:
    """Write the list back (entries as destinations where that loses nothing)."""
    path = sl.path or servers_file()
    entries: list[Any] = []
    for t in sl.targets:
        if t.identity is None and t.name == t.host:
            entries.append(t.destination())
        else:
            entries.append(
                {
                    k: v
                    for k, v in (
                        ("name", t.name),
                        ("host", t.host),
                        ("port", t.port),
                        ("user", t.user),
                        ("identity", t.identity),
                    )
                    if v is not None
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        yaml.safe_dump({"servers": entries, "ssh_config": sl.ssh_config}, sort_keys=False), encoding="utf-8"
    )
    os.replace(tmp, path)
    return path


def add_server(sl: ServerList, target: Target) -> ServerList:
    if any(t.key() == target.key() or t.name == target.name for t in sl.targets):
        raise ServerListError(f"{target.destination()} is already in the list")
    return replace(sl, targets=(*sl.targets, replace(target, source=LIST)))


def remove_server(sl: ServerList, name: str) -> ServerList:
    left = tuple(t for t in sl.targets if t.name != name)
    if len(left) == len(sl.targets):
        raise ServerListError(
            f"{name} is not in your list ({sl.path}); servers found in "
            "~/.ssh/config or from a cluster are not stored there"
        )
    return replace(sl, targets=left)


def ssh_config_file() -> Path:
    return Path.home() / ".ssh" / "config"


def ssh_config_hosts(path: Path | None = None) -> list[str]:
    """The plain Host names of an OpenSSH client config (no patterns), following Include.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "config"
    >>> _ = p.write_text("Host gpu01 gpu02\\n  Port 2222\\nHost *.lab !x\\nHost gpu01\\n")
    >>> ssh_config_hosts(p)
    ['gpu01', 'gpu02']
    """
    path = path or ssh_config_file()
    seen: list[str] = []
    _read_hosts(path, seen, depth=0)
    return seen


def _read_hosts(path: Path, seen: list[str], depth: int) -> None:
    if depth > 8:
        return
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.strip().replace("=", " ", 1).split()
        if len(parts) < 2 or parts[0].startswith("#"):
            continue
        word = parts[0].lower()
        if word == "host":
            for h in parts[1:]:
                if not any(c in h for c in "*?!") and h not in seen:
                    seen.append(h)
        elif word == "include":
            for pattern in parts[1:]:
                p = Path(os.path.expanduser(pattern))
                if not p.is_absolute():
                    p = Path.home() / ".ssh" / p
                for inc in sorted(p.parent.glob(p.name)):
                    _read_hosts(inc, seen, depth + 1)


def member_target(origin: Target, member: dict[str, Any], user: str | None) -> Target | None:
    """A cluster member (``{"name", "address": "HOST:PORT"}``) reached like ``origin``, as
    ``user`` (the account the origin logged in as)."""
    addr = str(member.get("address") or "")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or host in ("0.0.0.0", "::"):
        return None
    return Target(
        name=str(member["name"]),
        host=host,
        port=int(port),
        user=user or origin.user,
        identity=origin.identity,
        source=CLUSTER,
    )
