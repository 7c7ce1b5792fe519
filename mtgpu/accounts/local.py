"""Which OS accounts MTGPU lets in that are not registry users: ``LOCAL_ACCOUNTS``.

An account in ``/etc/passwd`` that is not a current registry user is one of:

- a **retired tenant**: MTGPU made it (its ``MTGPU tenant`` comment) or its UID is
  one the registry gave out (``used_uids``). The tenant was removed; the account is
  refused whatever keys its ``~/.ssh/authorized_keys`` lists, on SSH and on the API
  socket;
- a **local account** an administrator made. ``LOCAL_ACCOUNTS`` decides:
  ``allow`` (every one, with its own ``authorized_keys``: the behaviour of hosts
  from before the key), ``admins`` (only those named in ``ADMINS``, or granted this
  cluster with ``mtcode-admin grant``) or ``deny`` (none).

Whatever the policy, a local account an ``mtcode-admin revoke`` took this cluster
from is refused here, and an expired account (``usermod --expiredate``) or one whose
shell is ``nologin``/``false`` is refused as OpenSSH would.

:func:`refusal` is pure (facts in, reason out) so every case is a table test.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from mtgpu.accounts.retention import MANAGED_MARK

POLICIES = ("allow", "admins", "deny")
NOLOGIN_SHELLS = ("nologin", "false")


@dataclass(frozen=True)
class LocalFacts:
    """What this member knows of one OS account that is not a current registry user."""

    name: str
    uid: int
    gecos: str
    shell: str
    expired: bool  # the shadow file's expiry date has passed
    retired_uid: bool  # the registry gave this UID to a tenant once
    admin: bool  # named in ADMINS
    grant: bool | None  # this cluster granted (True), revoked (False), never set (None)


def refusal(f: LocalFacts, policy: str, cluster: str) -> str | None:
    """Why ``f``'s account may not use MTGPU here, or None when it may.

    >>> ok = LocalFacts("olga", 1001, "", "/bin/bash", False, False, False, None)
    >>> refusal(ok, "allow", "alpha") is None
    True
    >>> refusal(ok, "admins", "alpha")
    "the local account 'olga' may not use MTGPU on this host (LOCAL_ACCOUNTS is admins: only accounts named in ADMINS or granted the cluster 'alpha' with `mtcode-admin grant`)"
    >>> from dataclasses import replace
    >>> refusal(replace(ok, retired_uid=True), "allow", "alpha")
    "'olga' was removed from MTGPU (UID 1001 was a tenant's); an admin must add the user again"
    >>> refusal(replace(ok, grant=True), "admins", "alpha") is None
    True
    """
    if f.retired_uid or MANAGED_MARK in f.gecos:
        return (
            f"{f.name!r} was removed from MTGPU (UID {f.uid} was a tenant's); an admin "
            "must add the user again"
        )
    if f.expired:
        return f"the account {f.name!r} has expired on this host (its shadow expiry date)"
    if os.path.basename(f.shell) in NOLOGIN_SHELLS:
        return f"the account {f.name!r} has the login shell {f.shell}, which refuses logins"
    if policy == "deny":
        return (
            f"the local account {f.name!r} may not use MTGPU on this host (LOCAL_ACCOUNTS "
            "is deny); an admin can register the user (`mtgpu-admin user add`)"
        )
    if f.grant is False:
        return (
            f"the local account {f.name!r} is not granted the cluster {cluster!r}; ask an "
            f"admin of the cluster to run `mtcode-admin grant {f.name} {cluster}`"
        )
    if policy == "admins" and not (f.admin or f.grant):
        return (
            f"the local account {f.name!r} may not use MTGPU on this host (LOCAL_ACCOUNTS "
            f"is admins: only accounts named in ADMINS or granted the cluster {cluster!r} "
            "with `mtcode-admin grant`)"
        )
    return None


def shadow_expired(name: str, shadow: str = "/etc/shadow", now: float | None = None) -> bool:
    """Whether ``name``'s shadow entry has an expiry date (field 8, in days since the
    epoch) that has passed. A missing file or entry is not expired."""
    today = int((time.time() if now is None else now) // 86400)
    try:
        with open(shadow, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split(":")
                if len(parts) >= 8 and parts[0] == name:
                    return parts[7].strip().isdigit() and int(parts[7]) <= today
    except OSError:
        return False
    return False
