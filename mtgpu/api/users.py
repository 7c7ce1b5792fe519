"""API operations on users and invites: whoami, version, user.*, invite."""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import time
from typing import Any, Protocol

import asyncssh

import mtgpu
from mtgpu.accounts.homeremove import foreign_owner
from mtgpu.accounts.names import check_username
from mtgpu.accounts.provision import AccountProvisioner
from mtgpu.accounts.registry import Registry, hash_code
from mtgpu.accounts.retention import MANAGED_MARK, local_account
from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.config import Options, parse_duration
from mtgpu.errors import AccountError, ApiError, ValidationError


class UserHost(Protocol):
    options: Options
    registry: Registry

    @property
    def accounts(self) -> AccountProvisioner: ...  # read-only: any provisioner will do

    retention: Any  # mtgpu.api.policy.Retention: runs a step on every member

    async def replicate(self, method: Any, *args: Any) -> Any: ...

    async def cancel_jobs_of(self, name: str, why: str) -> list[str]: ...

    def local_refusal(self, pw: pwd.struct_passwd) -> str | None: ...


def normalize_key(text: str) -> str:
    """Check one OpenSSH public key line and return it as ``TYPE BASE64 [COMMENT]``."""
    text = text.strip()
    try:
        key = asyncssh.import_public_key(text)
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise ApiError(
            f"not a valid OpenSSH public key ({exc}); paste one line such as the "
            "contents of ~/.ssh/id_ed25519.pub",
            "bad_key",
        ) from exc
    body = " ".join(key.export_public_key("openssh").decode().split()[:2])
    parts = text.split(None, 2)
    return f"{body} {parts[2]}" if len(parts) > 2 else body


def new_invite_code() -> str:
    """A one-time code that is easy to read out: ``XXXX-XXXX-XXXX`` (60 bits)."""
    alphabet = "23456789abcdefghjkmnpqrstuvwxyz"
    raw = "".join(secrets.choice(alphabet) for _ in range(12))
    return f"{raw[:4]}-{raw[4:8]}-{raw[8:]}"


def _result(r: dict[str, Any]) -> dict[str, Any]:
    if "error" in r:
        raise ApiError(r["error"], r.get("code", "error"))
    return r


def _user_view(u: dict[str, Any], cluster: str) -> dict[str, Any]:
    return {
        "name": u["name"],
        "uid": u["uid"],
        "admin": u["admin"],
        "keys": list(u["keys"]),
        "clusters": list(u["clusters"]),
        "granted": cluster in u["clusters"],
        "cluster": cluster,
        "created": u["created"],
        "last_login": u["last_login"],
    }


