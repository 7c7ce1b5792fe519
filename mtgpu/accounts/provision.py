"""Tenant OS accounts: found, or created on first login with the registry's UID.

:class:`LocalAccounts` is the provisioner for hosts with a local ``/etc/passwd``. The
account-creation commands are configurable argv templates (logged quoted by
:func:`mtgpu.proc.run`), and a failure is raised with the captured output.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from mtgpu.accounts.homeremove import foreign_owner, owner_name
from mtgpu.errors import AccountError, CommandError, UidConflictError
from mtgpu.proc import run

log = logging.getLogger("mtgpu.accounts")

SUBID_BASE = 1 << 31
SUBID_COUNT = 65536
SUBID_UID_MIN = 1000
# The highest UID whose derived subordinate range still fits below 2**32.
SUBID_UID_MAX = SUBID_UID_MIN + ((1 << 32) - SUBID_BASE) // SUBID_COUNT - 1


def subid_range(uid: int) -> tuple[int, int]:
    """The ``/etc/subuid`` range derived from ``uid``: the same on every host.

    It lies above systemd's container range (524288-1879048191) and above the ranges
    useradd hands out from 100000 upwards.

    >>> subid_range(20000)
    (3392143360, 3392208895)
    """
    if not SUBID_UID_MIN <= uid <= SUBID_UID_MAX:
        raise AccountError(
            f"UID {uid} has no subordinate ID range; tenant UIDs must lie "
            f"between {SUBID_UID_MIN} and {SUBID_UID_MAX}"
        )
    start = SUBID_BASE + (uid - SUBID_UID_MIN) * SUBID_COUNT
    return start, start + SUBID_COUNT - 1


@dataclass(frozen=True)
class Account:
    """An OS account a session runs as."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str
    groups: tuple[int, ...]
    managed: bool  # created by MTGPU (True) or a pre-existing local account (False)


#: Group lists by (name, gid), reused for a few seconds: every job start asks, and
#: getgrouplist reads the whole group database each time.
_GROUPS_TTL = 5.0
_groups: dict[tuple[str, int], tuple[float, tuple[int, ...]]] = {}


def _account(pw: pwd.struct_passwd, managed: bool) -> Account:
    key, now = (pw.pw_name, pw.pw_gid), time.monotonic()
    hit = _groups.get(key)
    if hit is not None and now - hit[0] < _GROUPS_TTL:
        groups = hit[1]
    else:
        try:
            groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            groups = (pw.pw_gid,)
        if len(_groups) > 10_000:
            _groups.clear()
        _groups[key] = (now, groups)
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell or "/bin/sh", groups, managed)


class AccountProvisioner:
    """Finds and creates tenant accounts. Subclasses implement :meth:`create`."""

    def existing(self, name: str) -> Account | None:
        """The local account ``name`` if it exists, as an unmanaged account."""
        try:
            return _account(pwd.getpwnam(name), managed=False)
        except KeyError:
            return None

    def local_uids(self) -> list[int]:
        """UIDs taken on this host, so the registry does not hand one of them out."""
        return [p.pw_uid for p in pwd.getpwall()]

    def ensure(self, name: str, uid: int) -> Account:
        """Return the account ``name`` with ``uid``, creating it if this host lacks it."""
        raise NotImplementedError

    def create(self, name: str, uid: int) -> None:
        raise NotImplementedError


