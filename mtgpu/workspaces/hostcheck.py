"""What rootless podman needs on this host: detected, then set up or named exactly.

``mtgpu-setup podman-check`` prints one line per need; ``--fix`` sets up what can be
set up. :func:`gather` reads the host into :class:`HostFacts`; :func:`assess` is pure
(facts in, findings out) and is tested with tables; :func:`fix` carries out the
findings' fixes.

The needs:

- podman itself, ``newuidmap``/``newgidmap`` (setuid, from ``uidmap``), a rootless
  network helper (``slirp4netns`` or ``pasta``), and ``skopeo`` when images are to be
  pre-pulled;
- ``/etc/subuid`` and ``/etc/subgid`` ranges for every tenant, derived from the UID
  (:func:`mtgpu.accounts.provision.subid_range`) so they match on every host;
- ``/run/user`` for the per-tenant ``XDG_RUNTIME_DIR`` (the daemon makes
  ``/run/user/UID``, 0700, the tenant's, when a tenant first uses podman);
- on hybrid or v1 cgroups, ``runc`` (crun refuses them), and without systemd the
  ``cgroupfs`` manager and the ``file`` events logger: a drop-in
  ``/etc/containers/containers.conf.d/50-mtgpu.conf``;
- ``/dev/net/tun`` mode 0666 for rootless networking;
- the container policy's OCI hook (:mod:`mtgpu.workspaces.hook`) in
  ``/etc/containers/oci/hooks.d``, and ``hooks_dir`` pointing there;
- with NVIDIA GPUs, a CDI spec (``nvidia-ctk cdi generate``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtgpu.accounts.provision import subid_range
from mtgpu.config import Options
from mtgpu.errors import CommandError
from mtgpu.proc import run

DROPIN = "/etc/containers/containers.conf.d/50-mtgpu.conf"
HOOKS_DIR = "/etc/containers/oci/hooks.d"
HOOK_FILE = f"{HOOKS_DIR}/50-mtgpu-policy.json"
SYSTEM_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"


@dataclass(frozen=True)
class HostFacts:
    """What :func:`gather` read; plain values so :func:`assess` is a pure function."""

    podman: str | None = None
    podman_version: str = ""
    newuidmap_setuid: bool = False
    network_helper: str | None = None
    skopeo: bool = False
    runc: bool = False
    crun: bool = False
    cgroup_unified: bool = True
    systemd: bool = False
    tun_mode: int | None = 0o666
    run_user: bool = True
    userns_max: int = 1
    subuid: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    subgid: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    tenants: dict[str, int] = field(default_factory=dict)
    dropin: str = ""
    hook: str = ""
    nvidia: bool = False
    cdi_nvidia: bool = False
    nvidia_ctk: bool = False
    #: The filesystem type of TENANT_HOME_ROOT (where podman keeps stores by default).
    home_fs: str = ""


@dataclass(frozen=True)
class Finding:
    """One need: ``ok``, or what is wrong and whether ``--fix`` can set it up."""

    name: str
    ok: bool
    detail: str
    fix: str = ""  # a key of FIXES, empty when only a person can fix it

    def line(self) -> str:
        tag = "ok     " if self.ok else ("fixable" if self.fix else "MISSING")
        return f"{tag}  {self.name}: {self.detail}"


def dropin_text(facts: HostFacts) -> str:
    """The containers.conf drop-in this host needs (engine settings and the hook)."""
    lines = ["# Written by mtgpu-setup podman-check --fix; changes are overwritten.", "[engine]"]
    if not facts.cgroup_unified:
        lines.append('runtime = "runc"')
    if not facts.systemd:
        lines += ['cgroup_manager = "cgroupfs"', 'events_logger = "file"']
    lines.append(f'hooks_dir = ["{SYSTEM_HOOKS_DIR}", "{HOOKS_DIR}"]')
    return "\n".join(lines) + "\n"


def hook_json(hook_path: str, api_socket: str, uid_range: tuple[int, int]) -> str:
    """The OCI hook definition (oci-hooks(5), schema 1.0.0) for every container."""
    return (
        json.dumps(
            {
                "version": "1.0.0",
                "hook": {
                    "path": hook_path,
                    "args": [
                        "mtgpu-podman-hook",
                        "--api",
                        api_socket,
                        "--uid-range",
                        f"{uid_range[0]}-{uid_range[1]}",
                        "MTGPU-container-policy:see-~/.mtgpu/podman-policy.log",
                    ],
                },
                "when": {"always": True},
                "stages": ["precreate"],
            },
            indent=2,
        )
        + "\n"
    )


def assess(facts: HostFacts, options: Options, hook_path: str) -> list[Finding]:
    """Every need of rootless podman on this host, as findings."""
    f: list[Finding] = []
    if facts.podman:
        f.append(Finding("podman", True, f"{facts.podman} {facts.podman_version}".strip()))
    else:
        f.append(
            Finding(
                "podman",
                False,
                "not installed; apt-get install podman (Debian, Ubuntu) or dnf install podman",
            )
        )
    f.append(
        Finding(
            "newuidmap",
            facts.newuidmap_setuid,
            "setuid newuidmap/newgidmap present"
            if facts.newuidmap_setuid
            else "newuidmap/newgidmap missing or not setuid; apt-get install uidmap",
        )
    )
    f.append(
        Finding(
            "network helper",
            bool(facts.network_helper),
            facts.network_helper or "neither slirp4netns nor pasta is installed; apt-get install slirp4netns",
        )
    )
    f.append(
        Finding(
            "user namespaces",
            facts.userns_max > 0,
            f"user.max_user_namespaces = {facts.userns_max}"
            + ("" if facts.userns_max > 0 else "; set it above 0 in /etc/sysctl.d"),
        )
    )
    if options.containers.prepull:
        f.append(
            Finding(
                "skopeo",
                facts.skopeo,
                "present (pre-pulls images)"
                if facts.skopeo
                else "CONTAINERS.prepull needs skopeo; apt-get install skopeo",
            )
        )
    if not facts.cgroup_unified:
        ok = facts.runc
        f.append(
            Finding(
                "runtime",
                ok,
                "hybrid/v1 cgroups: runc is used (crun refuses them)"
                if ok
                else "hybrid/v1 cgroups need runc (crun refuses them); apt-get install runc",
            )
        )
    else:
        f.append(
            Finding(
                "runtime",
                facts.runc or facts.crun,
                "crun or runc present"
                if facts.runc or facts.crun
                else "no OCI runtime; apt-get install crun",
            )
        )
    want = dropin_text(facts)
    f.append(
        Finding(
            "containers.conf",
            facts.dropin == want,
            f"{DROPIN} is current"
            if facts.dropin == want
            else f"{DROPIN} must say: " + "; ".join(want.splitlines()[2:]),
            "dropin",
        )
    )
    want_hook = hook_json(hook_path, options.api_socket, options.tenant_uid_range)
    f.append(
        Finding(
            "policy hook",
            facts.hook == want_hook,
            f"{HOOK_FILE} is installed"
            if facts.hook == want_hook
            else f"{HOOK_FILE} must run {hook_path} before each container is created",
            "hook",
        )
    )
    if facts.tun_mode is None:
        f.append(Finding("/dev/net/tun", False, "missing; load the tun module (modprobe tun)"))
    else:
        ok = facts.tun_mode & 0o666 == 0o666
        f.append(
            Finding(
                "/dev/net/tun",
                ok,
                f"mode {facts.tun_mode:04o}" + ("" if ok else "; rootless networking needs 0666"),
                "" if ok else "tun",
            )
        )
    f.append(
        Finding(
            "/run/user",
            facts.run_user,
            "present; each tenant's XDG_RUNTIME_DIR is made there on first use"
            if facts.run_user
            else "missing",
            "" if facts.run_user else "run_user",
        )
    )
    bad = []
    for name, uid in sorted(facts.tenants.items()):
        try:
            lo, hi = subid_range(uid)
        except Exception:  # noqa: BLE001 - a UID without a derived range is reported below
            bad.append(f"{name} (UID {uid} has no derivable range)")
            continue
        want_range = (lo, hi - lo + 1)
        if want_range not in facts.subuid.get(uid, []) or want_range not in facts.subgid.get(uid, []):
            bad.append(name)
    f.append(
        Finding(
            "subuid/subgid",
            not bad,
            f"{len(facts.tenants)} tenants have their derived ranges"
            if not bad
            else f"missing ranges for {', '.join(bad)}",
            "" if not bad else "subids",
        )
    )
    if facts.nvidia:
        f.append(
            Finding(
                "NVIDIA CDI",
                facts.cdi_nvidia,
                "a CDI spec for nvidia.com/gpu exists"
                if facts.cdi_nvidia
                else "no CDI spec: run nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
                "" if facts.cdi_nvidia or not facts.nvidia_ctk else "cdi",
            )
        )
    f.append(store_finding(options.containers.storage, options.tenant_home_root, facts.home_fs))
    return f


def store_finding(setting: str, home_root: str, home_fs: str) -> Finding:
    """Where tenants' container stores are, and whether podman can keep them there.

    >>> print(store_finding("auto", "/home", "nfs4").line())
    ok       container stores: on this member's disk, under /var/lib/mtgpu-containers (TENANT_HOME_ROOT /home is on nfs4)
    >>> store_finding("home", "/home", "nfs4").ok
    False
    >>> store_finding("auto", "/home", "ext4").detail
    'in the homes (~/.local/share/containers; TENANT_HOME_ROOT /home is on ext4)'
    """
    from mtgpu.workspaces.storage import NETWORK_FILESYSTEMS, root_for

    where = f"TENANT_HOME_ROOT {home_root} is on {home_fs or 'an unknown filesystem'}"
    if setting == "home" and home_fs in NETWORK_FILESYSTEMS:
        return Finding(
            "container stores",
            False,
            f"CONTAINERS.storage is home, but {where}, "
            "where rootless podman cannot keep its storage; set CONTAINERS.storage "
            "to auto or to a directory on this member's disk",
        )
    root = root_for(setting, home_fs)
    if root:
        return Finding("container stores", True, f"on this member's disk, under {root} ({where})")
    return Finding("container stores", True, f"in the homes (~/.local/share/containers; {where})")


def _subids(path: str, names: dict[str, int]) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        uid = names.get(parts[0], int(parts[0]) if parts[0].isdigit() else -1)
        out.setdefault(uid, []).append((int(parts[1]), int(parts[2])))
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def gather(options: Options) -> HostFacts:
    """Read this host's facts."""
    podman = shutil.which("podman", path="/usr/local/bin:/usr/bin:/bin")
    version = ""
    if podman:
        try:
            version = run([podman, "--version"], timeout=30).stdout.strip().rsplit(" ", 1)[-1]
        except CommandError:
            version = "(does not run)"
    setuid = all(
        os.path.exists(p) and bool(os.stat(p).st_mode & stat.S_ISUID) or _has_caps(p)
        for p in ("/usr/bin/newuidmap", "/usr/bin/newgidmap")
    )
    try:
        tun_mode: int | None = stat.S_IMODE(os.stat("/dev/net/tun").st_mode)
    except OSError:
        tun_mode = None
    lo, hi = options.tenant_uid_range
    tenants = {
        p.pw_name: p.pw_uid
        for p in pwd.getpwall()
        if lo <= p.pw_uid <= hi or "MTGPU tenant" in (p.pw_gecos or "")
    }
    try:
        userns = int(_read("/proc/sys/user/max_user_namespaces").strip() or "1")
    except ValueError:
        userns = 1
    from mtgpu.workspaces import cdi

    nvidia = os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")
    names = cdi.device_names(cdi.load_specs()) if nvidia else set()
    return HostFacts(
        podman=podman,
        podman_version=version,
        newuidmap_setuid=setuid,
        network_helper=shutil.which("slirp4netns") or shutil.which("pasta"),
        skopeo=bool(shutil.which("skopeo")),
        runc=bool(shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")),
        crun=bool(shutil.which("crun")),
        cgroup_unified=os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
        systemd=os.path.isdir("/run/systemd/system"),
        tun_mode=tun_mode,
        run_user=os.path.isdir("/run/user"),
        userns_max=userns,
        subuid=_subids("/etc/subuid", tenants),
        subgid=_subids("/etc/subgid", tenants),
        tenants=tenants,
        dropin=_read(DROPIN),
        hook=_read(HOOK_FILE),
        nvidia=nvidia,
        cdi_nvidia=any(n.startswith("nvidia.com/gpu=") for n in names),
        nvidia_ctk=bool(shutil.which("nvidia-ctk")),
        home_fs=_home_fs(options.tenant_home_root),
    )


def _home_fs(home_root: str) -> str:
    from mtgpu.workspaces.storage import filesystem_of

    try:
        return filesystem_of(home_root)[1]
    except OSError:
        return ""


def _has_caps(path: str) -> bool:
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False


def hook_path() -> str:
    """The hook program beside this interpreter (the installed virtualenv)."""
    return str(Path(sys.executable).parent / "mtgpu-podman-hook")


def fix(findings: list[Finding], facts: HostFacts, options: Options, hook: str) -> list[str]:
    """Carry out every fixable finding; return what was done."""
    done = []
    for f in findings:
        if f.ok or not f.fix:
            continue
        if f.fix == "dropin":
            Path(DROPIN).parent.mkdir(parents=True, exist_ok=True)
            Path(DROPIN).write_text(dropin_text(facts))
            os.chmod(DROPIN, 0o644)
            done.append(f"wrote {DROPIN}")
        elif f.fix == "hook":
            Path(HOOKS_DIR).mkdir(parents=True, exist_ok=True)
            Path(HOOK_FILE).write_text(hook_json(hook, options.api_socket, options.tenant_uid_range))
            os.chmod(HOOK_FILE, 0o644)
            done.append(f"installed {HOOK_FILE}")
        elif f.fix == "tun":
            os.chmod("/dev/net/tun", 0o666)
            done.append(
                "made /dev/net/tun mode 0666 (udev may reset it at boot: the daemon "
                "sets it again when it starts with CONTAINERS.enabled)"
            )
        elif f.fix == "run_user":
            Path("/run/user").mkdir(mode=0o755, parents=True, exist_ok=True)
            done.append("made /run/user")
        elif f.fix == "subids":
            for name, uid in sorted(facts.tenants.items()):
                lo, hi = subid_range(uid)
                if (lo, hi - lo + 1) in facts.subuid.get(uid, []) and (lo, hi - lo + 1) in facts.subgid.get(
                    uid, []
                ):
                    continue
                args = []
                if (lo, hi - lo + 1) not in facts.subuid.get(uid, []):
                    args += ["--add-subuids", f"{lo}-{hi}"]
                if (lo, hi - lo + 1) not in facts.subgid.get(uid, []):
                    args += ["--add-subgids", f"{lo}-{hi}"]
                run(["usermod", *args, name])
                done.append(f"gave {name} subordinate IDs {lo}-{hi}")
        elif f.fix == "cdi":
            Path("/etc/cdi").mkdir(parents=True, exist_ok=True)
            run(["nvidia-ctk", "cdi", "generate", "--output=/etc/cdi/nvidia.yaml"], timeout=120)
            done.append("generated /etc/cdi/nvidia.yaml")
    return done


def check(options: Options, apply: bool = False) -> tuple[list[Finding], list[str]]:
    """Assess this host (and fix it when ``apply``); the findings after any fixes."""
    hook = hook_path()
    facts = gather(options)
    findings = assess(facts, options, hook)
    done: list[str] = []
    if apply:
        done = fix(findings, facts, options, hook)
        if done:
            facts = gather(options)
            findings = assess(facts, options, hook)
    return findings, done


def tun_needs_fix() -> bool:
    try:
        return stat.S_IMODE(os.stat("/dev/net/tun").st_mode) & 0o666 != 0o666
    except OSError:
        return False