def _local_holder(uid: int) -> str | None:
    """The local account that holds ``uid`` on this host, if any."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def register(d: Dispatcher, host: UserHost) -> None:
    """Register the user operations on ``d``."""

    def whoami(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Who the daemon believes is asking."""
        return {
            "name": caller.name,
            "uid": caller.uid,
            "admin": caller.admin,
            "via": caller.via,
            "server": host.options.server_name,
            "cluster_id": host.options.cluster_name,
        }

    def version(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The MTGPU version of this daemon, and the CLUSTER_MODE it runs in (a reload
        keeps it: only a restart changes it)."""
        return {
            "version": mtgpu.__version__,
            "server": host.options.server_name,
            "cluster_mode": host.options.cluster_mode,
        }

    def _name(args: dict[str, Any]) -> str:
        name = arg(args, "name", str)
        try:
            return check_username(name)
        except AccountError as exc:
            raise ApiError(str(exc), "bad_name") from exc

    def _refuse_local(name: str) -> None:
        if host.registry.get(name) is None and host.accounts.existing(name) is not None:
            raise ApiError(
                f"{name!r} is an existing local account on this host; it already "
                "logs in with its own ~/.ssh/authorized_keys and needs no MTGPU "
                "registration. Choose another name for a new tenant",
                "exists",
            )

    def _refuse_foreign_home(name: str, uid: int = -1) -> None:
        """A new tenant's home path must not be a directory of someone else's."""
        if host.registry.get(name) is not None:
            return
        home = os.path.join(host.options.tenant_home_root, name)
        owner = foreign_owner(home, uid)
        if owner:
            raise ApiError(
                f"{home} already exists and belongs to {owner}, not to a new tenant "
                f"{name!r}; refusing: the tenant's account would be made on it and "
                "retention could later remove it. Choose another name, or move that "
                "directory away first",
                "exists",
            )

    async def user_add(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Add a user with one or more public keys."""
        name = _name(args)
        keys = arg(args, "keys", list)
        if not keys:
            raise ValidationError("a user needs at least one key (--key), or use `invite` instead")
        keys = [normalize_key(k) for k in keys]
        admin = arg(args, "admin", bool, False)
        _refuse_local(name)
        _refuse_foreign_home(name)
        skip = host.accounts.local_uids()
        clock = getattr(host, "clock", None)  # creation counts for TENANT_RETENTION_DAYS
        now = clock.now() if clock is not None else time.time()
        r = _result(
            await host.replicate(
                host.registry.add_user,
                name,
                keys,
                admin,
                now,
                skip,
                caller.name,
                host.options.tenant_uid_range,
                [host.options.cluster_name],
            )
        )
        return {"name": name, "uid": r["uid"], "admin": admin}

    def user_list(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Every registered user."""
        cluster = host.options.cluster_name
        return [
            _user_view(host.registry.users[n], cluster)
            for n in host.registry.names()
            if n in host.registry.users
        ]

    def _local_user(name: str) -> pwd.struct_passwd | None:
        """The local account ``name`` here, if it is one MTGPU did not make (and is
        not a removed tenant's)."""
        if host.registry.get(name) is not None:
            return None
        pw = local_account(name)
        if (
            pw is None
            or pw.pw_uid < 1000
            or MANAGED_MARK in pw.pw_gecos
            or host.registry.retired_uid(pw.pw_uid)
        ):
            return None
        return pw

    def _local_view(pw: pwd.struct_passwd) -> dict[str, Any]:
        cluster = host.options.cluster_name
        return {
            "name": pw.pw_name,
            "uid": pw.pw_uid,
            "admin": pw.pw_name in host.options.admins,
            "keys": [],
            "clusters": [cluster] if host.registry.local_grant(pw.pw_name, cluster) else [],
            "granted": host.local_refusal(pw) is None,
            "cluster": cluster,
            "created": None,
            "last_login": None,
            "local": True,
            "local_accounts": host.options.local_accounts,
        }

    def user_show(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One user's record (a local account's: its grant here and LOCAL_ACCOUNTS)."""
        u = host.registry.get(_name(args))
        if u is None and (pw := _local_user(args["name"])) is not None:
            return _local_view(pw)
        if u is None:
            raise ApiError(f"no user {args['name']!r} on cluster {host.options.cluster_name}", "not_found")
        return _user_view(u, host.options.cluster_name)

    async def user_import(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Take a user record (name, keys, UID) from another cluster, granted here or not."""
        name = _name(args)
        uid = arg(args, "uid", int)
        keys = [normalize_key(k) for k in arg(args, "keys", list, [])]
        grant = arg(args, "grant", bool, False)
        cluster = host.options.cluster_name
        pw = await asyncio.to_thread(_local_user, name)
        if pw is not None:
            # A local account: only its grant is recorded; its keys stay its own.
            if pw.pw_uid != uid:
                raise ApiError(
                    f"{name!r} is a local account here with UID {pw.pw_uid}, not {uid}", "uid_conflict"
                )
            r = await host.replicate(host.registry.set_local_grant, name, cluster, grant)
            return {**r, "uid": uid, "cluster": cluster}
        if uid < 1000:
            raise ApiError(f"UID {uid} is a system UID; a tenant's UID is 1000 or more", "uid_conflict")
        if host.registry.get(name) is None:
            _refuse_local(name)
            _refuse_foreign_home(name, uid)  # shared homes: the same UID's home is its own
            holder = await asyncio.to_thread(_local_holder, uid)
            if holder is not None and holder != name:
                raise ApiError(
                    f"cluster {cluster} refuses UID {uid} for {name!r}: the local "
                    f"account {holder!r} on {host.options.server_name} holds it. Give "
                    f"that account another UID, or remove {name!r} where it was "
                    "created and add it again",
                    "uid_conflict",
                )
        if not keys and host.registry.get(name) is None:
            raise ValidationError(f"{name!r} has no key to carry; add one where the user was created")
        r = await host.replicate(host.registry.import_user, name, keys, uid, grant, cluster, time.time())
        if "error" in r:
            raise ApiError(
                f"cluster {cluster} refuses UID {uid} for {name!r}: {r['error']}. "
                "A user keeps one UID in every cluster, so that files on shared "
                f"storage keep their owner. To resolve it, remove {name!r} where it "
                f"was created (`mtgpu-admin user remove {name}`; UIDs are never "
                "reused, so it gets a new one when added again) and grant again",
                r["code"],
            )
        return {**r, "cluster": cluster}

    async def user_revoke(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Take this cluster's grant from a user (the record and UID stay)."""
        name = _name(args)
        cluster = host.options.cluster_name
        pw = await asyncio.to_thread(_local_user, name)
        if pw is not None:  # a local account: refused here from now on
            r = await host.replicate(host.registry.set_local_grant, name, cluster, False)
            return {**r, "uid": pw.pw_uid, "cluster": cluster}
        r = _result(await host.replicate(host.registry.set_grant, name, cluster, False))
        return {**r, "cluster": cluster}

    async def user_remove(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Remove a user: refused at once on every member, jobs cancelled, workspaces
        stopped, OS accounts locked and processes ended (the home and UID are kept)."""
        name = _name(args)
        pw = await asyncio.to_thread(local_account, name)
        if host.registry.get(name) is None and pw is not None and host.registry.retired_uid(pw.pw_uid):
            # Removed before, and a member did not answer then: finish the job.
            r: dict[str, Any] = {"name": name, "uid": pw.pw_uid, "again": True}
        else:
            # First the record: from this entry on, every member refuses the name and
            # its UID, whatever keys its ~/.ssh/authorized_keys lists.
            r = _result(await host.replicate(host.registry.remove_user, name, time.time(), caller.name))
        r["jobs_cancelled"] = await host.cancel_jobs_of(name, f"{name} was removed")
        r["members"] = await host.retention.on_members("disable", name, r["uid"])
        failed = {m: x["error"] for m, x in r["members"].items() if "error" in x}
        if failed:
            r["warnings"] = [
                f"{m}: {e}; run `mtgpu-admin user remove {name}` again once it answers"
                for m, e in sorted(failed.items())
            ]
        return r

    async def key_add(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Add a public key to a user."""
        return _result(
            await host.replicate(
                host.registry.add_key,
                _name(args),
                normalize_key(arg(args, "key", str)),
                time.time(),
                caller.name,
            )
        )

    async def key_remove(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Remove a public key from a user."""
        return _result(
            await host.replicate(
                host.registry.remove_key,
                _name(args),
                normalize_key(arg(args, "key", str)),
                time.time(),
                caller.name,
            )
        )

    async def invite(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Issue a one-time, expiring invite code for a user."""
        name = _name(args)
        expires_in = host.options.invite_ttl
        if args.get("expires") is not None:
            try:
                expires_in = parse_duration(arg(args, "expires", (str, int, float)))
            except ValueError as exc:
                raise ValidationError(str(exc)) from exc
            if expires_in <= 0:
                raise ValidationError("--expires must be longer than 0")
        _refuse_local(name)
        _refuse_foreign_home(name)
        code = new_invite_code()
        now = time.time()
        admin = arg(args, "admin", bool, False)
        await host.replicate(
            host.registry.create_invite, name, hash_code(code), now + expires_in, admin, now, caller.name
        )
        port = host.options.ssh_listen[1]
        server = host.options.server_name
        return {
            "name": name,
            "code": code,
            "expires": now + expires_in,
            "command": f"ssh -p {port} {name}@{server}",
            "command_noninteractive": f"ssh -p {port} {name}@{server} mtgpu-join {code}",
        }

    d.register("whoami", whoami)
    d.register("version", version)
    d.register("user.add", user_add, admin=True, audit=True)
    d.register("user.list", user_list, admin=True)
    d.register("user.show", user_show, admin=True)
    d.register("user.remove", user_remove, admin=True, audit=True)
    d.register("user.key.add", key_add, admin=True, audit=True)
    d.register("user.key.remove", key_remove, admin=True, audit=True)
    d.register("user.import", user_import, admin=True, audit=True)
    d.register("user.revoke", user_revoke, admin=True, audit=True)
    d.register("invite", invite, admin=True, audit=True)
