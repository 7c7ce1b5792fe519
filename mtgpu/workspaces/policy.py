"""The container policy: what a tenant's podman may be asked to do. Pure, table-tested.

The same rules are applied in three places, so that every way in meets them:

1. :func:`check_podman` reads a podman command line (``mt-podman``, the ``podman``
   and ``docker`` commands MTGPU puts first on tenants' PATH, a devcontainer.json's
   ``runArgs``) and refuses what breaks a rule, naming the rule;
2. :func:`check_oci_config` reads the OCI runtime configuration that podman is about
   to hand to the runtime (the precreate hook MTGPU installs for every podman on the
   host, whoever starts it and however);
3. the builders (:func:`create_argv` and its helpers) make the workspace containers,
   so MTGPU's own containers follow the rules by construction.

The rules, by name (:data:`RULES`), are what refusals say.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence

from mtgpu.accounts.published import DATASETS_ROOT
from mtgpu.workspaces.types import (
    JOB_LABEL,
    LABEL,
    SAVED_PREFIX,
    Mount,
    Policy,
    PolicyRefusal,
    Tenant,
    WorkspaceSpec,
)

RULES: dict[str, str] = {
    "no-privileged": "containers never run --privileged",
    "no-host-devices": "--device may name only the GPUs you hold on this host",
    "no-host-namespaces": "containers never share the host's PID, network, IPC, UTS or cgroup namespace",
    "host-paths": "bind mounts come only from your home and the published datasets",
    "datasets-read-only": "datasets are mounted read-only",
    "ports": "ports are published only as CONTAINERS.port_publishing allows",
    "network": "containers have no network when CONTAINERS.network is false",
    "user-images": "only templates, pre-pulled and your saved images, unless "
    "CONTAINERS.allow_user_images is true",
    "podman-config": "the OCI hooks and configuration that carry this policy cannot be "
    "replaced from the command line",
    "no-api-service": "podman's API service and kube play are not available: they would "
    "create containers this policy never sees",
}

#: Devices podman gives every container; never the tenant's choice, always allowed.
STANDARD_DEVICES = frozenset(
    {
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/tty",
        "/dev/random",
        "/dev/urandom",
        "/dev/console",
        "/dev/ptmx",
        "/dev/pts/ptmx",
    }
)

#: The keep-alive main process of a workspace whose image command is not wanted.
KEEPALIVE = ("-c", "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done")

_LOOPBACK = ("127.0.0.1", "::1", "localhost")

# run/create options that take no value (every other long option takes one).
_RUN_BOOL = frozenset(
    {
        "--detach",
        "--disable-content-trust",
        "--env-host",
        "--help",
        "--http-proxy",
        "--init",
        "--interactive",
        "--no-healthcheck",
        "--no-hosts",
        "--oom-kill-disable",
        "--passwd",
        "--privileged",
        "--publish-all",
        "--quiet",
        "--read-only",
        "--read-only-tmpfs",
        "--replace",
        "--rm",
        "--rmi",
        "--rootfs",
        "--sig-proxy",
        "--tls-verify",
        "--tty",
        "--unsetenv-all",
    }
)
_RUN_SHORT_BOOL = frozenset("ditPq")
_EXEC_BOOL = frozenset({"--detach", "--interactive", "--privileged", "--tty", "--latest", "--help"})
_EXEC_SHORT_BOOL = frozenset("ditl")


# ------------------------------------------------------------------ helpers


def published_at(dataset: str) -> str:
    """Where every tenant finds a dataset (``mtgpu.accounts.published`` mounts it there).

    >>> published_at("/srv/data/imagenet")
    '/datasets/imagenet'
    """
    return f"{DATASETS_ROOT}/{os.path.basename(dataset.rstrip('/'))}"


def read_only_roots(policy: Policy) -> tuple[str, ...]:
    """What a tenant may bind only read-only: the datasets at both their paths, and the
    interpreters' prefixes."""
    return tuple(
        dict.fromkeys([*policy.datasets, *(published_at(d) for d in policy.datasets), *policy.interpreters])
    )


