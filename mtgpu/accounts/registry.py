"""The user registry: who may log in, with which keys, and the UID each one keeps.

It is replicated state (a PySyncObj consumer). Every method marked ``@replicated``
runs on every member in log order, so it must be deterministic: the caller passes
``now`` and anything read from the local host (``skip_uids``, this cluster's ID).
Records are plain dicts replaced as a whole, so readers on the event-loop thread
always see a complete record.

**Grants.** A record's ``clusters`` lists the clusters the user is granted. A member
lets a user in only when its own cluster is in the list (:meth:`Registry.granted`).
A user added here (``user add``, an invite) is granted this cluster; ``mtcode-admin``
carries records between clusters (:meth:`Registry.import_user`), so a user keeps one
UID everywhere, and revokes grants (:meth:`Registry.set_grant`) without removing the
record: its UID stays reserved, and a refused login can say why.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from pysyncobj import SyncObjConsumer, replicated


def hash_code(code: str) -> str:
    """The stored form of an invite code; the code itself is never kept.

    >>> hash_code("abc") == hash_code("abc") != hash_code("abd")
    True
    """
    return hashlib.sha256(("mtgpu-invite:" + code.strip()).encode()).hexdigest()


def key_id(openssh_line: str) -> str:
    """The identity of a public key line: its type and base64 body, without comment.

    >>> key_id("ssh-ed25519 AAAAC3Nz alice@laptop")
    'ssh-ed25519 AAAAC3Nz'
    """
    parts = openssh_line.split()
    return " ".join(parts[:2])


#: What every refused invite code is told, whatever the reason.
WRONG_CODE = (
    "wrong or expired invite code; check the code and the user name, or ask the "
    "admin who invited you for a new one"
)
#: Keys whose wrong codes an invite remembers; the oldest is forgotten beyond this.
MAX_INVITE_KEYS = 1000


def _failures(inv: dict[str, Any]) -> dict[str, int]:
    """Wrong codes per key id (records from before this counted them in one number)."""
    f = inv.get("failures")
    return dict(f) if isinstance(f, dict) else {}


class Registry(SyncObjConsumer):
    """Users, invites and UID allocation."""

    def __init__(self, uid_range: tuple[int, int]) -> None:
        # Set before the base __init__ so they are not part of the replicated state.
        self.uid_range = uid_range
        super().__init__()
        self.users: dict[str, dict[str, Any]] = {}
        self.invites: dict[str, dict[str, Any]] = {}
        # Every UID ever given out, retired ones included: a UID is never reused.
        self.used_uids: set[int] = set()
        # Clusters granted to local accounts (not registry users) by mtcode-admin:
        # name -> cluster IDs. A name absent here has no grant decision.
        self.local_grants: dict[str, list[str]] = {}

    # ------------------------------------------------------------- reads

    def get(self, name: str) -> dict[str, Any] | None:
        return self.users.get(name)

    def by_uid(self, uid: int) -> dict[str, Any] | None:
        for u in list(self.users.values()):
            if u["uid"] == uid:
                return u
        return None

    def names(self) -> list[str]:
        return sorted(self.users)

    def granted(self, name: str, cluster: str) -> bool:
        """Whether ``name`` is a user granted the cluster ``cluster``."""
        u = self.users.get(name)
        return u is not None and cluster in u.get("clusters", ())

    def local_grant(self, name: str, cluster: str) -> bool | None:
        """Whether mtcode-admin granted (True) or revoked (False) ``cluster`` to the
        local account ``name``; None if it never decided."""
        grants = getattr(self, "local_grants", {}).get(name)  # absent in older snapshots
        return None if grants is None else cluster in grants

    def retired_uid(self, uid: int) -> bool:
        """Whether ``uid`` was given to a tenant who is no longer a user."""
        return uid in self.used_uids and self.by_uid(uid) is None

    def uid_conflict(self, name: str, uid: int) -> str | None:
        """Why ``uid`` cannot be ``name``'s here, or None when it can."""
        holder = self.by_uid(uid)
        if holder is not None and holder["name"] != name:
            return f"UID {uid} belongs to the user {holder['name']!r} here"
        mine = self.users.get(name)
        if mine is not None and mine["uid"] != uid:
            return f"{name!r} already has UID {mine['uid']} here, not {uid}"
        if holder is None and mine is None and uid in self.used_uids:
            return f"UID {uid} belonged to a removed user here and is never given out again"
        return None

    def has_key(self, name: str, openssh_line: str) -> bool:
        u = self.users.get(name)
        return u is not None and key_id(openssh_line) in {key_id(k) for k in u.get("keys", ())}

    def pending_invite(
        self, name: str, now: float, key: str | None = None, max_failures: int | None = None
    ) -> dict[str, Any] | None:
        """The open invite of ``name``; with ``key``, None if that key is barred from
        it by ``max_failures`` wrong codes."""
        inv = self.invites.get(name)
        if not inv or inv["expires"] <= now:
            return None
        if (
            key is not None
            and max_failures is not None
            and _failures(inv).get(key_id(key), 0) >= max_failures
        ):
            return None
        return inv

    # -------------------------------------------------------- internals

    def _allocate_uid(self, skip: Iterable[int], uid_range: tuple[int, int] | None) -> int | None:
        # The range travels in the log entry: every member applies the same allocation
        # even if one member's configuration differs.
        lo, hi = uid_range or self.uid_range
        skip = set(skip)
        for uid in range(lo, hi + 1):
            if uid not in self.used_uids and uid not in skip:
                return uid
        return None

    def _new_user(
        self,
        name: str,
        keys: list[str],
        admin: bool,
        now: float,
        skip_uids: Iterable[int],
        uid_range: tuple[int, int] | None = None,
        clusters: list[str] | None = None,
    ) -> dict[str, Any]:
        uid = self._allocate_uid(skip_uids, uid_range)
        if uid is None:
            return {
                "error": "TENANT_UID_RANGE is exhausted; widen it in the configuration",
                "code": "uid_exhausted",
            }
        self.used_uids.add(uid)
        self.users[name] = {
            "name": name,
            "uid": uid,
            "keys": list(keys),
            "admin": bool(admin),
            "clusters": list(clusters or []),
            "created": now,
            "last_login": None,
        }
        return {"uid": uid, "name": name}

    # ------------------------------------------------------- replicated

    @replicated
    def add_user(
        self,
        name: str,
        keys: list[str],
        admin: bool,
        now: float,
        skip_uids: list[int],
        actor: str = "",
        uid_range: tuple[int, int] | None = None,
        clusters: list[str] | None = None,
    ) -> dict[str, Any]:
        """A new user with a new UID, granted ``clusters`` (this cluster's ID)."""
        if name in self.users:
            return {
                "error": f"user {name!r} already exists; use `user key add` to add a key",
                "code": "exists",
            }
        return self._new_user(name, keys, admin, now, skip_uids, uid_range, clusters)

    @replicated
    def remove_user(self, name: str, now: float, actor: str = "") -> dict[str, Any]:
        u = self.users.pop(name, None)
        self.invites.pop(name, None)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        # The UID stays in used_uids: files on shared storage keep their owner.
        return {"name": name, "uid": u["uid"]}

    @replicated
    def add_key(self, name: str, key: str, now: float, actor: str = "") -> dict[str, Any]:
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        if key_id(key) in {key_id(k) for k in u["keys"]}:
            return {"name": name, "keys": len(u["keys"]), "unchanged": True}
        self.users[name] = {**u, "keys": [*u["keys"], key]}
        return {"name": name, "keys": len(u["keys"]) + 1}

    @replicated
    def remove_key(self, name: str, key: str, now: float, actor: str = "") -> dict[str, Any]:
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        keep = [k for k in u["keys"] if key_id(k) != key_id(key)]
        if len(keep) == len(u["keys"]):
            return {"error": f"user {name!r} has no such key", "code": "not_found"}
        self.users[name] = {**u, "keys": keep}
        return {"name": name, "keys": len(keep)}

    @replicated
    def set_admin(self, name: str, admin: bool, now: float, actor: str = "") -> dict[str, Any]:
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        self.users[name] = {**u, "admin": bool(admin)}
        return {"name": name, "admin": bool(admin)}

    @replicated
    def create_invite(
        self, name: str, code_hash: str, expires: float, admin: bool, now: float, actor: str = ""
    ) -> dict[str, Any]:
        self.invites[name] = {
            "name": name,
            "code_hash": code_hash,
            "expires": expires,
            "admin": bool(admin),
            "failures": {},
            "created": now,
        }
        return {"name": name, "expires": expires}

    @replicated
    def redeem_invite(
        self,
        name: str,
        code_hash: str,
        key: str,
        now: float,
        skip_uids: list[int],
        max_failures: int,
        uid_range: tuple[int, int] | None = None,
        cluster: str | None = None,
    ) -> dict[str, Any]:
        """Bind ``key`` if the code is right; the user is then granted ``cluster``
        (the invite was issued by this cluster's admin).

        Wrong codes are counted per key: ``max_failures`` of them bar that key from
        the invite, and the invite stays open for the invitee's own key. Every
        refusal reads the same, so a stranger learns nothing of the invite (whether
        it exists, expired, or how often others tried).
        """
        inv = self.invites.get(name)
        refused = {"error": WRONG_CODE, "code": "wrong_code"}
        if inv is None:
            return refused
        if inv["expires"] <= now:
            del self.invites[name]
            return refused
        kid = key_id(key)
        failures = _failures(inv)
        if failures.get(kid, 0) >= max_failures:
            return {**refused, "code": "barred"}
        if not hmac.compare_digest(inv["code_hash"], code_hash):
            n = failures.get(kid, 0) + 1
            if len(failures) >= MAX_INVITE_KEYS and kid not in failures:
                failures.pop(next(iter(failures)))
            self.invites[name] = {**inv, "failures": {**failures, kid: n}}
            return {**refused, "code": "barred" if n >= max_failures else "wrong_code"}
        del self.invites[name]
        u = self.users.get(name)
        grant = [cluster] if cluster else []
        if u is None:
            return self._new_user(name, [key], inv["admin"], now, skip_uids, uid_range, grant)
        keys = u["keys"] if key_id(key) in {key_id(k) for k in u["keys"]} else [*u["keys"], key]
        clusters = [*u.get("clusters", []), *[c for c in grant if c not in u.get("clusters", [])]]
        self.users[name] = {**u, "keys": keys, "clusters": clusters}
        return {"uid": u["uid"], "name": name}

    @replicated
    def import_user(
        self, name: str, keys: list[str], uid: int, grant: bool, cluster: str, now: float
    ) -> dict[str, Any]:
        """Take a user record carried from another cluster (``mtcode-admin``).

        The user keeps ``uid``: a UID that is another user's here (or a removed
        user's) is refused, and so is another UID for a user this cluster knows. Keys
        are merged; with ``grant`` the user is granted ``cluster`` (this one), without
        it an unknown user is recorded ungranted (the UID is then reserved here, and a
        login can be refused with a reason) and a known one keeps its grant. The admin
        flag never travels: each cluster's admins are its own.
        """
        why = self.uid_conflict(name, uid)
        if why is not None:
            return {"error": why, "code": "uid_conflict"}
        u = self.users.get(name)
        new = u is None
        if u is None:
            self.used_uids.add(uid)
            u = {
                "name": name,
                "uid": uid,
                "keys": [],
                "admin": False,
                "clusters": [],
                "created": now,
                "last_login": None,
            }
        have = {key_id(k) for k in u["keys"]}
        merged = [*u["keys"], *[k for k in keys if key_id(k) not in have]]
        clusters = list(u.get("clusters", []))
        if grant and cluster not in clusters:
            clusters.append(cluster)
        self.users[name] = {**u, "keys": merged, "clusters": clusters}
        return {
            "name": name,
            "uid": uid,
            "granted": cluster in clusters,
            "created": new,
            "keys_added": len(merged) - len(u["keys"]),
        }

    @replicated
    def set_grant(self, name: str, cluster: str, grant: bool) -> dict[str, Any]:
        """Grant or revoke ``cluster`` for ``name``; the record and its UID stay."""
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r} on this cluster", "code": "not_found"}
        clusters = [c for c in u.get("clusters", []) if c != cluster]
        if grant:
            clusters.append(cluster)
        was = cluster in u.get("clusters", [])
        self.users[name] = {**u, "clusters": clusters}
        return {"name": name, "uid": u["uid"], "granted": grant, "changed": was != grant}

    @replicated
    def set_local_grant(self, name: str, cluster: str, grant: bool) -> dict[str, Any]:
        """Grant or revoke ``cluster`` for the local account ``name`` (not a registry
        user): LOCAL_ACCOUNTS then lets it in, or refuses it, on that cluster."""
        grants = dict(getattr(self, "local_grants", {}))
        clusters = [c for c in grants.get(name, []) if c != cluster]
        if grant:
            clusters.append(cluster)
        was = cluster in grants.get(name, [])
        grants[name] = clusters
        self.local_grants = grants
        return {"name": name, "granted": grant, "changed": was != grant, "local": True}

    @replicated
    def record_login(self, name: str, now: float) -> None:
        u = self.users.get(name)
        if u is not None:
            self.users[name] = {**u, "last_login": now}

    # ------------------------------------------------- tenant retention

    @replicated
    def record_activity(self, name: str, now: float) -> None:
        """A job or workspace was started: the tenant is active (TENANT_RETENTION_DAYS)."""
        u = self.users.get(name)
        if u is not None and (u.get("last_active") or 0) < now:
            self.users[name] = {**u, "last_active": now}

    @replicated
    def lock_user(self, name: str, now: float, actor: str, reason: str) -> dict[str, Any]:
        """Refuse the tenant's logins on every member (the first step of retention)."""
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        if not u.get("locked"):
            self.users[name] = {**u, "locked": now, "lock_reason": reason}
        return {"name": name, "locked": self.users[name]["locked"]}

    @replicated
    def unlock_user(self, name: str, now: float, actor: str) -> dict[str, Any]:
        """Let a locked tenant in again; counts as activity, so retention starts over."""
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        was = u.get("locked")
        self.users[name] = {
            **{k: v for k, v in u.items() if k not in ("locked", "lock_reason", "removal_failed")},
            "last_active": now,
        }
        return {"name": name, "was_locked": bool(was)}

    @replicated
    def record_removal_failure(self, name: str, now: float, reason: str, retry_at: float) -> dict[str, Any]:
        """A removal failed: kept locked, with the reason, until ``retry_at`` (back-off)."""
        u = self.users.get(name)
        if u is None:
            return {"error": f"no user {name!r}", "code": "not_found"}
        attempts = (u.get("removal_failed") or {}).get("attempts", 0) + 1
        self.users[name] = {
            **u,
            "removal_failed": {
                "time": now,
                "first": (u.get("removal_failed") or {}).get("first", now),
                "reason": reason[:2000],
                "attempts": attempts,
                "retry_at": retry_at,
            },
        }
        return {"name": name, "attempts": attempts}
