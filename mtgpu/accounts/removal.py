"""A removed tenant's OS account on one member: locked, and every process ended.

``mtgpu-admin user remove`` drops the registry record first (every member then
refuses the name and its UID at authentication), cancels the tenant's jobs, then asks
each member to stop its workspaces and call :func:`disable`:

- the account is locked as OpenSSH and PAM understand it: password disabled
  (``usermod --lock``), expired (``--expiredate 1``) and given a ``nologin`` shell,
  so an OpenSSH in front of MTGPU, ``su`` and cron refuse it too. The home and the
  UID stay: files on shared storage keep their owner, and the UID is never given out
  again;
- every process running as the tenant's UID or one of its subordinate UIDs (rootless
  containers) is ended with SIGKILL through a pidfd: each PID is pinned with
  ``pidfd_open`` before its owner is checked, so a recycled PID is never signalled.
  Rounds repeat until none is left, so a process forking meanwhile is caught.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import psutil

from mtgpu.accounts.provision import SUBID_UID_MAX, SUBID_UID_MIN, subid_range
from mtgpu.accounts.retention import local_account
from mtgpu.errors import AccountError, CommandError
from mtgpu.proc import run

log = logging.getLogger("mtgpu.accounts.removal")

NOLOGIN_PATHS = ("/usr/sbin/nologin", "/sbin/nologin", "/usr/bin/false", "/bin/false")
#: Rounds of ending processes before giving up (a round ends all it found).
MAX_ROUNDS = 50


def nologin_shell() -> str:
    return next((p for p in NOLOGIN_PATHS if Path(p).exists()), "/bin/false")


def lock_os_account(name: str, uid: int) -> str:
    """Disable the password, expire the account and give it a nologin shell."""
    pw = local_account(name)
    if pw is None or pw.pw_uid != uid:
        return "no account here"
    try:
        run(["usermod", "--lock", "--expiredate", "1", "--shell", nologin_shell(), name])
    except CommandError as exc:
        raise AccountError(f"cannot lock the account {name!r}: {exc}") from exc
    return "locked"


def _owned_uids(uid: int) -> tuple[int, range | None]:
    if SUBID_UID_MIN <= uid <= SUBID_UID_MAX:
        lo, hi = subid_range(uid)
        return uid, range(lo, hi + 1)
    return uid, None


def _owner_matches(pid: int, uid: int, sub: range | None) -> bool:
    try:
        uids = psutil.Process(pid).uids()
    except psutil.Error:
        return False
    return any(u == uid or (sub is not None and u in sub) for u in uids)


def processes_of(uid: int) -> list[int]:
    """PIDs running as ``uid`` (real, effective or saved) or one of its subordinate
    UIDs, on this member."""
    uid, sub = _owned_uids(uid)
    pids = []
    for p in psutil.process_iter(["uids"]):
        uids = p.info.get("uids")
        if uids is not None and any(u == uid or (sub is not None and u in sub) for u in uids):
            pids.append(p.pid)
    return [pid for pid in pids if pid != os.getpid()]


def end_processes(uid: int) -> int:
    """End every process of ``uid`` here (SIGKILL through pidfds); how many were."""
    _, sub = _owned_uids(uid)
    ended = 0
    for _ in range(MAX_ROUNDS):
        pids = processes_of(uid)
        if not pids:
            return ended
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                # Checked after pinning: if the PID was recycled before pidfd_open, the
                # pidfd holds the new process, whose owner is what is checked here.
                if _owner_matches(pid, uid, sub):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    ended += 1
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)
    left = processes_of(uid)
    if left:
        raise AccountError(
            f"UID {uid} still has {len(left)} process(es) after {MAX_ROUNDS} "
            "rounds of SIGKILL; run `mtgpu-admin user remove` again"
        )
    return ended


def disable(name: str, uid: int) -> dict[str, object]:
    """Lock ``name``'s account and end its processes on this member."""
    account = lock_os_account(name, uid)
    ended = end_processes(uid)
    log.info("removed user %s (UID %d): account %s, %d process(es) ended", name, uid, account, ended)
    return {"account": account, "processes_ended": ended}