def _under(path: str, root: str) -> bool:
    """True if ``path`` is ``root`` or inside it (both normalized).

    >>> _under("/home/ann/x", "/home/ann"), _under("/home/anna", "/home/ann")
    (True, False)
    """
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def host_path(
    path: str, policy: Policy, cwd: str | None = None, realpath: Callable[[str], str] = os.path.normpath
) -> str:
    """The absolute host path a mount source names (``~`` is the home)."""
    if path == "~" or path.startswith("~/"):
        path = policy.home + path[1:]
    elif not path.startswith("/"):
        path = os.path.join(cwd or policy.home, path)
    return realpath(os.path.normpath(path))


def check_source(
    path: str,
    readonly: bool,
    policy: Policy,
    cwd: str | None = None,
    realpath: Callable[[str], str] = os.path.normpath,
) -> str:
    """Refuse a bind-mount source outside the home and the datasets, or a writable dataset.

    Returns the resolved path.
    """
    p = host_path(path, policy, cwd, realpath)
    if _under(p, policy.home):
        return p
    for d in read_only_roots(policy):
        if _under(p, d):
            if not readonly:
                what = "the Python interpreter's prefix" if d in policy.interpreters else "the dataset"
                raise PolicyRefusal(
                    "datasets-read-only",
                    f"{p} is in {what} {d}, which is published read-only; add :ro to the mount",
                )
            return p
    where = ", ".join([policy.home, *policy.datasets])
    raise PolicyRefusal(
        "host-paths",
        f"{p} is outside your home and the published datasets ({where}); copy what you need into your home",
    )


def canonical_image(ref: str, registry: str = "") -> str:
    """The fully qualified form of an image reference, with ``:latest`` when untagged.

    A short name is taken to be on ``registry`` (the configured one), else Docker Hub.

    >>> canonical_image("ubuntu")
    'docker.io/library/ubuntu:latest'
    >>> canonical_image("team/img:2", "reg.local:5000")
    'reg.local:5000/team/img:2'
    >>> canonical_image("localhost/x")
    'localhost/x:latest'
    """
    ref = ref.strip()
    for prefix in ("docker://", "containers-storage:"):
        ref = ref.removeprefix(prefix)
    digest = ""
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    name, tag = ref, ""
    if ":" in ref.rsplit("/", 1)[-1]:
        name, tag = ref.rsplit(":", 1)
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, name.split("/", 1)[1]
    else:
        domain, path = (registry or "docker.io"), name
        if domain == "docker.io" and "/" not in path:
            path = "library/" + path
    if digest:
        return f"{domain}/{path}@{digest}"
    return f"{domain}/{path}:{tag or 'latest'}"


def image_allowed(ref: str, policy: Policy) -> bool:
    """True if the policy lets this tenant use image ``ref``."""
    if policy.allow_user_images:
        return True
    forms = {canonical_image(ref, policy.registry), canonical_image(ref)}
    if any(f.startswith(SAVED_PREFIX) for f in forms):
        return True
    return bool(forms & set(policy.images))


def check_image(ref: str, policy: Policy) -> None:
    if not image_allowed(ref, policy):
        allowed = ", ".join(sorted(policy.images)) or "none"
        raise PolicyRefusal(
            "user-images",
            f"{ref} is not a template or pre-pulled image here (those are: "
            f"{allowed}; your saved images are {SAVED_PREFIX}NAME)",
        )


def parse_publish(spec: str) -> tuple[str, str, str]:
    """``[[ip:][host]:]container[/proto]`` -> (ip, host port, container port).

    >>> parse_publish("8080"), parse_publish("127.0.0.1::80/tcp"), parse_publish("[::1]:1:2")
    (('', '', '8080'), ('127.0.0.1', '', '80'), ('::1', '1', '2'))
    """
    s = spec.split("/", 1)[0]
    if s.startswith("["):
        end = s.index("]")
        ip, rest = s[1:end], s[end + 2 :]
        host, _, cport = rest.rpartition(":")
        return ip, host, cport
    parts = s.split(":")
    if len(parts) == 1:
        return "", "", parts[0]
    if len(parts) == 2:
        return "", parts[0], parts[1]
    return ":".join(parts[:-2]), parts[-2], parts[-1]


