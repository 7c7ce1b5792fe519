"""Pre-pulled images: fetched once per host into archives that tenants' podman loads.

Rootless podman keeps one image store per tenant, and the registry's credentials
must never reach a tenant. So the daemon copies each ``CONTAINERS.prepull`` image,
with the credentials, into a ``docker-archive`` under ``CONTAINERS.archive_dir``
(world-readable: the admin chose these images for everyone) using ``skopeo copy``.
That copies blobs only; nothing is unpacked and no container runs as root. When a
tenant creates a workspace from such an image, the tenant's own podman loads the
archive into the tenant's store (:meth:`Podman.load`), which keeps the image's name.

The credentials file is either a containers auth file (``podman login``'s JSON) or
one ``USER:PASSWORD`` line; the latter is turned into a private auth file for the
copy, so the password never appears on a command line.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtgpu.config.options import ContainersOptions
from mtgpu.errors import CommandError
from mtgpu.proc import run
from mtgpu.workspaces.policy import canonical_image
from mtgpu.workspaces.types import WorkspaceError

log = logging.getLogger("mtgpu.workspaces")


@dataclass(frozen=True)
class PrepullResult:
    image: str
    archive: str
    ok: bool
    error: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "archive": self.archive,
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 2),
        }


def archive_file(ref: str) -> str:
    """The archive's file name for a fully qualified image reference.

    >>> archive_file("reg.local:5000/team/img:2")
    'reg.local_5000_team_img_2.tar'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref) + ".tar"


def auth_json(text: str, registry: str) -> str:
    """A containers auth file from either an auth file or a ``USER:PASSWORD`` line.

    >>> json.loads(auth_json("me:pw", "r:5000"))["auths"]["r:5000"]["auth"]
    'bWU6cHc='
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        json.loads(stripped)
        return stripped
    user, sep, password = stripped.partition(":")
    if not sep or not user:
        raise WorkspaceError(
            "the registry credentials file must be a containers auth file "
            "(JSON, as `podman login` writes) or one USER:PASSWORD line"
        )
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": token}}})


class ImageArchives:
    """The pre-pulled archives of one host."""

    def __init__(self, containers: ContainersOptions, run_dir: str) -> None:
        self.c = containers
        self.run_dir = run_dir

    @property
    def registry(self) -> str:
        return (self.c.registry or {}).get("url", "")

    def full(self, ref: str) -> str:
        return canonical_image(ref, self.registry)

    def wanted(self) -> list[str]:
        return [self.full(r) for r in self.c.prepull]

    def path_for(self, ref: str) -> str | None:
        """The archive holding ``ref`` (any spelling of a pre-pulled image), if pulled."""
        for form in (self.full(ref), canonical_image(ref)):
            if form in self.wanted():
                p = Path(self.c.archive_dir) / archive_file(form)
                if p.is_file():
                    return str(p)
        return None

    def resolve(self, ref: str) -> str:
        """The fully qualified name a pre-pulled ``ref`` is loaded under, else ``ref``."""
        for form in (self.full(ref), canonical_image(ref)):
            if form in self.wanted():
                return form
        return ref

    def prepull(self, force: bool = False) -> list[PrepullResult]:
        """Copy every wanted image into its archive (skipping present ones unless ``force``)."""
        d = Path(self.c.archive_dir)
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        results = []
        for ref in self.wanted():
            target = d / archive_file(ref)
            if target.exists() and not force:
                results.append(PrepullResult(ref, str(target), True, "already pulled"))
                continue
            t0 = time.monotonic()
            try:
                self._copy(ref, target)
                results.append(PrepullResult(ref, str(target), True, "", time.monotonic() - t0))
                log.info("pre-pulled %s into %s", ref, target)
            except WorkspaceError as exc:
                log.error("pre-pulling %s failed: %s", ref, exc)
                results.append(PrepullResult(ref, str(target), False, str(exc), time.monotonic() - t0))
        return results

    def _copy(self, ref: str, target: Path) -> None:
        reg = self.c.registry or {}
        argv = ["skopeo", "copy", "--quiet"]
        auth_path = None
        if reg.get("credentials") and ref.startswith(self.registry + "/"):
            try:
                text = Path(reg["credentials"]).read_text()
            except OSError as exc:
                raise WorkspaceError(
                    f"cannot read the registry credentials {reg['credentials']}: {exc.strerror}"
                ) from exc
            fd, auth_path = tempfile.mkstemp(
                prefix="mtgpu-auth-",
                suffix=".json",
                dir=self.run_dir if os.path.isdir(self.run_dir) else None,
            )
            with os.fdopen(fd, "w") as f:
                f.write(auth_json(text, self.registry))
            argv += ["--src-authfile", auth_path]
        if ref.startswith(self.registry + "/") and reg.get("tls_verify") is False:
            argv.append("--src-tls-verify=false")
        tmp = target.with_suffix(".tar.partial")
        tmp.unlink(missing_ok=True)
        argv += [f"docker://{ref}", f"docker-archive:{tmp}:{ref}"]
        try:
            run(argv, timeout=3600)
        except CommandError as exc:
            tmp.unlink(missing_ok=True)
            raise WorkspaceError(
                f"skopeo could not copy {ref}: {(exc.stderr or str(exc)).strip()[-500:]}"
            ) from exc
        finally:
            if auth_path:
                os.unlink(auth_path)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
