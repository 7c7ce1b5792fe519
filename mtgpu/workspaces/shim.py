"""``docker`` on tenants' PATH: enough of Docker's CLI for VS Code's Dev Containers
"Attach to Running Container", answered by the tenant's rootless podman.

The extension calls ``docker version`` (often ``--format {{.Server.APIVersion}}`` or
``{{json .}}``), ``docker ps``, ``docker inspect --type container ID`` and
``docker exec -i -u USER [-e K=V] [-w DIR] ID sh``. Podman's own ``version`` output has
no ``Server`` part for a local engine, so this shim answers ``version`` itself in
Docker's shape; every other command goes to podman through the same policy check
as ``mt-podman`` (so ``docker run --privileged`` is refused just the same).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

#: The Docker Engine API level podman 4's compatibility layer speaks.
DOCKER_API_VERSION = "1.41"


def version_info(podman: Mapping[str, Any]) -> dict[str, Any]:
    """Docker's ``version`` structure from podman's ``version --format json``.

    >>> v = version_info({"Client": {"Version": "4.3.1", "GoVersion": "go1.19", "OsArch": "linux/amd64"}})
    >>> v["Server"]["APIVersion"], v["Server"]["Version"], v["Server"]["Os"]
    ('1.41', '4.3.1', 'linux')
    """
    c = podman.get("Client") or podman
    ver = str(c.get("Version", "0"))
    os_, _, arch = str(c.get("OsArch", "linux/amd64")).partition("/")
    part = {
        "Version": ver,
        "ApiVersion": DOCKER_API_VERSION,
        "APIVersion": DOCKER_API_VERSION,
        "MinAPIVersion": "1.24",
        "GoVersion": c.get("GoVersion", ""),
        "GitCommit": c.get("GitCommit", ""),
        "Os": os_,
        "Arch": arch,
        "BuildTime": str(c.get("BuiltTime", "")),
        "KernelVersion": os.uname().release,
    }
    return {
        "Client": {**part, "Platform": {"Name": "MTGPU docker shim (podman)"}},
        "Server": {
            **part,
            "Platform": {"Name": "Podman Engine"},
            "Components": [{"Name": "Podman Engine", "Version": ver, "Details": {"APIVersion": ver}}],
        },
    }


def render(template: str, data: Any) -> str:
    """A Go template subset: ``{{.A.B}}``, ``{{json .}}``, ``{{json .A}}`` and plain text.

    >>> render("{{.Server.APIVersion}}", {"Server": {"APIVersion": "1.41"}})
    '1.41'
    >>> render("{{json .A}} x", {"A": [1]})
    '[1] x'
    """

    def lookup(path: str) -> Any:
        value = data
        for part in [p for p in path.split(".") if p]:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def one(m: re.Match[str]) -> str:
        value = lookup(m.group(2))
        if m.group(1):
            return json.dumps(value, separators=(",", ":"))
        return "" if value is None else str(value)

    return re.sub(r"{{\s*(json\s+)?\.([\w.]*)\s*}}", one, template)


def _format_arg(argv: Sequence[str]) -> str | None:
    for i, a in enumerate(argv):
        if a in ("--format", "-f") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--format="):
            return a.split("=", 1)[1]
    return None


def version(argv: Sequence[str], podman: str, env: Mapping[str, str]) -> int:
    from mtgpu.errors import CommandError
    from mtgpu.proc import run

    try:
        out = run([podman, "version", "--format", "json"], env=env, timeout=60)
        data = json.loads(out.stdout or "{}")
    except (CommandError, ValueError) as exc:
        print(f"docker: podman version failed: {exc}", file=sys.stderr)
        return 1
    info = version_info(data)
    fmt = _format_arg(argv)
    if fmt:
        print(render(fmt, info))
        return 0
    for part in ("Client", "Server"):
        p = info[part]
        print(
            f"{part}: {p['Platform']['Name']}\n Version:      {p['Version']}\n"
            f" API version:  {p['APIVersion']}\n Go version:   {p['GoVersion']}\n"
            f" OS/Arch:      {p['Os']}/{p['Arch']}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    from mtgpu.errors import ApiError
    from mtgpu.workspaces.tenant_podman import REFUSED, _client, podman_env, run_podman

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["version"] or args[:2] == ["system", "version"]:
        try:
            pol = _client().call("workspace.policy")
        except ApiError as exc:
            print(f"docker: cannot reach MTGPU: {exc}", file=sys.stderr)
            return REFUSED
        return version(args[1:], pol.get("podman") or "podman", podman_env(pol))
    if args[:1] in (["-v"], ["--version"]):
        print(f"Docker version {DOCKER_API_VERSION} (MTGPU shim over podman)")
        return 0
    return run_podman(args, prog="docker")


if __name__ == "__main__":
    sys.exit(main())