def check_publish(spec: str, policy: Policy) -> None:
    """Refuse a ``--publish`` the port policy does not allow."""
    if not policy.network:
        raise PolicyRefusal("network", "containers have no network here, so no ports can be published")
    if policy.port_publishing == "none":
        raise PolicyRefusal(
            "ports",
            f"publishing ports is off on this host (asked: {spec}); "
            "reach your service with `podman exec` or mt-container shell",
        )
    ip, host, cport = parse_publish(spec)
    if policy.port_publishing == "loopback" and ip not in _LOOPBACK:
        raise PolicyRefusal(
            "ports",
            f"ports are published on loopback only here; write "
            f"-p 127.0.0.1:{host}:{cport} and reach it with ssh -L",
        )


def _kv(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        out[k.strip().lower()] = v.strip() if sep else "true"
    return out


def check_volume(
    spec: str, policy: Policy, cwd: str | None = None, realpath: Callable[[str], str] = os.path.normpath
) -> None:
    """A ``-v`` value: named and anonymous volumes pass; host paths must be allowed."""
    parts = spec.split(":")
    src = parts[0]
    if len(parts) == 1 or not (src.startswith(("/", ".", "~"))):
        return  # an anonymous volume, or a named one in the tenant's own store
    opts = set(",".join(parts[2:]).split(",")) if len(parts) > 2 else set()
    check_source(src, "ro" in opts or "readonly" in opts, policy, cwd, realpath)


#: The ``--mount`` types podman knows; any other is refused rather than guessed at.
MOUNT_TYPES = ("bind", "glob", "volume", "tmpfs", "ramfs", "devpts", "image", "artifact")


def mount_fields(spec: str) -> tuple[str, str, bool]:
    """``--mount``'s type, source and read-only flag, read as podman reads them: CSV
    fields, a later field winning over an earlier one (``source`` and ``src`` are one
    field), the type in any case.

    >>> mount_fields("type=BIND,source=/home/ann,src=/")
    ('bind', '/', False)
    >>> mount_fields('type=bind,"src=/data",ro=false,readonly')
    ('bind', '/data', True)
    """
    import csv

    kind, src, ro = "volume", "", False
    for field_ in next(csv.reader([spec]), []):
        k, sep, v = field_.partition("=")
        k, v = k.strip().lower(), v.strip()
        if k == "type":
            kind = v.lower()
        elif k in ("source", "src"):
            src = v
        elif k in ("ro", "readonly"):
            ro = not sep or v.lower() in ("true", "1")
        elif k == "rw":
            ro = sep != "" and v.lower() not in ("true", "1")
    return kind, src, ro


def check_mount(
    spec: str, policy: Policy, cwd: str | None = None, realpath: Callable[[str], str] = os.path.normpath
) -> None:
    """A ``--mount type=...,source=...,target=...`` value."""
    kind, src, ro = mount_fields(spec)
    if kind not in MOUNT_TYPES:
        raise PolicyRefusal("host-paths", f"--mount {spec}: unknown mount type {kind!r}")
    if kind in ("bind", "glob"):
        check_source(src or "/", ro, policy, cwd, realpath)
    elif kind == "volume" and src.startswith(("/", ".", "~")):
        check_source(src, ro, policy, cwd, realpath)


def check_device(spec: str, policy: Policy, realpath: Callable[[str], str] = os.path.normpath) -> None:
    src = spec.split(":", 1)[0]
    if "=" in src and not src.startswith("/"):
        if src in policy.cdi_devices:
            return
    elif realpath(src) in policy.devices or src in policy.devices:
        return
    held = ", ".join([*policy.cdi_devices, *policy.devices]) or "none"
    raise PolicyRefusal(
        "no-host-devices",
        f"--device {spec}: you hold no such GPU on this host (yours: {held}); "
        "reserve GPUs with mt-container create --gpus N or mt-job",
    )


def check_namespace(flag: str, value: str, policy: Policy) -> None:
    v = value.lower()
    if v == "host" or v.startswith("ns:"):
        raise PolicyRefusal("no-host-namespaces", f"{flag}={value} would share a host namespace")


def _bool_value(value: str | None) -> bool:
    return value is None or value.lower() in ("true", "1", "yes", "")


# ------------------------------------------------------------- the command line


def _split(
    tokens: Sequence[str],
    bool_long: frozenset[str],
    bool_short: frozenset[str],
) -> tuple[list[tuple[str, str | None]], int]:
    """Options before the first positional: [(flag, value)], and that positional's index."""
    opts: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "--":
            return opts, i + 1
        if t.startswith("--"):
            name, eq, value = t.partition("=")
            if eq:
                opts.append((name, value))
            elif name in bool_long:
                opts.append((name, None))
            else:
                opts.append((name, tokens[i + 1] if i + 1 < len(tokens) else ""))
                i += 1
        elif t.startswith("-") and len(t) > 1:
            letters = t[1:]
            for j, ch in enumerate(letters):
                if ch in bool_short:
                    opts.append(("-" + ch, None))
                    continue
                rest = letters[j + 1 :]
                if rest:
                    opts.append(("-" + ch, rest.lstrip("=")))
                else:
                    opts.append(("-" + ch, tokens[i + 1] if i + 1 < len(tokens) else ""))
                    i += 1
                break
        else:
            return opts, i
        i += 1
    return opts, len(tokens)


_LONG = {
    "-p": "--publish",
    "-v": "--volume",
    "-P": "--publish-all",
    "-e": "--env",
    "-u": "--user",
    "-w": "--workdir",
    "-h": "--hostname",
    "-l": "--label",
    "-d": "--detach",
    "-i": "--interactive",
    "-t": "--tty",
    "--net": "--network",
}


def _check_run_options(
    opts: list[tuple[str, str | None]], policy: Policy, cwd: str | None, realpath: Callable[[str], str]
) -> bool:
    """Check run/create/pod-create options; True if a --network was given."""
    network_given = False
    for flag, value in opts:
        name = _LONG.get(flag, flag)
        if name == "--privileged" and _bool_value(value):
            raise PolicyRefusal(
                "no-privileged",
                "--privileged is refused: containers here run with the rights of your own account only",
            )
        if name in ("--device", "--device-cgroup-rule", "--gpus"):
            if name != "--device":
                raise PolicyRefusal(
                    "no-host-devices", f"{name} is refused; pass your reserved GPUs with --device"
                )
            check_device(value or "", policy, realpath)
        elif name in ("--pid", "--ipc", "--uts", "--cgroupns"):
            check_namespace(name, value or "", policy)
        elif name == "--network":
            network_given = True
            for net in (value or "").split(","):
                check_namespace(name, net, policy)
                if not policy.network and net != "none":
                    raise PolicyRefusal(
                        "network",
                        f"--network {net}: containers have no network on this host; use --network none",
                    )
        elif name == "--publish":
            check_publish(value or "", policy)
        elif name == "--publish-all" and _bool_value(value):
            if not policy.network or policy.port_publishing != "any":
                raise PolicyRefusal(
                    "ports",
                    "--publish-all would publish on every address; publish each port with -p 127.0.0.1::PORT",
                )
        elif name == "--volume":
            check_volume(value or "", policy, cwd, realpath)
        elif name == "--mount":
            check_mount(value or "", policy, cwd, realpath)
    return network_given


def check_podman(
    argv: Sequence[str],
    policy: Policy,
    *,
    cwd: str | None = None,
    realpath: Callable[[str], str] = os.path.normpath,
) -> list[str]:
    """Check a podman command line (without ``podman`` itself) against ``policy``.

    Returns the command line to run, which differs only by an added
    ``--network=none`` when the host gives containers no network. Raises
    :class:`PolicyRefusal` naming the rule it breaks.
    """
    args = list(argv)
    gopts, i = _split(
        args,
        frozenset({"--help", "--noout", "-r", "--remote", "--syslog", "-v", "--version"}),
        frozenset("rv"),
    )
    for flag, _ in gopts:
        if flag == "--hooks-dir":
            raise PolicyRefusal(
                "podman-config", "--hooks-dir would replace the hooks that carry the container policy"
            )
    cmd = args[i:]
    if not cmd:
        return args
    verb, rest, at = cmd[0], cmd[1:], i + 1
    if verb in ("container", "image", "pod", "volume", "kube", "play", "system", "buildx") and rest:
        verb, rest, at = f"{verb} {rest[0]}", rest[1:], at + 1
    verb = {
        "container run": "run",
        "container create": "create",
        "container exec": "exec",
        "image build": "build",
        "buildx build": "build",
        "image pull": "pull",
    }.get(verb, verb)
    if verb in ("kube play", "play kube", "system service"):
        raise PolicyRefusal("no-api-service", f"podman {verb} is not available to tenants")
    if verb in ("run", "create", "pod create"):
        opts, pos = _split(rest, _RUN_BOOL, _RUN_SHORT_BOOL)
        network = _check_run_options(opts, policy, cwd, realpath)
        if verb != "pod create" and pos < len(rest):
            if any(_LONG.get(f, f) == "--rootfs" and _bool_value(v) for f, v in opts):
                check_source(rest[pos], False, policy, cwd, realpath)
            else:
                check_image(rest[pos], policy)
        if not policy.network and not network and not any(f == "--pod" for f, _ in opts):
            return [*args[:at], "--network=none", *args[at:]]
        return args
    if verb == "exec":
        opts, _ = _split(rest, _EXEC_BOOL, _EXEC_SHORT_BOOL)
        if any(f == "--privileged" and _bool_value(v) for f, v in opts):
            raise PolicyRefusal("no-privileged", "exec --privileged is refused")
        return args
    if verb == "build":
        if not policy.allow_user_images:
            raise PolicyRefusal("user-images", "building images needs CONTAINERS.allow_user_images")
        for j, t in enumerate(rest):
            name, eq, value = t.partition("=")
            if not eq:
                value = rest[j + 1] if j + 1 < len(rest) else ""
            name = _LONG.get(name, name)
            if name == "--volume":
                check_volume(value, policy, cwd, realpath)
            elif name == "--device":
                check_device(value, policy, realpath)
            elif name == "--network":
                check_namespace(name, value, policy)
        return args
    if verb == "pull" and rest:
        _, pos = _split(
            rest,
            frozenset({"--all-tags", "--quiet", "--tls-verify", "--disable-content-trust", "--help"}),
            frozenset("aq"),
        )
        if pos < len(rest):
            check_image(rest[pos], policy)
        return args
    if verb == "volume create":
        opts, _ = _split(rest, frozenset({"--ignore", "--help"}), frozenset())
        kv = {}
        for f, v in opts:
            if f in ("-o", "--opt") and v:
                k, _, val = v.partition("=")
                kv[k] = val
        if kv.get("device", "").startswith("/") and "bind" in kv.get("o", "") + kv.get("type", ""):
            check_source(kv["device"], "ro" in kv.get("o", "").split(","), policy, cwd, realpath)
        elif kv.get("device", "").startswith("/dev/"):
            check_device(kv["device"], policy, realpath)
        return args
    return args


# -------------------------------------------------------------- OCI configuration


def check_oci_config(
    config: Mapping, policy: Policy, realpath: Callable[[str], str] = os.path.normpath
) -> None:
    """Check the OCI runtime configuration podman is about to use (the precreate hook)."""
    ann = config.get("annotations") or {}
    linux = config.get("linux") or {}
    caps = ((config.get("process") or {}).get("capabilities") or {}).get("bounding") or []
    if ann.get("io.podman.annotations.privileged", "").upper() == "TRUE" or (
        not linux.get("maskedPaths") and "CAP_SYS_ADMIN" in caps and "CAP_SYS_MODULE" in caps
    ):
        raise PolicyRefusal("no-privileged", "the container asks to be privileged")
    kinds = {ns.get("type") for ns in linux.get("namespaces") or []}
    if policy.job_network_host and ann.get(JOB_LABEL):
        # A containerized job on the member's network: what the tenant's native jobs
        # have anyway (rootless: the tenant's own rights on it, nothing more).
        kinds.add("network")
    for want in ("pid", "network", "ipc", "uts", "mount"):
        if want not in kinds:
            raise PolicyRefusal(
                "no-host-namespaces", f"the container would share the host's {want} namespace"
            )
    allowed_dev = set(STANDARD_DEVICES) | set(policy.devices)
    for dev in linux.get("devices") or []:
        if dev.get("path") not in allowed_dev:
            raise PolicyRefusal(
                "no-host-devices", f"the device {dev.get('path')} is not one of your reserved GPUs"
            )
    roots = [
        policy.home,
        *([policy.runtime_dir] if policy.runtime_dir else []),
        *([policy.storage_dir] if policy.storage_dir else []),
        *policy.system_sources,
    ]
    if (
        policy.job_network_host
        and ann.get(JOB_LABEL)
        and "network" not in {ns.get("type") for ns in linux.get("namespaces") or []}
    ):
        roots.append("/sys")  # no network namespace of its own: podman binds the host's /sys
    for m in config.get("mounts") or []:
        opts = m.get("options") or []
        if m.get("type") != "bind" and "bind" not in opts and "rbind" not in opts:
            continue
        src = realpath(os.path.normpath(m.get("source") or "/"))
        if src.startswith("/dev/"):
            if src in allowed_dev or src.startswith(("/dev/pts/", "/dev/shm/", "/dev/mqueue")):
                continue
            raise PolicyRefusal("no-host-devices", f"the device {src} is not one of your reserved GPUs")
        if any(_under(src, r) for r in roots):
            continue
        check_source(src, "ro" in opts, policy, realpath=lambda p: p)


# ------------------------------------------------------------ workspace builders


def cache_dir_name(container_path: str) -> str:
    """The directory under ``~/.mtgpu/cache/`` that backs one cache volume.

    >>> cache_dir_name("/root/.cache/pip")
    'root-.cache-pip'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "-", container_path.strip("/")) or "root"


def publish_args(ports: Iterable[int], policy: Policy) -> list[str]:
    """``--publish`` options for a workspace's ports; the host port is chosen by podman."""
    out = []
    for p in ports:
        spec = f"127.0.0.1::{p}" if policy.port_publishing == "loopback" else str(p)
        check_publish(spec, policy)
        out.append(f"--publish={spec}")
    return out


def mount_args(
    spec: WorkspaceSpec, tenant: Tenant, policy: Policy, cache_volumes: Sequence[str]
) -> list[str]:
    """The home at its own path, cache volumes, the published datasets and interpreters
    (read-only, at the same paths as on the host) and the spec's mounts."""
    return [*tenant_mounts(tenant, policy, cache_volumes), *(_mount_arg(m, policy) for m in spec.mounts)]


def tenant_mounts(tenant: Tenant, policy: Policy, cache_volumes: Sequence[str]) -> list[str]:
    """What every container of a tenant's gets (workspaces and containerized jobs): the
    home at its own path, the cache volumes, the published datasets and interpreters."""
    home = tenant.home
    out = [f"--volume={home}:{home}"]
    for path in cache_volumes:
        out.append(f"--volume={home}/.mtgpu/cache/{cache_dir_name(path)}:{path}")
    return out + published_mounts(policy)


def published_mounts(policy: Policy) -> list[str]:
    """The published datasets and interpreters, read-only at the host's paths.

    Bound from the sources (paths on disk), not from the host's /datasets mounts: a
    tenant's podman may run in a mount namespace made before those."""
    out = []
    for d in policy.datasets:
        out.append(f"--volume={d}:{d}:ro")
        if published_at(d) != d:
            out.append(f"--volume={d}:{published_at(d)}:ro")
    for d in policy.interpreters:
        out.append(f"--volume={d}:{d}:ro")
    return out


def _mount_arg(m: Mount, policy: Policy) -> str:
    if m.kind == "volume":
        if "/" in m.source or not m.source:
            raise PolicyRefusal("host-paths", f"a volume is named by a plain name, not {m.source!r}")
        return f"--volume={m.source}:{m.target}" + (":ro" if m.readonly else "")
    src = check_source(m.source, m.readonly or _in_datasets(m.source, policy), policy)
    ro = m.readonly or _in_datasets(src, policy)
    return f"--volume={src}:{m.target}" + (":ro" if ro else "")


def _in_datasets(path: str, policy: Policy) -> bool:
    p = os.path.normpath(path)
    return any(_under(p, d) for d in read_only_roots(policy))


def gpu_device_args(cdi: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """``--device`` options: CDI names for NVIDIA, device nodes for the other brands."""
    return [f"--device={d}" for d in [*cdi, *nodes]]


def create_argv(
    spec: WorkspaceSpec,
    tenant: Tenant,
    policy: Policy,
    *,
    image: str,
    reservation: str,
    cache_volumes: Sequence[str] = (),
    devices: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stop_timeout: int = 5,
) -> list[str]:
    """The ``podman create`` command line of a workspace (without ``podman``)."""
    argv = [
        "create",
        f"--name={spec.name}",
        f"--hostname={spec.name}",
        "--userns=keep-id",
        f"--label={LABEL}={spec.name}",
        f"--label=mtgpu.reservation={reservation}",
        f"--stop-timeout={stop_timeout}",
        f"--workdir={spec.workdir or tenant.home}",
        f"--env=HOME={tenant.home}",
        f"--env=USER={tenant.name}",
        f"--env=MTGPU_WORKSPACE={spec.name}",
    ]
    for k, v in {**(env or {}), **spec.env}.items():
        if k != "HOME":
            argv.append(f"--env={k}={v}")
    argv += mount_args(spec, tenant, policy, cache_volumes)
    argv += [f"--device={d}" if not d.startswith("--") else d for d in devices]
    if not policy.network:
        argv.append("--network=none")
    argv += publish_args(spec.ports, policy)
    if spec.run_args:
        check_podman(["create", *spec.run_args, image], policy)
        argv += list(spec.run_args)
    if spec.command:
        argv += [image, *spec.command]
    elif spec.use_image_command:
        argv.append(image)
    else:
        argv += ["--entrypoint=/bin/sh", image, *KEEPALIVE]
    return argv


def describe_rules(policy: Policy) -> str:
    """The rules as a tenant reads them (``mt-podman --rules``)."""
    ports = {
        "none": "no ports are published",
        "loopback": "ports are published on 127.0.0.1 only (-p 127.0.0.1::PORT); reach them with ssh -L",
        "any": "ports may be published on any address",
    }[policy.port_publishing]
    lines = [f"{name}: {text}" for name, text in RULES.items()]
    lines += [
        "",
        f"your home: {policy.home}",
        "datasets (read-only): "
        + (", ".join(f"{published_at(d)} (also at {d})" for d in policy.datasets) or "none"),
        f"Python interpreters (read-only): {', '.join(policy.interpreters) or 'none'}",
        f"your GPUs here: {', '.join([*policy.cdi_devices, *policy.devices]) or 'none'}",
        f"network: {'on' if policy.network else 'off'}; {ports}",
        f"images: {'any' if policy.allow_user_images else ', '.join(policy.images) or 'none'}",
    ]
    return "\n".join(lines)


def quote(argv: Sequence[str]) -> str:
    return shlex.join(argv)
