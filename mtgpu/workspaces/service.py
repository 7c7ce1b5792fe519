"""The daemon's side of workspaces: reservations in the job table, containers as the tenant.

**One ledger.** A workspace's GPUs, CPUs and RAM are reserved by a job-table record
of its own (``name: workspace-NAME``, a ``workspace`` marker, pinned to this member)
whose script only holds the reservation (``sleep infinity``). The scheduler queues,
places and fences it exactly like any job, the agent starts and re-adopts its
holder like any job, ``mt-job nodes`` shows which GPU it holds, and a cancel ends it.
No scheduler code knows about workspaces.

**Full host.** A create whose reservation cannot be placed now waits in the queue
(state PENDING, with Slurm's reason and a position); the container is made when the
reservation is placed. ``--no-queue`` refuses instead.

**Stop.** ``stop`` stops the container and keeps the reservation, so ``start`` is
immediate and gets the same GPUs. ``stop --release`` also gives the resources back;
the next ``start`` reserves again (and may queue). If the new reservation has other
GPUs, the container is committed and re-created on them: the writable layer and the
home carry over. ``rm`` ends the reservation and removes the container.

Host-local facts (which reservation a container was made for, what the tenant last
asked for, the last error) live in ``STATE_DIR/workspaces/UID/NAME.json``, root's.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import json
import logging
import os
import pwd
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from mtgpu.config import Options
from mtgpu.jobspec import spec_to_dict
from mtgpu.jobstate import ACTIVE_STATES, FINAL_STATES, PENDING, RUNNING
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.types import KNOWN_BRANDS, GpuMode, JobSpec, ResourceRequest
from mtgpu.workspaces import cdi
from mtgpu.workspaces.devcontainer import (
    build_argv,
    devcontainer_cli_argv,
    merge_overrides,
    spec_from_devcontainer,
)
from mtgpu.workspaces.images import ImageArchives
from mtgpu.workspaces.podman import ContainerRuntime, Podman, which
from mtgpu.workspaces.policy import (
    canonical_image,
    check_image,
    check_podman,
    create_argv,
    mount_args,
    publish_args,
)
from mtgpu.workspaces.types import (
    NAME_RE,
    SAVED_PREFIX,
    Mount,
    Policy,
    PolicyRefusal,
    Tenant,
    WorkspaceError,
    WorkspaceSpec,
)

log = logging.getLogger("mtgpu.workspaces")

HOLDER = (
    "#!/bin/sh\n# MTGPU workspace {name}: this job holds the workspace's reservation.\n"
    "# `mt-container rm {name}` (or cancelling it) ends it.\nexec sleep infinity\n"
)
#: Commands MTGPU puts on tenants' PATH when workspaces are on (name -> console script).
SHIMS = {"podman": "mt-podman", "docker": "mtgpu-docker"}


class WorkspaceHost(Protocol):
    options: Options
    jobs: JobTable
    scheduler: Any
    sampler: Any
    tools_dir: str

    async def replicate(self, method: Any, *args: Any) -> Any: ...


@dataclasses.dataclass
class Record:
    """What this host remembers about one workspace (root's JSON file)."""

    name: str
    user: str
    uid: int
    spec: dict[str, Any]
    image: str
    reservation: str | None = None
    applied: str | None = None
    gpus: list[int] = dataclasses.field(default_factory=list)
    desired: str = "running"
    error: str = ""
    created: float = 0.0
    post_create_done: bool = False

    @property
    def key(self) -> tuple[int, str]:
        return self.uid, self.name


class Workspaces:
    """Creates, lists and drives the workspaces of this member."""

    def __init__(self, host: WorkspaceHost, runtime: ContainerRuntime | None = None) -> None:
        self.host = host
        self.runtime = runtime or Podman()
        self.records: dict[tuple[int, str], Record] = {}
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self._prepull: asyncio.Task[Any] | None = None
        self.prepull_results: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- basics

    @property
    def options(self) -> Options:
        return self.host.options

    @property
    def enabled(self) -> bool:
        return self.options.containers.enabled

    @property
    def state_dir(self) -> Path:
        return Path(self.options.state_dir) / "workspaces"

    @property
    def archives(self) -> ImageArchives:
        return ImageArchives(self.options.containers, self.options.run_dir)

    def _lock(self, key: tuple[int, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def start(self) -> None:
        """Load the records, put the shims on tenants' PATH, start the reconcile loop."""
        self._load()
        self.link_shims()
        if self.enabled:
            from mtgpu.workspaces.hostcheck import tun_needs_fix

            if tun_needs_fix():  # udev resets it at boot; rootless networking needs 0666
                os.chmod("/dev/net/tun", 0o666)
                log.info("made /dev/net/tun mode 0666 for rootless podman networking")
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._loop())
        if self.enabled and self.options.containers.prepull:
            self._prepull = loop.create_task(self.prepull())

    async def stop(self) -> None:
        for t in (self._task, self._prepull):
            if t is not None:
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):  # stopping anyway
                    log.debug("workspace task ended while stopping", exc_info=True)

    def link_shims(self) -> None:
        """``podman`` and ``docker`` first on tenants' PATH: MTGPU's policy wrappers."""
        tools = Path(self.host.tools_dir)
        if not tools.is_dir():
            return
        sources = [Path(sys.executable).parent]
        if sys.argv and sys.argv[0]:
            sources.append(Path(sys.argv[0]).resolve().parent)
        for name, script in SHIMS.items():
            link = tools / name
            if link.is_symlink() or link.exists():
                link.unlink()
            src = next((s / script for s in sources if (s / script).exists()), None)
            if self.enabled and src is not None:
                link.symlink_to(src)

    def _load(self) -> None:
        if not self.state_dir.is_dir():
            return
        for f in self.state_dir.glob("*/*.json"):
            try:
                r = Record(**json.loads(f.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipping the workspace record %s: %s", f, exc)
                continue
            self.records[r.key] = r

    def _save(self, r: Record) -> None:
        d = self.state_dir / str(r.uid)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state_dir, 0o700)
        tmp = d / f".{r.name}.json.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(r), indent=1))
        os.replace(tmp, d / f"{r.name}.json")
        self.records[r.key] = r

    def names_of(self, uid: int) -> list[str]:
        """The workspaces of ``uid`` on record here, running, stopped or released."""
        return sorted(name for (u, name) in list(self.records) if u == uid)

    def forget(self, uid: int) -> list[str]:
        """Drop the records (state files) of a removed tenant's workspaces."""
        names = self.names_of(uid)
        for name in names:
            r = self.records.get((uid, name))
            if r is not None:
                self._drop(r)
        try:
            (self.state_dir / str(uid)).rmdir()
        except OSError:
            pass
        return names

    def _drop(self, r: Record) -> None:
        self.records.pop(r.key, None)
        (self.state_dir / str(r.uid) / f"{r.name}.json").unlink(missing_ok=True)

    # --------------------------------------------------------------- tenants

    def tenant(self, name: str, uid: int) -> Tenant:
        """The caller's account, with its XDG_RUNTIME_DIR made (0700, the tenant's)."""
        if uid == 0:
            raise WorkspaceError("root has no workspaces; log in as the tenant")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError as exc:
            raise WorkspaceError(f"UID {uid} has no account on this host") from exc
        try:
            groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            groups = (pw.pw_gid,)
        t = Tenant(pw.pw_name, uid, pw.pw_gid, pw.pw_dir, groups, pw.pw_shell or "/bin/sh")
        ensure_runtime_dir(t)
        stores = getattr(self.host, "container_stores", None)
        if stores is not None:
            try:
                store = stores.ensure(uid, pw.pw_gid)
            except OSError as exc:
                raise WorkspaceError(f"your container store here cannot be made: {exc}") from exc
            t = dataclasses.replace(t, storage_conf=stores.conf, storage_dir=store)
        return t

    def held_gpus(self, user: str) -> list[int]:
        """Host GPU indices this tenant holds here now (jobs and workspaces)."""
        node = self.options.server_name
        out: list[int] = []
        for j in self.host.jobs.active_records():
            if j.user != user or j.state != RUNNING:
                continue
            m = j.member_on(node)
            if m is not None:
                out += [i for i in m.gpu_indices if i not in out]
        return out

    def gpu_devices(self, indices: list[int]) -> tuple[list[str], list[str], dict[str, str]]:
        """(CDI names, device nodes, extra env) for host GPUs ``indices``."""
        if not indices:
            return [], [], {}
        specs = cdi.load_specs()
        names = cdi.device_names(specs)
        inv = self.host.scheduler.nodes.get(self.options.server_name) if self.host.scheduler else None
        cdis: list[str] = []
        rest: list[int] = []
        for i in indices:
            g = inv.gpu(i) if inv is not None else None
            pick = None
            if g is not None and g.brand == "nvidia" and names:
                pick = cdi.pick_name(names, "nvidia.com/gpu", [g.uuid, g.visibility_id])
            if pick:
                cdis.append(pick)
            else:
                rest.append(i)
        nodes: list[str] = []
        env: dict[str, str] = {"MTGPU_GPUS": ",".join(str(i) for i in indices)}
        if rest:
            try:
                nodes = list(self.host.sampler.device_nodes(rest))
                if not nodes:  # simulated GPUs: no device files, only the variables
                    env.update(self.host.sampler.visibility_env(rest))
            except Exception as exc:
                raise WorkspaceError(f"GPUs {rest}: {exc}") from exc
        return cdis, nodes, env

    def policy(self, t: Tenant) -> Policy:
        """What this tenant's podman may be asked to do here now."""
        c = self.options.containers
        reg = (c.registry or {}).get("url", "")
        images = {canonical_image(tpl["image"], reg) for tpl in c.templates.values()}
        images |= {canonical_image(r, reg) for r in c.prepull}
        try:
            cdis, nodes, _ = self.gpu_devices(self.held_gpus(t.name))
        except WorkspaceError as exc:  # a GPU missing from the last sample: none passed
            log.warning("GPU devices of %s: %s", t.name, exc)
            cdis, nodes = [], []
        specs = cdi.load_specs()
        published = getattr(self.host, "published", None)
        if published is not None:
            datasets = tuple(d.source for d in published.datasets if d.ok)
            interpreters = tuple(i.prefix for i in published.interpreters if i.ok and i.read_only)
        else:
            datasets = tuple(d for d in self.options.datasets_directories if os.path.isdir(d))
            interpreters = ()
        return Policy(
            home=t.home,
            datasets=datasets,
            interpreters=interpreters,
            port_publishing=c.port_publishing,
            network=c.network,
            allow_user_images=c.allow_user_images,
            images=tuple(sorted(images)),
            registry=reg,
            devices=tuple(nodes),
            cdi_devices=tuple(cdis),
            runtime_dir=t.runtime_dir,
            storage_dir=t.storage_dir,
            storage_conf=t.storage_conf,
            system_sources=tuple(sorted(cdi.host_paths(specs))),
            job_network_host=c.job_network == "host",
        )

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise WorkspaceError(
                "container workspaces are off on this host; an admin turns "
                "them on with CONTAINERS.enabled: true"
            )

    # ---------------------------------------------------------------- create

    def build_spec(self, name: str, args: Mapping[str, Any]) -> WorkspaceSpec:
        """The workspace a create request describes (template, image, saved or devcontainer)."""
        c = self.options.containers
        sources = [k for k in ("template", "image", "saved", "devcontainer") if args.get(k)]
        if len(sources) != 1:
            raise WorkspaceError(
                "say where the workspace comes from: exactly one of --template, "
                "--image, --saved or --devcontainer"
            )
        src = sources[0]
        if src == "template":
            tname = args["template"]
            tpl = c.templates.get(tname)
            if tpl is None:
                known = ", ".join(sorted(c.templates)) or "none"
                raise WorkspaceError(f"no template {tname!r} here (templates: {known})")
            spec = WorkspaceSpec(
                name=name,
                image=tpl["image"],
                source=f"template:{tname}",
                gpus=tpl["gpus"],
                gpu_type=tpl["gpu_type"],
                cpus=tpl["cpus"],
                ram=tpl["ram"],
                ports=tuple(tpl["ports"]),
                env=dict(tpl["env"]),
                mounts=tuple(Mount(m["source"], m["target"], m["readonly"]) for m in tpl["mounts"]),
                command=tuple(tpl["command"]),
            )
        elif src == "image":
            spec = WorkspaceSpec(name=name, image=args["image"], source="image")
        elif src == "saved":
            saved = args["saved"]
            if not NAME_RE.match(saved):
                raise WorkspaceError(f"{saved!r} is not a saved-image name")
            spec = WorkspaceSpec(name=name, image=f"{SAVED_PREFIX}{saved}:latest", source=f"saved:{saved}")
        else:
            dc = args["devcontainer"]
            if not isinstance(dc, dict) or not isinstance(dc.get("config"), dict):
                raise WorkspaceError("devcontainer needs {config: {...}, path: ...}")
            path = str(dc.get("path") or "")
            if not path.startswith("/"):
                raise WorkspaceError("the devcontainer.json path must be absolute")
            spec = spec_from_devcontainer(dc["config"], name=name, config_path=path)
        return merge_overrides(spec, args)

    async def create(self, user: str, uid: int, args: Mapping[str, Any]) -> dict[str, Any]:
        self._require_enabled()
        name = str(args.get("name") or "")
        if not NAME_RE.match(name):
            raise WorkspaceError(
                f"{name!r} is not a workspace name: use lower-case letters, "
                "digits, '.', '_' or '-', starting with a letter or digit"
            )
        t = self.tenant(user, uid)
        if (uid, name) in self.records:
            raise WorkspaceError(
                f"you already have a workspace {name!r}; `mt-container rm {name}` removes it"
            )
        spec = self.build_spec(name, args)
        pol = self.policy(t)
        # Everything the policy can refuse is refused now, before anything is reserved.
        if spec.build is None and not spec.source.startswith("saved:"):
            check_image(spec.image, pol)
        publish_args(spec.ports, pol)
        mount_args(spec, t, pol, self.options.containers.cache_volumes)
        if spec.run_args:
            check_podman(
                ["create", *spec.run_args, "image"], dataclasses.replace(pol, allow_user_images=True)
            )
        async with self._lock((uid, name)):
            if (uid, name) in self.records:  # a create of the same name got here first
                raise WorkspaceError(f"you already have a workspace {name!r}")
            image = await asyncio.to_thread(self._prepare_image, t, spec, pol)
            rec = Record(name=name, user=user, uid=uid, spec=spec.to_dict(), image=image, created=time.time())
            self._save(rec)
            try:
                await self._reserve(rec)
            except Exception:
                self._drop(rec)
                raise
        return await self._settle(rec, float(args.get("wait", 20)), bool(args.get("queue", True)))

    def _prepare_image(self, t: Tenant, spec: WorkspaceSpec, pol: Policy) -> str:
        """Make sure the image is in the tenant's store; return the name to create from."""
        if spec.build is not None:
            if not pol.allow_user_images:
                raise PolicyRefusal(
                    "user-images", "building a devcontainer's Dockerfile needs CONTAINERS.allow_user_images"
                )
            cli = which("devcontainer")
            if cli:
                podman = getattr(self.runtime, "binary", "podman")
                self.runtime.run_tool(t, devcontainer_cli_argv(cli, spec.build, spec.image, podman))
            else:
                self.runtime.build(t, build_argv(spec.build, spec.image), spec.build.context)
            return spec.image
        image = self.archives.resolve(spec.image)
        if self.runtime.image_exists(t, image):
            return image
        archive = self.archives.path_for(spec.image)
        if archive:
            self.runtime.load(t, archive)
            return image
        if spec.source.startswith("saved:"):
            raise WorkspaceError(
                f"you have no saved image {spec.source[6:]!r}; `mt-container save WORKSPACE NAME` makes one"
            )
        if image in self.archives.wanted():
            raise WorkspaceError(
                f"{image} is to be pre-pulled but is not here yet; try again "
                "in a minute or ask an admin (mtgpu-admin logs)"
            )
        self.runtime.pull(t, image)
        return image

    def _request(self, spec: WorkspaceSpec) -> ResourceRequest:
        brand = spec.gpu_type if spec.gpu_type in KNOWN_BRANDS else None
        gtype = spec.gpu_type if spec.gpu_type and spec.gpu_type not in KNOWN_BRANDS else None
        return ResourceRequest(
            gpus=spec.gpus,
            gpu_brand=brand,
            gpu_type=gtype,
            gpu_mode=GpuMode.SHARED if spec.vram else GpuMode.EXCLUSIVE,
            vram=spec.vram,
            cpus=spec.cpus,
            ram=spec.ram,
            nodes=1,
            servers=(self.options.server_name,),
        )

    async def _reserve(self, rec: Record) -> str:
        """Submit the reservation (a holder job) and remember it."""
        from mtgpu.errors import JobError

        spec = WorkspaceSpec.from_dict(rec.spec)
        request = self._request(spec)
        await self.host.scheduler.settle(request)
        try:
            self.host.scheduler.check_submit(request)
        except JobError as exc:
            raise WorkspaceError(f"the reservation can never be placed here: {exc}") from exc
        t = self.tenant(rec.user, rec.uid)
        job = JobSpec(
            request=request,
            script=HOLDER.format(name=rec.name),
            name=f"workspace-{rec.name}",
            output="/dev/null",
            error="/dev/null",
            workdir=t.home,
        )
        record = {
            "user": rec.user,
            "uid": rec.uid,
            "name": job.name,
            "spec": spec_to_dict(job),
            "workdir": t.home,
            "workspace": {"name": rec.name, "node": self.options.server_name},
        }
        r = await self.host.replicate(self.host.jobs.submit, record, None, time.time(), uuid.uuid4().hex)
        self.host.scheduler.accepted(r["tasks"])
        rec.reservation = r["job_id"]
        rec.desired = "running"
        rec.error = ""
        self._save(rec)
        return r["job_id"]

    async def _settle(self, rec: Record, wait: float, queue: bool) -> dict[str, Any]:
        """Wait a little for the reservation to be placed and the container to run."""
        deadline = time.monotonic() + (wait if queue else min(wait, 5.0))
        while time.monotonic() < deadline:
            job = self.host.jobs.record(rec.reservation or "")
            if job is None or job.state in FINAL_STATES:
                break
            if job.state == RUNNING and job.start_time:
                await self.apply(rec.key)
                break
            if job.state == PENDING and rec.reservation in self.host.scheduler.pending_info:
                break  # the scheduler has looked and it waits: say so now
            await asyncio.sleep(0.1)
        job = self.host.jobs.record(rec.reservation or "")
        if not queue and job is not None and job.state == PENDING:
            info = self.host.scheduler.pending_info.get(rec.reservation)
            await self._cancel(rec)
            self._drop(rec)
            why = f"{info.reason}: {info.message}" if info else "no room now"
            raise WorkspaceError(
                f"this host cannot hold the workspace now ({why}); without --no-queue it waits in the queue"
            )
        return self.view(rec, self._container_map(self.tenant(rec.user, rec.uid)))

    async def _cancel(self, rec: Record) -> None:
        job = self.host.jobs.record(rec.reservation or "")
        if job is not None and job.state in ACTIVE_STATES:
            r = await self.host.replicate(self.host.jobs.cancel, [job.job_id], rec.user, time.time())
            self.host.scheduler.forget(r["cancelled"])

    # ------------------------------------------------------- the container

    async def apply(self, key: tuple[int, str]) -> None:
        """Make the container match a placed reservation (create, start or move it)."""
        async with self._lock(key):
            rec = self.records.get(key)
            if rec is None:
                return
            job = self.host.jobs.record(rec.reservation or "")
            if (
                job is None
                or job.state != RUNNING
                or not job.start_time
                or job.cancel_requested
                or rec.applied == job.job_id
            ):
                return
            member = job.member_on(self.options.server_name)
            if member is None:
                return
            gpus = list(member.gpu_indices)
            try:
                await asyncio.to_thread(self._apply, rec, job.job_id, gpus)
            except Exception as exc:  # noqa: BLE001 - reported on the workspace, resources freed
                log.warning("workspace %s of %s could not start: %s", rec.name, rec.user, exc)
                rec.error = str(exc)
                rec.desired = "stopped"
                self._save(rec)
                await self._cancel(rec)

    def _apply(self, rec: Record, job_id: str, gpus: list[int]) -> None:
        t = self.tenant(rec.user, rec.uid)
        spec = WorkspaceSpec.from_dict(rec.spec)
        existing = self._container_map(t).get(rec.name)
        image = rec.image
        if existing is not None and sorted(rec.gpus) != sorted(gpus):
            # Other GPUs this time: keep the writable layer, re-create on the new devices.
            image = f"localhost/mtgpu-carry/{rec.name}:latest"
            self.runtime.commit(t, rec.name, image)
            self.runtime.remove(t, rec.name)
            existing = None
        if existing is None:
            pol = self.policy(t)
            cdis, nodes, env = self.gpu_devices(gpus)
            self._cache_dirs(t)
            argv = create_argv(
                spec,
                t,
                dataclasses.replace(pol, allow_user_images=True),
                image=image,
                reservation=job_id,
                cache_volumes=self.options.containers.cache_volumes,
                devices=[*cdis, *nodes],
                env=env,
            )
            self.runtime.create(t, argv)
        within = self._reservation_cgroups(job_id)
        if rec.desired == "running":
            self.runtime.start(t, rec.name, within=within)
        rec.applied, rec.gpus, rec.error = job_id, gpus, ""
        self._save(rec)
        if not rec.post_create_done and spec.post_create and rec.desired == "running":
            rec.post_create_done = True
            self._save(rec)
            for command in spec.post_create:
                p = self.runtime.exec(t, rec.name, list(command), user=spec.user, within=within)
                if p.returncode != 0:
                    rec.error = (
                        f"postCreateCommand {' '.join(command)!r} exited {p.returncode}: "
                        f"{(p.stderr or p.stdout).strip()[-500:]}"
                    )
                    self._save(rec)
                    break

    def _reservation_cgroups(self, job_id: str) -> list[str]:
        """The ``cgroup.procs`` files of the job that holds a workspace's reservation here
        (root's files, written by its supervisor before the job ran): what the container's
        ``podman start`` and ``exec`` join, so the workspace runs within its GPUs and
        memory. Empty without a runner (a service used alone); a runner whose job has no
        cgroups file refuses, rather than start the workspace outside them."""
        agent = getattr(self.host, "agent", None)
        runner = getattr(agent, "runner", None)
        if runner is None:
            return []
        try:
            dirs = json.loads((runner.job_dir(job_id) / "cgroups.json").read_text())
        except (OSError, ValueError) as exc:
            raise WorkspaceError(
                f"the reservation (job {job_id}) has no cgroups here yet; start the workspace again in a moment"
            ) from exc
        return [f"{d}/cgroup.procs" for d in dirs.values()]

    def _cache_dirs(self, t: Tenant) -> None:
        """The directories behind the cache volumes, made by the tenant in the home."""
        from mtgpu.proc import run
        from mtgpu.workspaces.policy import cache_dir_name

        paths = [f"{t.home}/.mtgpu/cache/{cache_dir_name(p)}" for p in self.options.containers.cache_volumes]
        if not paths:
            return
        argv = self.runtime.fenced(t, ["mkdir", "-p", "--", *paths], what="making the cache directories")
        run(argv, env={"PATH": "/usr/bin:/bin"}, cwd="/")

    def _container_map(self, t: Tenant) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.runtime.containers(t)}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.reconcile()
            except Exception:
                log.exception("workspace reconcile failed")

    async def reconcile(self) -> None:
        """Start containers whose reservation was just placed; stop those whose ended."""
        for key, rec in list(self.records.items()):
            job = self.host.jobs.record(rec.reservation or "")
            if (
                job is not None
                and job.state == RUNNING
                and job.start_time
                and not job.cancel_requested
                and rec.applied != job.job_id
                and rec.desired == "running"
            ):
                await self.apply(key)
            elif rec.applied and (job is None or job.state in FINAL_STATES):
                async with self._lock(key):
                    if self.records.get(key) is not rec:
                        continue  # removed (or replaced) while this waited for the lock
                    t = self.tenant(rec.user, rec.uid)
                    try:
                        await asyncio.to_thread(self.runtime.stop, t, rec.name)
                    except WorkspaceError as exc:
                        log.warning("stopping released workspace %s: %s", rec.name, exc)
                    rec.applied = None
                    rec.desired = "stopped"
                    self._save(rec)

    # ------------------------------------------------------------- lookups

    def _record(self, uid: int, name: str) -> Record:
        rec = self.records.get((uid, name))
        if rec is None:
            raise WorkspaceError(f"you have no workspace {name!r} here; `mt-container list` shows yours")
        return rec

    def view(self, rec: Record, containers: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """The public form of a workspace (``mt-container list --json``)."""
        spec = WorkspaceSpec.from_dict(rec.spec)
        job = self.host.jobs.record(rec.reservation or "")
        c = containers.get(rec.name)
        cstate = c["state"] if c else ""
        reason, position = "", None
        if job is not None and job.state == PENDING:
            state = "PENDING"
            info = self.host.scheduler.pending_info.get(job.job_id)
            if info is not None:
                reason, position = f"{info.reason}: {info.message}", info.position
        elif job is not None and job.state == RUNNING and not job.cancel_requested:
            if rec.applied != job.job_id:
                state = "FAILED" if rec.error else "STARTING"
            else:
                state = "RUNNING" if cstate == "running" else "STOPPED"
        else:
            state = "RELEASED" if c else ("FAILED" if rec.error else "ENDED")
            if job is not None and job.reason and not rec.error:
                reason = job.reason
        return {
            "name": rec.name,
            "state": state,
            "container_state": cstate or None,
            "image": rec.image,
            "source": spec.source,
            "user": rec.user,
            "node": self.options.server_name,
            "reservation": rec.reservation,
            "gpus": list(rec.gpus) if state in ("RUNNING", "STOPPED") else [],
            "gpu_request": spec.gpus,
            "cpus": spec.cpus,
            "ram": spec.ram,
            "ports": (c or {}).get("ports", []),
            "requested_ports": list(spec.ports),
            "reason": reason,
            "position": position,
            "error": rec.error,
            "created": rec.created,
            "warnings": list(spec.warnings),
            "remote_user": spec.user,
            "workdir": spec.workdir or None,
        }

    # ------------------------------------------------------------ the verbs

    async def list(self, user: str, uid: int) -> list[dict[str, Any]]:
        t = self.tenant(user, uid)
        containers = await asyncio.to_thread(self._container_map, t)
        out = [self.view(r, containers) for r in self.records.values() if r.uid == uid]
        known = {r.name for r in self.records.values() if r.uid == uid}
        for name, c in containers.items():
            if name not in known:  # made by hand with the label, or from lost records
                out.append(
                    {
                        "name": name,
                        "state": "UNMANAGED",
                        "container_state": c["state"],
                        "image": c["image"],
                        "ports": c["ports"],
                        "user": user,
                        "node": self.options.server_name,
                        "reservation": None,
                        "gpus": [],
                    }
                )
        return sorted(out, key=lambda v: v["name"])

    async def show(self, user: str, uid: int, name: str) -> dict[str, Any]:
        rec = self._record(uid, name)
        t = self.tenant(user, uid)
        return self.view(rec, await asyncio.to_thread(self._container_map, t))

    async def start_ws(self, user: str, uid: int, name: str, wait: float = 20) -> dict[str, Any]:
        self._require_enabled()
        rec = self._record(uid, name)
        job = self.host.jobs.record(rec.reservation or "")
        rec.desired, rec.error = "running", ""
        self._save(rec)
        if job is not None and job.state == RUNNING and rec.applied == job.job_id:
            t = self.tenant(user, uid)
            within = self._reservation_cgroups(job.job_id)
            async with self._lock(rec.key):
                await asyncio.to_thread(self.runtime.start, t, name, within)
        elif job is None or job.state in FINAL_STATES:
            await self._reserve(rec)
        return await self._settle(rec, wait, True)

    async def stop_ws(self, user: str, uid: int, name: str, release: bool = False) -> dict[str, Any]:
        rec = self._record(uid, name)
        t = self.tenant(user, uid)
        async with self._lock(rec.key):
            rec.desired = "stopped"
            self._save(rec)
            await asyncio.to_thread(self.runtime.stop, t, name)
            job = self.host.jobs.record(rec.reservation or "")
            if release or (job is not None and job.state == PENDING):
                # A queued reservation has nothing to keep: stopping leaves the queue.
                await self._cancel(rec)
                rec.applied = None
                self._save(rec)
        return self.view(rec, await asyncio.to_thread(self._container_map, t))

    async def rm(self, user: str, uid: int, name: str) -> dict[str, Any]:
        rec = self.records.get((uid, name))
        t = self.tenant(user, uid)
        if rec is None and name not in await asyncio.to_thread(self._container_map, t):
            self._record(uid, name)  # raises: no such workspace
        async with self._lock((uid, name)):
            if rec is not None:
                await self._cancel(rec)
            await asyncio.to_thread(self.runtime.remove, t, name)
            if rec is not None:
                self._drop(rec)
        return {"name": name, "removed": True, "reservation": rec.reservation if rec is not None else None}

    async def save(self, user: str, uid: int, name: str, image_name: str) -> dict[str, Any]:
        self._record(uid, name)
        if not NAME_RE.match(image_name):
            raise WorkspaceError(
                f"{image_name!r} is not a name for a saved image: use lower-case "
                "letters, digits, '.', '_' or '-'"
            )
        t = self.tenant(user, uid)
        image = f"{SAVED_PREFIX}{image_name}:latest"
        async with self._lock((uid, name)):
            image_id = await asyncio.to_thread(self.runtime.commit, t, name, image)
        return {"workspace": name, "image": image, "saved": image_name, "id": image_id}

    async def logs(self, user: str, uid: int, name: str, tail: int = 200) -> dict[str, Any]:
        self._record(uid, name)
        t = self.tenant(user, uid)
        text = await asyncio.to_thread(self.runtime.logs, t, name, tail)
        return {
            "name": name,
            "logs": text,
            "follow_argv": [
                getattr(self.runtime, "binary", "podman"),
                "logs",
                "--follow",
                "--tail",
                "0",
                name,
            ],
        }

    async def ports(self, user: str, uid: int, name: str) -> dict[str, Any]:
        v = await self.show(user, uid, name)
        port = self.options.ssh_listen[1]
        return {
            "name": name,
            "state": v["state"],
            "ports": v["ports"],
            "requested_ports": v["requested_ports"],
            "server": self.options.server_name,
            "ssh_port": port,
            "user": user,
            "port_publishing": self.options.containers.port_publishing,
        }

    async def shell_info(self, user: str, uid: int, name: str) -> dict[str, Any]:
        v = await self.show(user, uid, name)
        if v["state"] != "RUNNING":
            raise WorkspaceError(f"workspace {name} is {v['state']}; `mt-container start {name}` first")
        t = self.tenant(user, uid)
        return {
            "name": name,
            "container": name,
            "user": v["remote_user"] or "",
            "workdir": v["workdir"] or t.home,
            "runtime_dir": t.runtime_dir,
            "storage_conf": t.storage_conf,
            "podman": getattr(self.runtime, "binary", "podman"),
            "home": t.home,
            # The job holding its reservation here, which the shell joins (job.adopt).
            "reservation": v.get("reservation"),
        }

    async def policy_view(self, user: str, uid: int) -> dict[str, Any]:
        t = self.tenant(user, uid)
        return {
            **self.policy(t).to_dict(),
            "enabled": self.enabled,
            "podman": getattr(self.runtime, "binary", "podman"),
            "tenant": t.name,
        }

    async def prepull(self, force: bool = False) -> builtins.list[dict[str, Any]]:
        """Copy the pre-pull images into their archives now."""
        results = await asyncio.to_thread(self.archives.prepull, force)
        self.prepull_results = [r.to_dict() for r in results]
        return self.prepull_results


def ensure_runtime_dir(t: Tenant) -> str:
    """``/run/user/UID``: made 0700 and the tenant's, as logind would."""
    base = Path("/run/user")
    if not base.is_dir():
        base.mkdir(parents=True, mode=0o755)
    d = Path(t.runtime_dir)
    if d.is_symlink():
        raise WorkspaceError(f"{d} is a symbolic link; an admin must remove it")
    if not d.exists():
        d.mkdir(mode=0o700)
        os.chown(d, t.uid, t.gid)
    st = d.lstat()
    if st.st_uid != t.uid:
        raise WorkspaceError(f"{d} belongs to UID {st.st_uid}, not you; an admin must remove it")
    if st.st_mode & 0o777 != 0o700:
        os.chmod(d, 0o700)
    return str(d)
