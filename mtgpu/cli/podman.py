"""``mt-podman ARGS...``: podman as the tenant, under the host's container policy.

MTGPU also links this program as ``podman`` first on tenants' PATH, so a tenant
who types plain ``podman`` meets the same policy. The checks and the exec live in
:mod:`mtgpu.workspaces.tenant_podman`, shared with the ``docker`` shim; this is only
the command line. A refusal names the rule and exits 125, podman's own status for
an error in podman.

``mt-podman --rules`` prints the rules as they apply to the caller.
"""

from __future__ import annotations

import argparse
import os
import sys

from mtgpu.cmdline import VERSION, with_examples
from mtgpu.workspaces.tenant_podman import run_podman


def build_parser() -> argparse.ArgumentParser:
    """Only for ``--help``, completion and the manual page: every other argument goes
    to podman as it is."""
    p = argparse.ArgumentParser(
        prog="mt-podman",
        description="Run podman as yourself, under this host's container policy. Plain podman "
        "on MTGPU hosts is this too. A refused command names the rule it breaks and exits 125.",
    )
    p.add_argument("--rules", action="store_true", help="print the container rules as they apply to you")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="PODMAN-ARGS", help="podman's own arguments")
    return with_examples(
        p,
        {"": "mt-podman --rules\nmt-podman run --rm -it docker.io/library/alpine sh\nmt-podman ps -a"},
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "mt-podman"
    if prog == "mt-podman" and args[:1] in (["-h"], ["--help"]):
        build_parser().print_help()
        return 0
    if prog == "mt-podman" and args[:1] == ["--version"]:
        print(VERSION)
        return 0
    try:
        return run_podman(args, prog=prog if prog in ("podman", "mt-podman") else "mt-podman")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
