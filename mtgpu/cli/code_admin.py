"""``mtcode-admin``: the administrator across clusters, and which users may use each.

One admin account and its SSH key manage every cluster the account is admin of.
The list of clusters lives in the admin's home, ``~/.config/mtcode/clusters.yaml``
(``$XDG_CONFIG_HOME/mtcode/clusters.yaml``; ``--clusters FILE`` or ``$MTCODE_CLUSTERS``
choose another)::

    clusters:
      alpha:                                   # the cluster's CLUSTER_ID
        members: [gpu01.example.org:2222, gpu02.example.org:2222]
        user: alice                            # optional: the admin account there
    ssh_config: ~/.ssh/config-mtcode           # optional: given to ssh as -F

Each cluster is reached over SSH, as the admin, at the first of its members that
answers: the OpenSSH client (``ssh``, with the admin's own configuration, keys,
agent and known_hosts) opens the ``mtgpu-api`` subsystem of that member, and
requests and answers travel as JSON lines. Nothing is installed on the admin's
machine but this command, and nothing is spawned on the member per request.

Grants are enforced by each cluster's members; this command only asks for them:

- ``grant USER CLUSTER`` carries the user's record (name, keys, UID) to the cluster
  and grants it. The record comes from whichever of the admin's clusters already
  has the user (``--key`` creates a new user). The record is also carried,
  ungranted, to the admin's other clusters, so the UID is reserved everywhere and a
  login there is refused with the reason.
- ``revoke USER CLUSTER`` takes the grant away; the record and UID stay.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import yaml

from mtgpu import jsonl
from mtgpu.cli.common import add_common, base_parser, emit, run_cli, table
from mtgpu.cmdline import with_examples
from mtgpu.errors import ApiError, MtgpuError, ValidationError
from mtgpu.proc import spawn

SSH_CONNECT_TIMEOUT = 10


class ClusterListError(MtgpuError):
    """The admin's list of clusters is unreadable or names no such cluster."""