class LocalAccounts(AccountProvisioner):
    """Creates accounts with ``groupadd``/``useradd``/``usermod`` in the local files."""

    groupadd_argv: tuple[str, ...] = ("groupadd", "-g", "{uid}", "{name}")
    useradd_argv: tuple[str, ...] = (
        "useradd",
        "-u",
        "{uid}",
        "-g",
        "{uid}",
        "-d",
        "{home}",
        "-s",
        "{shell}",
        "-c",
        "MTGPU tenant",
        "-K",
        "SUB_UID_COUNT=0",
        "-K",
        "SUB_GID_COUNT=0",
        "{home_flag}",
        "{name}",
    )
    subid_argv: tuple[str, ...] = (
        "usermod",
        "--add-subuids",
        "{sub_lo}-{sub_hi}",
        "--add-subgids",
        "{sub_lo}-{sub_hi}",
        "{name}",
    )

    def __init__(
        self, home_root: str, shell: str = "/bin/bash", lock_path: str = "/run/lock/mtgpu-accounts.lock"
    ) -> None:
        self.home_root = home_root
        self.shell = shell if Path(shell).exists() else "/bin/sh"
        Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
        # One lock across threads and across daemons that share /etc.
        self._file_lock = FileLock(lock_path)
        self._thread_lock = threading.Lock()
        # Called with each home made or repaired (the daemon adds ~/datasets this way).
        self.home_hooks: list[Callable[[Account], None]] = []

    def ensure(self, name: str, uid: int) -> Account:
        # Every login and job start asks; almost always the account is there as it
        # should be, which needs no lock: a directory of the tenant's, mode 0700.
        try:
            pw = pwd.getpwnam(name)
            st = os.lstat(pw.pw_dir)
            if (
                pw.pw_uid == uid
                and stat.S_ISDIR(st.st_mode)
                and st.st_uid == uid
                and st.st_mode & 0o777 == 0o700
            ):
                return _account(pw, managed=True)
        except (KeyError, OSError):
            pass
        with self._thread_lock, self._file_lock:
            acct = self._check(name, uid)
            if acct is None:
                self.create(name, uid)
                acct = self._check(name, uid)
                if acct is None:  # pragma: no cover - useradd said yes but passwd says no
                    raise AccountError(f"account {name!r} was created but cannot be found")
                log.info("created account %s uid=%d home=%s", name, uid, acct.home)
            self._ensure_home(acct)
            for hook in self.home_hooks:
                hook(acct)
            return acct

    def _check(self, name: str, uid: int) -> Account | None:
        """The managed account if it exists and matches; None if absent; else refuse."""
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            pw = None
        if pw is not None:
            if pw.pw_uid != uid:
                raise UidConflictError(
                    f"the local account {name!r} has UID {pw.pw_uid}, but the MTGPU registry "
                    f"gave {name!r} UID {uid}; refusing to log in. An admin must rename or "
                    "remove one of them"
                )
            return _account(pw, managed=True)
        try:
            other = pwd.getpwuid(uid)
        except KeyError:
            other = None
        if other is not None:
            raise UidConflictError(
                f"UID {uid}, which the MTGPU registry gave {name!r}, already belongs to the "
                f"local account {other.pw_name!r} on this host; refusing to share it. An admin "
                "must move that account or narrow TENANT_UID_RANGE"
            )
        try:
            g = grp.getgrgid(uid)
            if g.gr_name != name:
                raise UidConflictError(
                    f"GID {uid}, which {name!r} needs, belongs to the local group {g.gr_name!r}; "
                    "refusing to share it"
                )
        except KeyError:
            pass
        return None

    def create(self, name: str, uid: int) -> None:
        home = str(Path(self.home_root) / name)
        root = Path(self.home_root)
        if not root.exists():
            root.mkdir(parents=True, mode=0o755)
        owner = foreign_owner(home, uid)
        if owner:
            raise AccountError(
                f"cannot create the account {name!r}: its home {home} already "
                f"exists and belongs to {owner}, not to UID {uid}; refusing to "
                "make the account on another's directory. An admin must move "
                "that directory away or give the tenant another name"
            )
        sub_lo, sub_hi = subid_range(uid)
        fields = {
            "uid": str(uid),
            "name": name,
            "home": home,
            "shell": self.shell,
            "home_flag": "-M" if Path(home).exists() else "-m",
            "sub_lo": str(sub_lo),
            "sub_hi": str(sub_hi),
        }
        try:
            try:
                grp.getgrnam(name)
            except KeyError:
                run([a.format(**fields) for a in self.groupadd_argv])
            run([a.format(**fields) for a in self.useradd_argv])
            run([a.format(**fields) for a in self.subid_argv])
        except CommandError as exc:
            raise AccountError(f"cannot create the account {name!r}: {exc}") from exc

    def _ensure_home(self, acct: Account) -> None:
        home = Path(acct.home)
        if home.is_symlink():
            raise AccountError(
                f"the home {home} of {acct.name!r} is a symbolic link; refusing "
                "to use it. An admin must replace it with a directory"
            )
        if not home.exists():
            home.mkdir(mode=0o700)
            os.chown(home, acct.uid, acct.gid)
        st = home.lstat()
        if st.st_uid != acct.uid:
            raise AccountError(
                f"the home {home} belongs to {owner_name(st.st_uid)}, not to "
                f"{acct.name!r} (UID {acct.uid}); refusing to use it. It may be "
                "another account's home: an admin must check whose it is before "
                "changing anything"
            )
        if st.st_mode & 0o777 != 0o700:
            os.chmod(home, 0o700)
