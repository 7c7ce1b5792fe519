"""``mtgpu-podman-hook``: the OCI ``precreate`` hook that applies the container policy to
every container podman creates on this host, however podman was started.

``mtgpu-setup podman-check --fix`` installs it (``/etc/containers/oci/hooks.d``) and
points podman's ``hooks_dir`` at it in ``/etc/containers/containers.conf.d``. Podman
runs it before each container is created, in the caller's rootless user namespace,
with the proposed OCI configuration on standard input; the hook writes it back
unchanged to allow it, or exits non-zero to refuse (podman then reports
``setting up OCI Hooks`` and the hook's arguments, which point at the log below).

Who is asking: the outer UID from ``/proc/self/uid_map``. Root's own containers and
accounts outside ``TENANT_UID_RANGE`` pass untouched. For a tenant the policy comes
from the daemon (SO_PEERCRED identifies the tenant across the user namespace); if
the daemon cannot be asked, a tenant's container is refused (fail closed). Each
refusal is appended, with its rule, to ``~/.mtgpu/podman-policy.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

LOG = ".mtgpu/podman-policy.log"


def outer_uid(uid_map: str) -> int | None:
    """The host UID that is root in this user namespace.

    >>> outer_uid("         0      20001          1\\n         1 3000000000      65536\\n")
    20001
    >>> outer_uid("         0          0 4294967295\\n")
    0
    """
    for line in uid_map.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "0":
            return int(parts[1])
    return None


def _log(home: str, text: str) -> None:
    try:
        os.makedirs(os.path.join(home, ".mtgpu"), exist_ok=True)
        with open(os.path.join(home, LOG), "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    from mtgpu.cmdline import add_version

    p = argparse.ArgumentParser(prog="mtgpu-podman-hook")
    p.add_argument("--api", required=True, help="the daemon's API socket")
    p.add_argument("--uid-range", default="1000-4294967294", help="tenant UIDs, FIRST-LAST")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    add_version(p)
    args = p.parse_args(argv)
    raw = sys.stdin.read()
    try:
        with open("/proc/self/uid_map") as f:
            uid = outer_uid(f.read())
    except OSError:
        uid = None
    lo, _, hi = args.uid_range.partition("-")
    if uid is None or uid == 0 or not int(lo) <= uid <= int(hi):
        sys.stdout.write(raw)
        return 0
    from mtgpu.api.client import ApiClient
    from mtgpu.errors import ApiError
    from mtgpu.workspaces.policy import check_oci_config
    from mtgpu.workspaces.types import Policy, PolicyRefusal

    try:
        pol = ApiClient(args.api, timeout=15).call("workspace.policy")
    except ApiError as exc:
        if exc.code in ("unknown_user", "forbidden"):
            sys.stdout.write(raw)  # not an MTGPU tenant
            return 0
        print(f"mtgpu: the container policy cannot be read ({exc}); refusing", file=sys.stderr)
        home = os.environ.get("HOME", "")
        if home:
            _log(home, f"the container policy cannot be read ({exc}); refused")
        return 1
    policy = Policy.from_dict(pol)
    try:
        check_oci_config(json.loads(raw), policy, realpath=os.path.realpath)
    except PolicyRefusal as exc:
        _log(policy.home, str(exc))
        print(f"mtgpu: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        _log(policy.home, f"unreadable OCI configuration: {exc}")
        return 1
    sys.stdout.write(raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