def default_clusters_file() -> Path:
    """``$MTCODE_CLUSTERS``, else ``$XDG_CONFIG_HOME/mtcode/clusters.yaml``."""
    env = os.environ.get("MTCODE_CLUSTERS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mtcode" / "clusters.yaml"


class ClusterList:
    """The admin's clusters: name -> members (HOST[:PORT]) and the account to use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"clusters": {}}
        if path.exists():
            try:
                loaded = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ClusterListError(f"{path}: cannot be read: {exc}; fix or remove it") from exc
            if not isinstance(loaded, dict) or not isinstance(loaded.get("clusters", {}), dict):
                raise ClusterListError(
                    f"{path}: expected a mapping with `clusters:` (NAME: "
                    "{members: [HOST:PORT, ...]}); fix or remove it"
                )
            loaded.setdefault("clusters", {})
            self.data = loaded
            for name, c in self.clusters.items():
                if not isinstance(c, dict) or not isinstance(c.get("members"), list) or not c["members"]:
                    raise ClusterListError(
                        f"{path}: cluster {name!r} needs `members:`, a list "
                        "of HOST[:PORT]; fix it or run `mtcode-admin cluster "
                        f"add {name} HOST[:PORT]` again"
                    )

    @property
    def clusters(self) -> dict[str, dict[str, Any]]:
        return self.data["clusters"]

    def names(self) -> list[str]:
        return sorted(self.clusters)

    def get(self, name: str) -> dict[str, Any]:
        c = self.clusters.get(name)
        if c is None:
            known = ", ".join(self.names()) or "none yet"
            raise ClusterListError(
                f"no cluster {name!r} in {self.path} (known: {known}); add it "
                f"with `mtcode-admin cluster add {name} HOST[:PORT]`"
            )
        return c

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            "# mtcode-admin's clusters (see `mtcode-admin --help`)\n"
            + yaml.safe_dump(self.data, sort_keys=True)
        )
        os.replace(tmp, self.path)

    def link(self, name: str) -> ClusterLink:
        c = self.get(name)
        cfg = self.data.get("ssh_config")
        return ClusterLink(
            name, [str(m) for m in c["members"]], c.get("user"), str(Path(cfg).expanduser()) if cfg else None
        )


def split_address(address: str) -> tuple[str, int | None]:
    """``HOST[:PORT]`` (``[V6]:PORT`` too) -> (host, port or None).

    >>> split_address("gpu01:2222"), split_address("gpu01"), split_address("[::1]:22")
    (('gpu01', 2222), ('gpu01', None), ('::1', 22))
    """
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if address.count(":") == 1:
        host, port = address.split(":")
        if not port.isdigit():
            raise ValueError(f"{address!r}: the port must be a number")
        return host, int(port)
    return address, None


class ClusterLink:
    """The ``mtgpu-api`` subsystem of one member of a cluster, through OpenSSH's ssh."""

    def __init__(self, cluster: str, members: list[str], user: str | None, ssh_config: str | None) -> None:
        self.cluster = cluster
        self.members = members
        self.user = user
        self.ssh_config = ssh_config
        self.member: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: jsonl.BlockingLineReader | None = None
        self._next = 0

    def _argv(self, address: str) -> list[str]:
        host, port = split_address(address)
        argv = ["ssh"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        argv += [
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=2",
        ]
        if port is not None:
            argv += ["-p", str(port)]
        if self.user:
            argv += ["-l", self.user]
        return argv + ["-s", host, "mtgpu-api"]

    def _open(self) -> subprocess.Popen[bytes]:
        if self._proc is not None:
            return self._proc
        failures = []
        for address in self.members:
            proc = spawn(
                self._argv(address), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            self._proc, self.member = proc, address
            self._lines = jsonl.BlockingLineReader(cast(io.BufferedReader, proc.stdout).read1)
            try:
                self._exchange("version", {})  # proves the channel answers
                return proc
            except ApiError as exc:
                failures.append(f"{address}: {exc}")
                self.close()
        raise ApiError(f"cannot reach cluster {self.cluster}: " + "; ".join(failures), "unreachable")

    def _exchange(self, op: str, args: dict[str, Any]) -> Any:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        self._next += 1
        req = {"op": op, "args": {k: v for k, v in args.items() if v is not None}, "id": self._next}
        assert self._lines is not None
        data = jsonl.encode(req)
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            answer = self._lines.message()
        except OSError:
            answer = None
        except jsonl.LineError as exc:
            raise ApiError(f"{self.member} sent a line that is not an answer: {exc}", "unreachable") from exc
        if answer is None:
            raise ApiError(self._why_closed(), "unreachable")
        return jsonl.result(answer)

    def _why_closed(self) -> str:
        proc = self._proc
        assert proc is not None
        try:
            proc.wait(SSH_CONNECT_TIMEOUT)
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
        except subprocess.TimeoutExpired:
            err = ""
        lines = [ln.removeprefix("mtgpu: ") for ln in err.splitlines() if ln.strip()]
        return " ".join(lines) or f"ssh exited with status {proc.returncode}"

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` on the cluster (at the first member that answers)."""
        self._open()
        try:
            return self._exchange(op, args)
        except ApiError as exc:
            if exc.code == "unreachable":
                self.close()
                raise ApiError(f"cluster {self.cluster} ({self.member}): {exc}", "unreachable") from exc
            text = str(exc)
            if f"cluster {self.cluster}" not in text:
                text = f"cluster {self.cluster}: {text}"
            raise ApiError(text, exc.code) from exc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        self._lines = None
        if proc is not None:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            for f in (proc.stdout, proc.stderr):
                if f:
                    f.close()


# ------------------------------------------------------------------ commands


def build_parser() -> argparse.ArgumentParser:
    p = base_parser("mtcode-admin", "Manage several MTGPU clusters and which users may use each.")
    p.add_argument(
        "--clusters",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="the list of clusters (default $MTCODE_CLUSTERS, then ~/.config/mtcode/clusters.yaml)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    cl = sub.add_parser("cluster", help="the clusters you administer")
    add_common(cl)
    cls = cl.add_subparsers(dest="ccmd", required=True, metavar="ACTION")
    ls = cls.add_parser("list", help="your clusters, and whether each answers")
    add_common(ls)
    ls.add_argument("--offline", action="store_true", help="do not contact them")
    add = cls.add_parser("add", help="add a cluster, reached at any of its members")
    add_common(add)
    add.add_argument("name", help="the cluster's CLUSTER_ID (a standalone host's SERVER_NAME)")
    add.add_argument(
        "members", nargs="+", metavar="HOST[:PORT]", help="members to reach it at, tried in this order"
    )
    add.add_argument("--user", help="your admin account there (default: ssh's own choice)")
    rm = cls.add_parser("remove", help="forget a cluster (nothing changes on it)")
    add_common(rm)
    rm.add_argument("name")

    gr = sub.add_parser("grant", help="let a user use a cluster (same UID everywhere)")
    add_common(gr)
    gr.add_argument("user")
    gr.add_argument("cluster")
    gr.add_argument(
        "--key", action="append", help="an OpenSSH public key line: creates the user if no cluster has them"
    )
    rv = sub.add_parser("revoke", help="take a cluster's grant away (the record and UID stay)")
    add_common(rv)
    rv.add_argument("user")
    rv.add_argument("cluster")

    us = sub.add_parser("user", help="a user across your clusters")
    add_common(us)
    uss = us.add_subparsers(dest="ucmd", required=True, metavar="ACTION")
    show = uss.add_parser("show", help="the user's record and grant on each cluster")
    add_common(show)
    show.add_argument("user")
    return with_examples(p, EXAMPLES)


#: The examples at the end of each command's --help (and manual page).
EXAMPLES = {
    "": "mtcode-admin cluster list\nmtcode-admin grant alice alpha",
    "cluster": "mtcode-admin cluster list",
    "cluster list": "mtcode-admin cluster list\nmtcode-admin cluster list --offline",
    "cluster add": "mtcode-admin cluster add alpha gpu01.example.org:2222 gpu02.example.org:2222",
    "cluster remove": "mtcode-admin cluster remove gamma",
    "grant": "mtcode-admin grant alice beta\n"
    'mtcode-admin grant alice alpha --key "ssh-ed25519 AAAAC3Nza... alice@laptop"',
    "revoke": "mtcode-admin revoke alice alpha",
    "user": "mtcode-admin user show alice",
    "user show": "mtcode-admin user show alice --json",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli("mtcode-admin", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    path = Path(args.clusters).expanduser() if getattr(args, "clusters", None) else default_clusters_file()
    cl = ClusterList(path)
    if args.cmd == "cluster" and args.ccmd == "list":
        return _cluster_list(args, cl)
    if args.cmd == "cluster" and args.ccmd == "add":
        return _cluster_add(args, cl)
    if args.cmd == "cluster" and args.ccmd == "remove":
        cl.get(args.name)
        del cl.clusters[args.name]
        cl.save()
        emit(
            args,
            {"removed": args.name, "file": str(cl.path)},
            f"forgot cluster {args.name} (nothing changed on it)",
        )
        return 0
    if args.cmd == "grant":
        return _grant(args, cl)
    if args.cmd == "revoke":
        link = cl.link(args.cluster)
        try:
            r = link.call("user.revoke", name=args.user)
        finally:
            link.close()
        if r.get("local"):
            text = f"revoked the local account {args.user}'s grant on {args.cluster}"
        elif r["changed"]:
            text = f"revoked {args.user}'s grant on {args.cluster} (UID {r['uid']} stays reserved there)"
        else:
            text = f"{args.user} was not granted {args.cluster}"
        emit(args, r, text)
        return 0
    if args.cmd == "user":
        return _user_show(args, cl)
    return 2


def _cluster_add(args: argparse.Namespace, cl: ClusterList) -> int:
    try:
        for m in args.members:
            split_address(m)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc
    link = ClusterLink(
        args.name,
        args.members,
        args.user,
        str(Path(cl.data["ssh_config"]).expanduser()) if cl.data.get("ssh_config") else None,
    )
    try:
        who = link.call("whoami")
    finally:
        link.close()
    if who["cluster_id"] != args.name:
        raise ApiError(
            f"{link.member} is a member of cluster {who['cluster_id']!r}, not "
            f"{args.name!r}; run `mtcode-admin cluster add {who['cluster_id']} "
            f"{' '.join(args.members)}`",
            "wrong_cluster",
        )
    if not who["admin"]:
        raise ApiError(
            f"{who['name']} is not an admin of cluster {args.name}; an admin there "
            f"can run `mtgpu-admin user add {who['name']} --admin --key ...`",
            "forbidden",
        )
    entry: dict[str, Any] = {"members": list(args.members)}
    if args.user:
        entry["user"] = args.user
    cl.clusters[args.name] = entry
    cl.save()
    emit(
        args,
        {"cluster": args.name, **entry, "admin_as": who["name"], "file": str(cl.path)},
        f"added cluster {args.name} (reached at {', '.join(args.members)}; admin as "
        f"{who['name']}) to {cl.path}",
    )
    return 0


def _cluster_list(args: argparse.Namespace, cl: ClusterList) -> int:
    rows = []
    for name in cl.names():
        c = cl.clusters[name]
        row: dict[str, Any] = {
            "name": name,
            "members": list(c["members"]),
            "user": c.get("user"),
            "reachable": None,
        }
        if not args.offline:
            link = cl.link(name)
            try:
                who = link.call("whoami")
                st = link.call("cluster.status")
                row.update(
                    reachable=True,
                    via=link.member,
                    admin_as=who["name"],
                    scheduler=st.get("scheduler"),
                    member_count=len(st.get("members", [])),
                )
            except ApiError as exc:
                row.update(reachable=False, error=str(exc))
            finally:
                link.close()
        rows.append(row)

    def text(rows: list[dict[str, Any]]) -> str:
        return (
            table(
                [
                    [
                        r["name"],
                        ", ".join(r["members"]),
                        ""
                        if r["reachable"] is None
                        else (
                            f"ok via {r['via']}, admin as {r['admin_as']}, {r['member_count']} member(s)"
                            if r["reachable"]
                            else f"failed: {r['error']}"[:120]
                        ),
                    ]
                    for r in rows
                ],
                ["CLUSTER", "REACHED AT", "STATE"],
            )
            + f"\n(from {cl.path})"
        )

    emit(args, rows, text)
    return 0 if all(r["reachable"] is not False for r in rows) else 1


def _records(cl: ClusterList, user: str) -> tuple[dict[str, dict[str, Any] | None], dict[str, str]]:
    """The user's record on each cluster (None: no record there), and the clusters
    that could not be asked, with why."""
    records: dict[str, dict[str, Any] | None] = {}
    errors: dict[str, str] = {}
    for name in cl.names():
        link = cl.link(name)
        try:
            records[name] = link.call("user.show", name=user)
        except ApiError as exc:
            if exc.code == "not_found":
                records[name] = None
            else:
                errors[name] = str(exc)
        finally:
            link.close()
    return records, errors


def _grant(args: argparse.Namespace, cl: ClusterList) -> int:
    user, target = args.user, args.cluster
    cl.get(target)
    records, errors = _records(cl, user)
    if target in errors:
        raise ApiError(errors[target], "unreachable")
    here = records.get(target)
    if here is not None and here.get("local"):
        # A local account of that cluster's hosts: only the grant is recorded there,
        # nothing is carried (its UID and keys are the hosts' own).
        link = cl.link(target)
        try:
            link.call("user.import", name=user, keys=[], uid=here["uid"], grant=True)
        finally:
            link.close()
        emit(
            args,
            {
                "user": user,
                "cluster": target,
                "uid": here["uid"],
                "granted": True,
                "local": True,
                "carried_to": [],
                "warnings": [],
            },
            f"granted the local account {user} (UID {here['uid']}) cluster {target}",
        )
        return 0
    found = {c: r for c, r in records.items() if r is not None and not r.get("local")}
    uids = {r["uid"] for r in found.values()}
    if len(uids) > 1:
        where = ", ".join(f"{c}: {r['uid']}" for c, r in sorted(found.items()))
        raise ApiError(
            f"{user} has different UIDs on your clusters ({where}); a user keeps one "
            "UID everywhere. Remove the user from all but one cluster (`mtgpu-admin "
            "user remove`) and grant again",
            "uid_conflict",
        )
    keys: list[str] = []
    for r in found.values():
        keys += [k for k in r["keys"] if k not in keys]
    keys += [k for k in (args.key or []) if k not in keys]
    link = cl.link(target)
    try:
        if not found:
            if not args.key:
                raise ApiError(
                    f"no user {user!r} on any of your clusters "
                    f"({', '.join(cl.names())}); give their public key with --key to "
                    "create them",
                    "not_found",
                )
            r = link.call("user.add", name=user, keys=keys)
            uid = r["uid"]
        else:
            (uid,) = uids
            r = link.call("user.import", name=user, keys=keys, uid=uid, grant=True)
    finally:
        link.close()
    # The record goes to the other clusters too, ungranted: the UID is reserved there,
    # and a login there is refused with the reason.
    carried, warnings = [], []
    for name in cl.names():
        if name == target:
            continue
        if name in errors:
            warnings.append(f"{user}'s record was not carried to {name}: {errors[name]}")
            continue
        link = cl.link(name)
        try:
            link.call("user.import", name=user, keys=keys, uid=uid, grant=False)
            carried.append(name)
        except ApiError as exc:
            warnings.append(f"{user}'s record was not carried to {name}: {exc}")
        finally:
            link.close()
    for w in warnings:
        print(f"mtcode-admin: warning: {w}", file=sys.stderr)
    emit(
        args,
        {
            "user": user,
            "cluster": target,
            "uid": uid,
            "granted": True,
            "carried_to": carried,
            "warnings": warnings,
        },
        f"granted {user} (UID {uid}) cluster {target}",
    )
    return 0


def _user_show(args: argparse.Namespace, cl: ClusterList) -> int:
    records, errors = _records(cl, args.user)
    uids = sorted({r["uid"] for r in records.values() if r is not None})
    data = {
        "name": args.user,
        "uid": uids[0] if len(uids) == 1 else None,
        "uids_differ": len(uids) > 1,
        "granted": sorted(c for c, r in records.items() if r and r["granted"]),
        "clusters": {
            c: (
                None
                if r is None
                else {
                    "uid": r["uid"],
                    "granted": r["granted"],
                    "admin": r["admin"],
                    "keys": r["keys"],
                    "last_login": r["last_login"],
                }
            )
            for c, r in records.items()
        },
        "errors": errors,
    }

    def text(d: dict[str, Any]) -> str:
        rows: list[list[Any]] = []
        for c in cl.names():
            r = d["clusters"].get(c)
            if c in errors:
                rows.append([c, "", "", "", f"unreachable: {errors[c]}"[:80]])
            elif r is None:
                rows.append([c, "", "no", "", "(no record)"])
            else:
                rows.append(
                    [
                        c,
                        r["uid"],
                        "yes" if r["granted"] else "no",
                        "yes" if r["admin"] else "",
                        len(r["keys"]),
                    ]
                )
        out = [
            f"user {d['name']}: granted {', '.join(d['granted']) or 'no cluster'}",
            table(rows, ["CLUSTER", "UID", "GRANTED", "ADMIN", "KEYS"]),
        ]
        if d["uids_differ"]:
            out.append(
                f"warning: {d['name']} has different UIDs on your clusters ({', '.join(map(str, uids))})"
            )
        return "\n".join(out)

    if not any(records.values()) and not errors:
        raise ApiError(
            f"no user {args.user!r} on any of your clusters ({', '.join(cl.names()) or 'none yet'})",
            "not_found",
        )
    emit(args, data, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
