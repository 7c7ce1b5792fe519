"""Containerized jobs: the image a job names reaches the member that runs it, and
the job's ``podman run`` is made under the container policy.

A job file's ``container=IMAGE`` (``#SBATCH --container-image=IMAGE``) names a
template, ``saved:NAME`` (an image saved from one of the tenant's workspaces) or an
image. What happens to it:

1. **At submission**, on the member the tenant submits to (:meth:`JobContainers.resolve`):
   the name is checked against the policy and looked up in the tenant's own image
   store there. An image found there is recorded by its content id, with this member
   as its origin; on homes shared with other members it is also archived once under
   the home (``~/.mtgpu/images/ID.tar``, ``podman save`` as the tenant), where any
   member that shares the homes finds it. An image not found there is pulled later.
2. **On the member that runs a part** (:meth:`JobContainers.prepare`), before the
   part starts, the tenant's store there gets the image: already there (nothing is
   loaded twice), else from the home archive, else streamed from the origin member
   over the cluster's SSH connection (the ``mtgpu-image`` channel: ``podman save`` as
   the tenant there, into this member's cache under ``STATE_DIR/images``, kept up to
   ``CONTAINERS.image_cache`` bytes, least recently used first out), else a
   pre-pulled archive, else pulled from its registry (with ``CONTAINERS.registry``'s
   credentials, copied by ``skopeo`` as root so that they never reach a tenant).
   Each step is shown in ``mt-job show`` as the job's progress; an image that cannot
   arrive fails the job with the reason.
3. The container runs with ``--rm`` and the job's name, the home and cache volumes,
   the datasets read-only, the job's GPUs and, with ``CONTAINERS.job_network: host``,
   the member's network (so the parts of a ``nodes=N`` job reach each other, as
   native parts do). The job's supervisor removes it when the job ends, however it
   ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mtgpu import jsonl
from mtgpu.proc import aspawn, run
from mtgpu.schedd.jobenv import JobLaunch
from mtgpu.state.codec import JobRecord
from mtgpu.workspaces.podman import SYSTEM_PATH
from mtgpu.workspaces.policy import canonical_image, check_image, tenant_mounts
from mtgpu.workspaces.types import JOB_LABEL, SAVED_PREFIX, PodmanError, Tenant, WorkspaceError

log = logging.getLogger("mtgpu.workspaces")

#: The peer channel that streams an image from the member that has it.
IMAGE_SUBSYSTEM = "mtgpu-image"
#: The longest request on that channel (a JSON line: user, UID and image id).
IMAGE_REQUEST_BYTES = 4096
#: A streamed image that sends nothing for this long has failed.
STALL_TIMEOUT = 60.0
#: How often progress is written to the job while an image streams.
PROGRESS_EVERY = 2.0
_ID_RE = re.compile(r"^[0-9a-f]{64}$")

Progress = Callable[[str], Awaitable[None]]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def container_name(job_id: str, node_rank: int = 0, nnodes: int = 1) -> str:
    """``mtgpu-job-ID``, and ``-RANK`` after it for a part of a multi-node job: members
    that share homes share the tenant's container store, so the parts need their own
    names there."""
    return f"mtgpu-job-{job_id}" + (f"-{node_rank}" if nnodes > 1 else "")


class ImageCache:
    """Images streamed to this member, one ``ID.tar`` each (root's, 0600), at most
    ``limit`` bytes in all; the least recently used go first."""

    def __init__(self, directory: str, limit: int) -> None:
        self.dir = Path(directory)
        self.limit = limit

    def path(self, image_id: str) -> Path:
        return self.dir / f"{image_id}.tar"

    def get(self, image_id: str) -> Path | None:
        p = self.path(image_id)
        if p.is_file():
            os.utime(p)  # used now
            return p
        return None

    def evict(self, keep: str = "") -> list[str]:
        """Remove the least recently used archives until the rest fit the limit."""
        files = sorted((p for p in self.dir.glob("*.tar") if p.is_file()), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        gone = []
        for p in files:
            if total <= self.limit:
                break
            if p.stem == keep:
                continue
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
            gone.append(p.stem)
        if gone:
            log.info("image cache over %s: evicted %s", _size(self.limit), ", ".join(gone))
        return gone


class JobContainers:
    """The workspaces layer's part in containerized jobs."""

    def __init__(
        self,
        ws: Any,
        *,
        connect: Callable[[str], Awaitable[Any]] | None = None,
        homes_shared_with: Callable[[], list[str]] | None = None,
    ) -> None:
        self.ws = ws  # the Workspaces service: tenants, policy, GPUs, podman, archives
        o = ws.options
        self.node = o.server_name
        self.cache = ImageCache(str(Path(o.state_dir) / "images"), o.containers.image_cache)
        #: Given in a cluster: an open connection to a member, and which members share
        #: this member's homes.
        self.connect = connect
        self.homes_shared_with: Callable[[], list[str]] = homes_shared_with or (lambda: [])
        self._fetching: dict[str, asyncio.Lock] = {}

    @property
    def podman(self) -> str:
        return getattr(self.ws.runtime, "binary", "podman")

    # ------------------------------------------------------------ submission

    def image_name(self, ref: str) -> str:
        c = self.ws.options.containers
        tpl = c.templates.get(ref)
        if tpl is not None:
            return self.ws.archives.resolve(tpl["image"])
        if ref.startswith("saved:"):
            return f"{SAVED_PREFIX}{ref[6:]}:latest"
        return self.ws.archives.resolve(ref)

    def resolve(self, user: str, uid: int, ref: str) -> dict[str, Any]:
        """What a job's ``container=`` names, checked and found (blocking; at submission)."""
        if not self.ws.enabled:
            raise WorkspaceError(
                "containerized jobs need containers on this host; an admin "
                "turns them on with CONTAINERS.enabled: true"
            )
        t = self.ws.tenant(user, uid)
        image = self.image_name(ref)
        if not ref.startswith("saved:"):
            check_image(image, self.ws.policy(t))
        image_id = self._image_id(t, image)
        if image_id is None and ref.startswith("saved:"):
            raise WorkspaceError(
                f"you have no saved image {ref[6:]!r} here; `mt-container save WORKSPACE NAME` makes one"
            )
        src: dict[str, Any] = {
            "ref": ref,
            "image": image,
            "id": image_id,
            "origin": self.node,
            "archive": None,
        }
        if image_id is not None and self.homes_shared_with():
            src["archive"] = self._archive(t, image_id)
        return src

    def _image_id(self, t: Tenant, image: str) -> str | None:
        p = self.ws.runtime.run(t, "image", "inspect", "--format", "{{.Id}}", image, check=False)
        out = p.stdout.strip().removeprefix("sha256:")
        return out if p.returncode == 0 and _ID_RE.match(out) else None

    def _archive(self, t: Tenant, image_id: str) -> str:
        """``~/.mtgpu/images/ID.tar``, saved by the tenant's podman once per image."""
        d = f"{t.home}/.mtgpu/images"
        path = f"{d}/{image_id}.tar"
        if os.path.isfile(path):
            return path
        tmp = f"{d}/.{image_id}.tar.partial"
        self.ws.runtime.run(t, argv=["/bin/mkdir", "-p", "-m", "0700", d], what="making " + d)
        self.ws.runtime.run(
            t,
            "save",
            "--quiet",
            "--output",
            tmp,
            image_id,
            timeout=3600,
            what=f"archiving the image {image_id[:12]} in your home",
        )
        self.ws.runtime.run(t, argv=["/bin/mv", "-f", "--", tmp, path], what="archiving")
        log.info("archived image %s of %s at %s", image_id[:12], t.name, path)
        return path

    # ------------------------------------------------------------- the member

    async def prepare(self, job: JobRecord, launch: JobLaunch, progress: Progress) -> JobLaunch:
        """Get the image here and make the part's ``podman run``; raises with the reason."""
        src = job.container
        if src is None:
            raise RuntimeError(f"job {job.job_id} runs in no container")
        u = launch.user
        t = await asyncio.to_thread(self.ws.tenant, u.name, u.uid)
        image = await self.ensure_image(t, src, progress)
        return await asyncio.to_thread(self._launch, t, launch, image)

    def _launch(self, t: Tenant, launch: JobLaunch, image: str) -> JobLaunch:
        pol = self.ws.policy(t)
        c = self.ws.options.containers
        cdis, nodes, env = self.ws.gpu_devices(list(launch.gpu_indices))
        if cdis:  # CUDA numbers the GPUs a container sees from 0
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(cdis)))
        name = container_name(launch.job_id, launch.node_rank, launch.nnodes)
        argv = [
            self.podman,
            "run",
            "--rm",
            f"--name={name}",
            "--userns=keep-id",
            f"--label={JOB_LABEL}={launch.job_id}",
            f"--annotation={JOB_LABEL}={launch.job_id}",
            "--log-driver=none",
            f"--workdir={launch.workdir}",
            "--stop-timeout=5",
        ]
        argv += tenant_mounts(t, pol, c.cache_volumes)
        self.ws._cache_dirs(t)
        argv += [f"--device={d}" for d in [*cdis, *nodes]]
        if c.job_network == "host":
            argv.append("--network=host")
        elif not pol.network:
            argv.append("--network=none")
        argv.append(image)
        return replace(
            launch,
            container=image,
            container_argv=tuple(argv),
            container_name=name,
            container_script=f"{t.runtime_dir}/mtgpu-jobs/{name}.sh",
            container_env={
                "XDG_RUNTIME_DIR": t.runtime_dir,
                "PATH": SYSTEM_PATH,
                **({"CONTAINERS_STORAGE_CONF": t.storage_conf} if t.storage_conf else {}),
            },
            gpu_env=env or launch.gpu_env,
        )

    async def ensure_image(self, t: Tenant, src: Mapping[str, Any], progress: Progress) -> str:
        """The image in the tenant's store here; returns the name or id to run."""
        image_id, image = src.get("id"), src["image"]
        want = image_id or image
        rt = self.ws.runtime
        if await asyncio.to_thread(rt.image_exists, t, want):
            return want
        key = f"{t.uid}:{want}"
        lock = self._fetching.setdefault(key, asyncio.Lock())
        async with lock:  # the tasks of an array arriving together fetch it once
            if await asyncio.to_thread(rt.image_exists, t, want):
                return want
            return await self._fetch(t, src, progress)

    async def _fetch(self, t: Tenant, src: Mapping[str, Any], progress: Progress) -> str:
        image_id, image, origin = src.get("id"), src["image"], src.get("origin")
        rt = self.ws.runtime
        tried: list[str] = []
        archive = src.get("archive")
        if image_id and archive and archive.startswith(t.home.rstrip("/") + "/"):
            if await asyncio.to_thread(self._tenant_file, t, archive):
                await progress(f"loading image {image_id[:12]} from {archive}")
                await asyncio.to_thread(rt.load, t, archive)
                return image_id
            tried.append(f"{archive} is not on {self.node}")
        if image_id:
            cached = self.cache.get(image_id)
            if cached is not None:
                await progress(f"loading image {image_id[:12]} from {self.node}'s image cache")
            elif origin and origin != self.node and self.connect is not None:
                cached = await self._stream(t, image_id, origin, progress, tried)
            if cached is not None:
                await asyncio.to_thread(self._load_root_file, t, cached)
                return image_id
            if origin == self.node:
                tried.append(f"the image {image_id[:12]} is no longer in your image store")
            elif self.connect is None:
                tried.append("this member is not in a cluster")
        prepulled = self.ws.archives.path_for(image)
        if prepulled:
            await progress(f"loading pre-pulled {image}")
            await asyncio.to_thread(rt.load, t, prepulled)
            return image
        if image_id is None:
            await progress(f"pulling {image}")
            try:
                await asyncio.to_thread(self._pull, t, image)
                return image
            except WorkspaceError as exc:
                tried.append(str(exc))
        raise WorkspaceError(
            f"the image {src['ref']} cannot reach {self.node}: " + "; ".join(tried or ["no way to get it"])
        )

    def _tenant_file(self, t: Tenant, path: str) -> bool:
        """Whether the tenant can read ``path`` (checked as the tenant, never as root)."""
        p = self.ws.runtime.run(t, argv=["/usr/bin/test", "-f", path, "-a", "-r", path], check=False)
        return p.returncode == 0

    def _load_root_file(self, t: Tenant, path: Path) -> None:
        """``podman load`` as the tenant from a file only root reads (given as stdin)."""
        from mtgpu.workspaces.podman import tenant_env

        argv = self.ws.runtime.fenced(t, [self.podman, "load", "--quiet"], what="loading the image")
        with open(path, "rb") as f:
            p = run(argv, stdin=f, env=tenant_env(t), cwd="/", timeout=1800, check=False)
        if p.returncode != 0:
            raise PodmanError([self.podman, "load"], p.stderr or p.stdout, "loading the image")

    def _pull(self, t: Tenant, image: str) -> None:
        archives = self.ws.archives
        reg = self.ws.options.containers.registry or {}
        if reg.get("credentials") and canonical_image(image, archives.registry).startswith(
            archives.registry + "/"
        ):
            # The registry's credentials stay root's: skopeo copies, the tenant loads.
            target = self.cache.dir / f"pull-{re.sub(r'[^A-Za-z0-9._-]+', '_', image)}.tar"
            self.cache.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            archives._copy(canonical_image(image, archives.registry), target)
            try:
                self._load_root_file(t, target)
            finally:
                target.unlink(missing_ok=True)
            return
        try:
            self.ws.runtime.pull(t, image)
        except PodmanError as exc:
            raise WorkspaceError(f"pulling {image} failed: {exc}") from exc

    # ------------------------------------------------------------ streaming

    async def _stream(
        self, t: Tenant, image_id: str, origin: str, progress: Progress, tried: list[str]
    ) -> Path | None:
        """Copy the image from ``origin`` into this member's cache; None (with why in
        ``tried``) if it cannot come."""
        assert self.connect is not None
        await progress(f"streaming image {image_id[:12]} from {origin}")
        self.cache.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.cache.dir, 0o700)
        tmp = self.cache.dir / f".{image_id}.partial"
        t0 = time.monotonic()
        got = 0
        try:
            conn = await self.connect(origin)
            proc = await conn.create_process(subsystem=IMAGE_SUBSYSTEM, encoding=None)
            proc.stdin.write(jsonl.encode({"user": t.name, "uid": t.uid, "image": image_id}))
            proc.stdin.write_eof()
            last = t0
            with open(tmp, "wb") as f:  # noqa: ASYNC230 - the root-owned cache on local disk
                while True:
                    chunk = await asyncio.wait_for(proc.stdout.read(1 << 20), STALL_TIMEOUT)
                    if not chunk:
                        break
                    f.write(chunk)
                    got += len(chunk)
                    if time.monotonic() - last >= PROGRESS_EVERY:
                        last = time.monotonic()
                        await progress(f"streaming image {image_id[:12]} from {origin}: {_size(got)} so far")
            await asyncio.wait_for(proc.wait(), STALL_TIMEOUT)
            if proc.exit_status != 0:
                err = (await proc.stderr.read()).decode(errors="replace").strip()
                tried.append(f"{origin} could not send it: {err or 'no reason given'}")
                tmp.unlink(missing_ok=True)
                return None
        except TimeoutError:
            tried.append(f"streaming from {origin} stalled for {STALL_TIMEOUT:.0f}s")
            tmp.unlink(missing_ok=True)
            return None
        except Exception as exc:  # noqa: BLE001 - unreachable member, closed channel
            tried.append(f"{origin} is unreachable: {exc}")
            tmp.unlink(missing_ok=True)
            return None
        path = self.cache.path(image_id)
        os.replace(tmp, path)
        secs = time.monotonic() - t0
        await progress(f"streamed image {image_id[:12]} from {origin}: {_size(got)} in {secs:.1f}s")
        log.info("streamed image %s from %s: %d bytes in %.1fs", image_id[:12], origin, got, secs)
        self.cache.evict(keep=image_id)
        return path

    async def serve_image(self, process: Any, peer: str, account_of: Callable[[str], Any]) -> None:
        """The ``mtgpu-image`` channel: ``podman save`` of one image, as its owner."""
        try:
            req = await asyncio.wait_for(
                jsonl.LineReader(process.stdin, limit=IMAGE_REQUEST_BYTES).message(), 30
            )
            if req is None:
                raise ValueError("the channel closed before its request")
            user, uid, image_id = str(req["user"]), int(req["uid"]), str(req["image"])
            if not _ID_RE.match(image_id):
                raise ValueError(f"{image_id!r} is not an image id")
            acct = account_of(user)
            if acct is None or acct.uid != uid:
                raise ValueError(f"{user} (UID {uid}) has no account on {self.node}")
            t = await asyncio.to_thread(self.ws.tenant, user, uid)
        except (TimeoutError, ValueError, KeyError, TypeError, WorkspaceError) as exc:
            process.stderr.write(f"mtgpu: {exc}\n".encode())
            process.exit(2)
            return
        from mtgpu.workspaces.podman import tenant_env

        try:
            argv = await asyncio.to_thread(
                self.ws.runtime.fenced, t, [self.podman, "save", "--quiet", image_id], what="saving the image"
            )
        except WorkspaceError as exc:
            process.stderr.write(f"mtgpu: {exc}\n".encode())
            process.exit(2)
            return
        log.info("streaming image %s of %s to %s", image_id[:12], user, peer)
        p = await aspawn(
            argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=tenant_env(t),
            cwd="/",
        )
        assert p.stdout is not None and p.stderr is not None
        try:
            while chunk := await p.stdout.read(1 << 20):
                process.stdout.write(chunk)
                await process.stdout.drain()
            err = (await p.stderr.read()).decode(errors="replace").strip()
            code = await p.wait()
        except BaseException:
            if p.returncode is None:
                p.kill()
            raise
        if code != 0:
            process.stderr.write(f"podman save on {self.node}: {err[-500:]}\n".encode())
        process.exit(0 if code == 0 else 1)
