"""WSL2 hosts: lock the Windows drives away from tenants, start at boot, find NVIDIA's driver.

Every path is read and written under a host root: ``/`` on a real host, a temporary
directory standing in for it in tests (with its own ``proc/sys/kernel/osrelease``,
``proc/mounts``, ``etc/wsl.conf`` and ``mnt/c``). Commands that act on real mounts
(``umount``/``mount``) run only when the root is ``/``.

``/etc/wsl.conf`` is edited line by line, so the admin's comments and other
settings stay as they were; the first edit keeps the original beside it as
``/etc/wsl.conf.mtgpu-orig``. Standard library only: it runs inside mtgpu-setup.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mtgpu.proc import run

WSL_CONF = "etc/wsl.conf"
BACKUP_SUFFIX = ".mtgpu-orig"
WSL_LIB = "usr/lib/wsl/lib"
#: Only the owner of a drive's files (the WSL user WSL mounts them for) may enter.
LOCK_BITS = 0o077


def wsl_version(root: Path) -> int | None:
    """2 on a WSL2 kernel, 1 on WSL1, None elsewhere (read from the kernel's release)."""
    for rel in ("proc/sys/kernel/osrelease", "proc/version"):
        try:
            text = (root / rel).read_text().lower()
        except OSError:
            continue
        if "microsoft-standard-wsl2" in text or ("microsoft" in text and "wsl2" in text):
            return 2
        if "microsoft" in text:
            return 1
    return None


# ------------------------------------------------------------- wsl.conf lines

_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=\s*(.*?)\s*$")


def _unquote(v: str) -> str:
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


def ini_get(text: str, section: str, key: str) -> str | None:
    """The value of ``key`` in ``[section]`` (the last one wins, as in WSL), unquoted.

    >>> ini_get('[boot]\\n# a comment\\nsystemd = true\\n', 'boot', 'systemd')
    'true'
    """
    cur, value = None, None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            cur = m.group(1).strip().lower()
            continue
        m = _KEY.match(line)
        if cur == section.lower() and m and m.group(1).lower() == key.lower():
            value = _unquote(m.group(2))
    return value


def ini_set(text: str, section: str, key: str, value: str) -> str:
    """``text`` with ``key = value`` in ``[section]``; every other line is kept.

    >>> print(ini_set('# mine\\n[automount]\\nenabled = true\\n', 'automount', 'options', '"umask=077"'), end='')
    # mine
    [automount]
    enabled = true
    options = "umask=077"
    """
    lines = text.splitlines()
    new = f"{key} = {value}"
    cur, header, last, found = None, None, None, None
    for i, line in enumerate(lines):
        m = _SECTION.match(line)
        if m:
            cur = m.group(1).strip().lower()
            if cur == section.lower() and header is None:
                header = last = i
            continue
        if cur == section.lower():
            k = _KEY.match(line)
            if k and k.group(1).lower() == key.lower():
                found = i
            if line.strip() and header is not None:
                last = max(last or i, i)
    if found is not None:
        lines[found] = new
    elif header is not None:
        lines.insert((last if last is not None else header) + 1, new)
    else:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [f"[{section}]", new]
    return "\n".join(lines) + "\n"


def locked_options(current: str | None) -> str:
    """Automount ``options`` with the permission masks closed to everyone but the owner.

    >>> locked_options('metadata,uid=1000,umask=022,fmask=011')
    'metadata,uid=1000,fmask=077,umask=077'
    >>> locked_options(None)
    'umask=077'
    """
    out = []
    for part in (p.strip() for p in (current or "").split(",")):
        if not part or part.startswith("umask="):
            continue
        name, _, val = part.partition("=")
        if name in ("fmask", "dmask"):
            try:
                part = f"{name}={int(val, 8) | LOCK_BITS:03o}"
            except ValueError:
                continue  # drvfs would refuse it anyway; ours replaces it
        out.append(part)
    return ",".join(out + [f"umask={LOCK_BITS:03o}"])


# ---------------------------------------------------------------- the drives


@dataclass(frozen=True)
class Drive:
    """A Windows drive mounted into WSL (drvfs over 9p)."""

    device: str  # C:\
    mount_point: str  # /mnt/c
    options: str


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def windows_drives(root: Path) -> list[Drive]:
    """The Windows drives mounted now, from ``/proc/mounts``."""
    try:
        text = (root / "proc/mounts").read_text()
    except OSError:
        return []
    drives = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and (f[2] == "drvfs" or (f[2] == "9p" and "aname=drvfs" in f[3])):
            drives.append(Drive(_unescape(f[0]), _unescape(f[1]), f[3]))
    return drives


def _open_to_others(path: Path) -> bool:
    return bool(os.stat(path).st_mode & LOCK_BITS)


def _remount_locked(d: Drive) -> str | None:
    """Mount the drive again with the locked options; None, or why it could not."""
    opts = ["uid=" + m.group(1) for m in [re.search(r"uid=(\d+)", d.options)] if m]
    opts += ["gid=" + m.group(1) for m in [re.search(r"gid=(\d+)", d.options)] if m]
    letter = d.device.rstrip("\\/")
    r = run(["umount", d.mount_point], check=False)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip() or "umount failed"
    r = run(
        ["mount", "-t", "drvfs", "-o", locked_options(",".join(opts)), letter, d.mount_point], check=False
    )
    return None if r.returncode == 0 else ((r.stderr or r.stdout).strip() or "mount failed")


# --------------------------------------------------------------- the whole step


@dataclass
class WslReport:
    """What the WSL step did, what it could not do, and how to undo it."""

    done: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    undo: list[str] = field(default_factory=list)
    #: True when MTGPU is to start through systemd (enable the unit even while
    #: systemd is not running yet).
    boot_systemd: bool = False


def prepare(
    root: Path, *, lock_drives: bool, boot: str, start_command: str, systemd_running: bool, config: str
) -> WslReport:
    """Configure a WSL2 host under ``root``: drives, start at boot, NVIDIA's driver.

    ``boot`` is ``auto`` (systemd where it runs or is switched on in wsl.conf, else a
    ``[boot] command``), ``command`` or ``systemd``.
    """
    rep = WslReport()
    conf = root / WSL_CONF
    shown = "/" + WSL_CONF
    backup = conf.with_name(conf.name + BACKUP_SUFFIX)
    existed = conf.exists()
    before = conf.read_text() if existed else ""
    text = before

    if lock_drives:
        current = ini_get(text, "automount", "options")
        wanted = locked_options(current)
        if current != wanted:
            text = ini_set(text, "automount", "options", f'"{wanted}"')
            rep.done.append(
                f'{shown}: [automount] options = "{wanted}" (was '
                f"{repr(current) if current is not None else 'unset'}): drives WSL "
                "mounts from now on are closed to tenants"
            )
        else:
            rep.done.append(f"{shown}: [automount] options already lock the drives ({wanted})")
        for d in windows_drives(root):
            path = root / d.mount_point.lstrip("/")
            err = None
            try:
                os.chmod(path, 0o700)
            except OSError as exc:
                err = exc.strerror
            try:
                still_open = _open_to_others(path)
            except OSError as exc:
                rep.warnings.append(f"{d.mount_point}: cannot check it ({exc.strerror})")
                continue
            if still_open and str(root) == "/":
                err = _remount_locked(d) or err
                still_open = _open_to_others(path)
            if still_open:
                rep.warnings.append(
                    f"{d.mount_point} ({d.device}) is still open to tenants ({err or 'drvfs ignored chmod'}); "
                    "it is locked from the next WSL start: run `wsl --shutdown` in Windows, then open WSL again"
                )
            else:
                rep.done.append(
                    f"{d.mount_point} ({d.device}): locked now (mode 0700; only its owner, "
                    "the WSL user, may enter)"
                )
        restore = (
            f"restore {shown} from {shown}{BACKUP_SUFFIX}"
            if existed or backup.exists()
            else f"delete {shown} (there was none)"
        )
        rep.undo.append(
            f"drives: {restore}, or remove umask=077 from [automount] options; then run "
            "`wsl --shutdown` in Windows and open WSL again (`chmod 755 /mnt/c` reopens a "
            f"mounted drive at once). Set WSL_LOCK_DRIVES: false in {config} so that "
            "install leaves the drives alone"
        )
    else:
        rep.done.append(
            f"WSL_LOCK_DRIVES is false: the Windows drives are left as they are ({shown} "
            "[automount] untouched)"
        )

    systemd_set = (ini_get(text, "boot", "systemd") or "").lower() == "true"
    if boot == "systemd" or (boot == "auto" and (systemd_running or systemd_set)):
        rep.boot_systemd = True
        if not systemd_set:
            text = ini_set(text, "boot", "systemd", "true")
            rep.done.append(f"{shown}: [boot] systemd = true")
        if systemd_running:
            rep.done.append(
                "start at boot: systemd runs in this WSL distribution; mtgpu.service starts with it"
            )
        else:
            rep.warnings.append(
                "start at boot: [boot] systemd = true takes effect at the next WSL "
                "start (`wsl --shutdown` in Windows, then open WSL); until then MTGPU "
                "runs in the background"
            )
        rep.undo.append(
            f"boot: `systemctl disable mtgpu`; remove [boot] systemd = true from {shown} "
            "if nothing else needs it"
        )
    else:
        current = ini_get(text, "boot", "command")
        if current is None or current == start_command:
            if current != start_command:
                text = ini_set(text, "boot", "command", f'"{start_command}"')
            rep.done.append(
                f'start at boot: {shown} [boot] command = "{start_command}" (WSL runs '
                "it as root when the distribution starts)"
            )
            rep.undo.append(f"boot: remove the [boot] command line from {shown}")
        else:
            rep.warnings.append(
                f'start at boot: {shown} already has [boot] command = "{current}" and '
                f"WSL runs only one; add `{start_command}` to it (or pass --wsl-boot "
                "systemd to start MTGPU through systemd)"
            )

    if text != before:
        conf.parent.mkdir(parents=True, exist_ok=True)
        if existed and not backup.exists():
            shutil.copy2(conf, backup)
            rep.done.append(f"kept the original as {shown}{BACKUP_SUFFIX}")
        tmp = conf.with_name(conf.name + ".mtgpu-tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, conf)

    lib = root / WSL_LIB
    nvml = lib / "libnvidia-ml.so.1"
    if nvml.exists():
        ld = root / "etc/ld.so.conf.d"
        listed = any(
            "/usr/lib/wsl/lib" in p.read_text(errors="replace")
            for p in (sorted(ld.glob("*.conf")) if ld.is_dir() else [])
        )
        if listed:
            rep.done.append(
                "NVIDIA: found NVIDIA's WSL driver (/usr/lib/wsl/lib/libnvidia-ml.so.1); NVML works"
            )
        else:
            rep.warnings.append(
                "NVIDIA: /usr/lib/wsl/lib/libnvidia-ml.so.1 exists but is not on the "
                "loader's path: put /usr/lib/wsl/lib in /etc/ld.so.conf.d/ld.wsl.conf and "
                "run ldconfig (WSL writes that file itself unless "
                "[automount] ldconfig = false)"
            )
    elif lib.is_dir():
        rep.warnings.append(
            "NVIDIA: /usr/lib/wsl/lib has no libnvidia-ml.so.1: update the NVIDIA "
            "driver in Windows; until then MTGPU sees no NVIDIA GPU"
        )
    else:
        rep.warnings.append(
            "NVIDIA: no /usr/lib/wsl/lib, so no NVIDIA GPU is visible here. Install "
            "NVIDIA's Windows driver (it brings the WSL libraries); never install a "
            "Linux NVIDIA driver inside WSL. CPU jobs and other probes still work"
        )
    return rep
