"""``mtgpu-server``: one asyncio daemon per host that wires the parts together.

Start order: configuration, state directory, replicated state, API socket, SSH
server. SIGTERM stops cleanly; SIGHUP reloads the configuration, or refuses a bad
one and keeps the old. Exit status 2 means a bad configuration, 1 any other
failure to start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import signal
import sys
import time
from pathlib import Path
from typing import Any

import asyncssh

import mtgpu
from mtgpu.accounts.provision import Account, LocalAccounts
from mtgpu.accounts.published import DATASETS_ROOT, Published, Publisher, link_home
from mtgpu.accounts.registry import Registry, key_id
from mtgpu.accounts.quota import DiskQuotas
from mtgpu.api import admin as admin_api
from mtgpu.api import drains as drain_api
from mtgpu.api import jobs as job_api
from mtgpu.api import policy as policy_api
from mtgpu.api import published as published_api
from mtgpu.api import users as user_api
from mtgpu.api import servers as server_api
from mtgpu.api import workspaces as workspace_api
from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.api.jobs import directive_container, submitted_image
from mtgpu.api.unix import serve_lines, start_unix_api
from mtgpu.clock import PolicyClock
from mtgpu.cluster.homes import layout as homes_layout
from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.cluster.starts import StartBatcher
from mtgpu.config import Options, load
from mtgpu.errors import ApiError, ConfigError, MtgpuError
from mtgpu.gateway.session import Gateway, container_store_env, ungranted_message
from mtgpu.gpuinfo.sampler import Sampler
from mtgpu.schedd.agent import Agent
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobenv import JobUser
from mtgpu.schedd.jobtable import FINAL_STATES, JobTable
from mtgpu.schedd.runner import Runner
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.sshd.server import Penalties, start_ssh_server
from mtgpu.state.audit import AuditLog
from mtgpu.state.store import StateStore
from mtgpu.workspaces.jobs import IMAGE_SUBSYSTEM, JobContainers
from mtgpu.workspaces.podman import real_podman
from mtgpu.workspaces.service import Workspaces
from mtgpu.workspaces.storage import LocalStores, local_root

log = logging.getLogger("mtgpu.server")

# Commands put on tenants' PATH (RUN_DIR/bin), linked from beside this interpreter.
TOOLS = ("mt-job", "mt-container", "mt-podman", "mt-python", "mt-attach", "mtgpu-admin")
SYSTEM_UID_MAX = 999
#: ``nobody`` (the kernel's overflow UID, shared by unprivileged daemons and squashed
#: NFS clients) and the 32-bit "no UID" values: never a person's account.
NOBODY_UIDS = frozenset({65534, 4294967294, 4294967295})


def system_uid(uid: int) -> bool:
    """Whether ``uid`` is a system account's, which is never an MTGPU user."""
    return uid <= SYSTEM_UID_MAX or uid in NOBODY_UIDS


class Daemon:
    """The running parts of one host."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.registry = Registry(options.tenant_uid_range)
        self.accounts = LocalAccounts(options.tenant_home_root, options.tenant_shell)
        self.dispatcher = Dispatcher()
        self.penalties = Penalties(options.ssh_penalty_failures, options.ssh_penalty_seconds)
        self.tools_dir = str(Path(options.run_dir) / "bin")
        self.jobs = JobTable()
        self.drains = Drains()  # members admins drained (replicated)
        self.audit = AuditLog()  # admin actions (replicated)
        self.sampler = Sampler(options)
        self.store: StateStore | None = None
        self.scheduler: Scheduler | None = None
        self.agent: Agent | None = None
        self.identity = (ClusterIdentity.derive(options.cluster_id, options.cluster_key)
                         if options.cluster_mode == "cluster" else None)
        self.raft: Any = None  # the Raft transport over peer channels, in a cluster
        self.cluster: Any = None  # mtgpu.cluster.runtime.ClusterRuntime, in a cluster
        #: Starts on other members, batched per member (the scheduler's side).
        self._starts: StartBatcher | None = None
        self._last_inv: Any = None
        self._servers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        self.workspaces: Workspaces | None = None  # container workspaces
        self.job_containers: JobContainers | None = None  # containerized jobs
        #: Tenants' container stores on this member's disk (CONTAINERS.storage), or
        #: None: in their homes.
        self.container_stores: LocalStores | None = None
        self.clock = PolicyClock.from_environment()  # time-based policy (retention)
        self.quotas = DiskQuotas(self)  # USER_DISK_LIMIT
        self.retention = policy_api.Retention(self)  # TENANT_RETENTION_DAYS
        # Datasets and interpreters published read-only (mounted at start and on SIGHUP).
        self.publisher = Publisher(options.run_dir)
        self.published = Published()
        self._publishing = asyncio.Lock()
        self.accounts.home_hooks.append(self._link_home)

    # ------------------------------------------------------------- helpers

    async def replicate(self, method: Any, *args: Any, timeout: float = 30.0) -> Any:
        assert self.store is not None
        return await self.store.call(method, *args, timeout=timeout)

    def term(self) -> int:
        assert self.store is not None
        return int(self.store.status().get("term") or 0)

    def home_of(self, caller: Caller) -> str | None:
        try:
            return pwd.getpwuid(caller.uid).pw_dir
        except KeyError:
            return None

    def job_user(self, name: str, uid: int) -> JobUser:
        """The account a job runs as, as far as this host knows it now."""
        try:
            pw = pwd.getpwuid(uid)
            return JobUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell or "/bin/sh")
        except KeyError:
            return JobUser(name, uid, uid, str(Path(self.options.tenant_home_root) / name),
                           self.options.tenant_shell)

    async def job_image(self, user: str, uid: int, ref: str) -> dict[str, Any]:
        """A containerized job's image, checked and found where the tenant submits it."""
        if self.job_containers is None:
            raise MtgpuError("this member is still starting; submit again in a moment")
        return await asyncio.to_thread(self.job_containers.resolve, user, uid, ref)

    async def user_for(self, name: str, uid: int) -> JobUser:
        """The account a job runs as on this host, created now if it is a new tenant's."""
        if self.registry.get(name) is not None:
            acct = await asyncio.to_thread(self.accounts.ensure, name, uid)
        else:
            acct = self.accounts.existing(name)
            if acct is None or acct.uid != uid:
                raise MtgpuError(f"the account {name!r} (UID {uid}) does not exist on this host")
        return JobUser.from_account(acct)

    async def peer_session(self, process: asyncssh.SSHServerProcess, name: str) -> None:
        """A channel from another member (authenticated by its cluster certificate)."""
        if process.subsystem == "mtgpu-raft" and self.raft is not None:
            await self.raft.accept(process.stdin, process.stdout, name)
        elif process.subsystem == IMAGE_SUBSYSTEM and self.job_containers is not None:
            await self.job_containers.serve_image(process, name, self.accounts.existing)
        elif process.subsystem == "mtgpu-peer":
            await serve_lines(process.stdin, process.stdout, self.dispatcher,
                              Caller(f"mtgpu-peer.{name}", 0, True, "peer"))
        else:
            process.stderr.write(b"mtgpu: this member serves no such peer channel yet\n")
            process.exit(1)

    def is_admin_name(self, name: str) -> bool:
        u = self.registry.get(name)
        return name in self.options.admins or bool(u and u["admin"])

    def caller_for(self, account: Account, via: str) -> Caller:
        return Caller(account.name, account.uid, self.is_admin_name(account.name), via)

    def identify_uid(self, uid: int) -> Caller | None:
        """The caller behind a local UID (from SO_PEERCRED); ApiError for a tenant who
        is not granted this cluster."""
        if uid == 0:
            return Caller("root", 0, True, "socket")
        u = self.registry.by_uid(uid)
        if u is not None:
            if not self.registry.granted(u["name"], self.options.cluster_name):
                raise ApiError(ungranted_message(self, u["name"]), "not_granted")
            return Caller(u["name"], uid, self.is_admin_name(u["name"]), "socket")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return None
        if system_uid(uid):
            return None
        return Caller(pw.pw_name, uid, pw.pw_name in self.options.admins, "socket")

    async def local_key_allowed(self, username: str, key_line: str) -> bool:
        """Whether an existing local account lists ``key_line`` in its authorized_keys.

        The file is read by a process running as that account, never by root.
        """
        acct = self.accounts.existing(username)
        if acct is None or system_uid(acct.uid):
            return False
        if self.registry.by_uid(acct.uid) is not None:
            return False  # a managed tenant's UID under another name: never trust it
        path = os.path.join(acct.home, ".ssh", "authorized_keys")
        try:
            proc = await asyncio.create_subprocess_exec(
                "cat", "--", path, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, user=acct.uid, group=acct.gid,
                extra_groups=list(acct.groups), env={"PATH": "/usr/bin:/bin"}, cwd="/")
            data, _ = await asyncio.wait_for(proc.communicate(), 10)
        except (OSError, asyncio.TimeoutError):
            return False
        if proc.returncode != 0:
            return False
        want = key_id(key_line)
        for line in data.decode(errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            # Options such as from="..." are not supported: such lines are skipped.
            if key_id(line) == want:
                return True
        return False

    # ------------------------------------------------------ published paths

    async def publish(self) -> None:
        """Mount the datasets and interpreters the configuration lists, read-only; a
        missing or broken one is logged and skipped."""
        async with self._publishing:  # one at a time: a reload may come during start
            try:
                self.published = await asyncio.to_thread(self.publisher.apply, self.options)
            except Exception:  # noqa: BLE001 - publishing must never stop the daemon
                log.exception("publishing datasets and interpreters failed")

    def _link_home(self, acct: Account) -> None:
        if acct.managed and any(d.ok for d in self.published.datasets):
            link_home(acct.home, acct.uid, acct.gid, DATASETS_ROOT)

    def _link_homes(self) -> None:
        """``~/datasets`` in the homes of tenants that existed before (new ones get it
        when their account is made)."""
        if not any(d.ok for d in self.published.datasets):
            return
        for name in self.registry.names():
            u = self.registry.get(name)
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            if u is not None and pw.pw_uid == u["uid"]:
                link_home(pw.pw_dir, pw.pw_uid, pw.pw_gid, DATASETS_ROOT)

    # ------------------------------------------------------------ lifecycle

    def _check_state_format(self) -> None:
        """Refuse state written by a newer MTGPU in a format this one cannot read
        (``release.json``, written by mtgpu-setup install)."""
        import json

        stamp = Path(self.options.state_dir) / "release.json"
        try:
            data = json.loads(stamp.read_text())
            fmt, by = int(data.get("state_format", 1)), str(data.get("version", "?"))
        except (OSError, ValueError, AttributeError, TypeError):
            return
        if fmt > mtgpu.STATE_FORMAT:
            raise MtgpuError(f"STATE_DIR {self.options.state_dir} holds state format {fmt}, written by "
                             f"MTGPU {by}; this is MTGPU {mtgpu.__version__}, which reads format "
                             f"{mtgpu.STATE_FORMAT}. Run MTGPU {by} or newer (mtgpu-setup install)")

    def _prepare_dirs(self) -> None:
        o = self.options
        for d, mode in ((o.state_dir, 0o700), (o.run_dir, 0o755)):
            try:
                Path(d).mkdir(parents=True, exist_ok=True)
                os.chmod(d, mode)
                probe = Path(d) / ".write-test"
                probe.write_text("ok")
                probe.unlink()
            except OSError as exc:
                key = "STATE_DIR" if d == o.state_dir else "RUN_DIR"
                raise MtgpuError(f"{key} {d} cannot be written: {exc.strerror}. Fix its "
                                 f"permissions or point {key} elsewhere") from exc
        self._check_state_format()
        tools = Path(self.tools_dir)
        tools.mkdir(exist_ok=True)
        os.chmod(tools, 0o755)
        here = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None
        sources = [Path(sys.executable).parent] + ([here] if here else [])
        for name in TOOLS:
            # mt-job-fast, where the installer could compile it, is mt-job's fast path.
            cands = ("mt-job-fast", "mt-job") if name == "mt-job" else (name,)
            src = next((s / c for c in cands for s in sources if (s / c).exists()), None)
            link = tools / name
            if link.is_symlink() or link.exists():
                link.unlink()
            if src is not None:
                link.symlink_to(src)

    async def start(self) -> None:
        self._prepare_dirs()
        o = self.options
        self.container_stores = await asyncio.to_thread(self._local_stores)
        admin_api.recent_log()  # `mtgpu-admin logs` shows what is logged from now on
        self.dispatcher.auditor = lambda *a: admin_api.write_audit(self, *a)
        # Before any tenant can log in: datasets are read-only from the first session.
        await self.publish()
        user_api.register(self.dispatcher, self)
        published_api.register(self.dispatcher, self)
        self._last_inv = await self.sample()
        gateway = Gateway(self)
        if self.identity is not None:
            from mtgpu.cluster.runtime import ClusterRuntime

            # Peers find each other through the SSH server, so it starts first.
            self.cluster = ClusterRuntime(o, self.identity, self.dispatcher, lambda: self._last_inv)
            self.cluster.register_hello()
            self._servers.append(await start_unix_api(o.api_socket, self.dispatcher, self.identify_uid))
            self._servers.append(await start_ssh_server(self, gateway))
            self.store = await self.cluster.open_store([self.registry, self.jobs, self.drains,
                                                        self.audit])
            self.cluster.drains = self.drains
            self.raft = self.cluster.transport
            self.cluster.on_store = self._use_store
        else:
            self.store = StateStore(o.server_name, [self.registry, self.jobs, self.drains,
                                                    self.audit], o.state_dir)
        await self.store.wait_ready(timeout=120)
        await asyncio.to_thread(self._link_homes)
        runner = Runner(Path(o.state_dir) / "jobs", python=sys.executable)
        if self.cluster is not None:
            runner.workdir_help = self.cluster.workdir_help  # homes may not be shared
        self.agent = Agent(o.server_name, self.jobs, runner, self.sampler, self.replicate,
                           self.user_for)
        self.scheduler = Scheduler(self.jobs, self.replicate, self.dispatch, term=self.term,
                                   aging_per_hour=o.priority_aging)
        self.agent.on_change = self.scheduler.kick
        self.agent.job_env = lambda u: container_store_env(self, u.uid, u.gid)
        self.scheduler.drains = self.drains
        self.scheduler.report(self._last_inv)
        self.agent.start()
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._sample_loop()),
                        loop.create_task(self._retention_loop())]
        job_api.register(self.dispatcher, self)
        server_api.register(self.dispatcher, self)
        drain_api.register(self.dispatcher, self)
        admin_api.register(self.dispatcher, self)
        self._register_host_ops()
        # Container workspaces: reservations in the job table, podman as the tenant.
        self.workspaces = Workspaces(self)
        workspace_api.register(self.dispatcher, self.workspaces)
        self.workspaces.start()
        self.job_containers = JobContainers(self.workspaces)
        self.agent.prepare_container = self.job_containers.prepare
        policy_api.register(self.dispatcher, self, self.retention)
        await self.quotas.start()
        self._tasks.append(loop.create_task(self._tenant_retention_loop()))
        if self.cluster is not None:
            self.scheduler.grace = 3 * o.usage_sample_interval + 2
            self.scheduler.lost_after = o.cluster_lost_after
            cluster = self.cluster
            self.agent.address = cluster.address.rsplit(":", 1)[0]
            self.agent.address_of = lambda name: (
                a.rsplit(":", 1)[0] if (a := cluster.addresses.get(name)) else None)
            self.cluster.on_leader = self._leadership
            self.cluster.on_report = self.scheduler.report
            self.job_containers.connect = cluster.peers.connection
            self.job_containers.homes_shared_with = lambda: homes_layout(cluster.members)[
                "shares"].get(o.server_name, [])
            await self.cluster.start(self.replicate)
            self._forward_to_leader(("job.submit", "job.list", "job.show", "job.cancel", "nodes",
                                     "node.drain", "node.undrain", "retention",
                                     "retention.unlock"))
        else:
            self.scheduler.start()
            self._servers.append(await start_unix_api(o.api_socket, self.dispatcher, self.identify_uid))
            self._servers.append(await start_ssh_server(self, gateway))
        Path(o.run_dir, "mtgpu.pid").write_text(f"{os.getpid()}\n")
        log.info("MTGPU %s serving SSH on %s:%d as %s", mtgpu.__version__, *o.ssh_listen,
                 o.server_name)

    def _use_store(self, store: StateStore) -> None:
        """A role change reopened the replicated store: use the new one (and its transport)."""
        self.store, self.raft = store, self.cluster.transport

    async def _leadership(self, leader: bool) -> None:
        """The scheduler runs on the Raft leader only; a new one rebuilds its queue."""
        assert self.scheduler is not None
        if leader:
            self.scheduler.report(self._last_inv)
            self.scheduler.start()
        else:
            await self.scheduler.stop()

    async def dispatch(self, job: dict[str, Any], term: int) -> None:
        """Start each member's part of a placed job, all at once: here directly, elsewhere
        by peer call. If any part cannot start, this raises and the job fails; the
        members whose part did start stop it (their agents see the job ended)."""
        assert self.agent is not None

        async def one(node: str) -> None:
            if node == self.options.server_name:
                assert self.agent is not None
                await self.agent.dispatch(job, term)
            else:
                assert self.cluster is not None
                if self._starts is None:
                    self._starts = StartBatcher(self.cluster.peers.call)
                try:
                    await self._starts.start(node, job["job_id"], term)
                except Exception as exc:
                    raise MtgpuError(f"its part on {node} could not start: {exc}") from exc

        results = await asyncio.gather(*(one(m["node"]) for m in job["placement"]["members"]),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    def _forward_to_leader(self, ops: tuple[str, ...]) -> None:
        """On a member that is not the scheduler, tenant job operations go to the leader."""
        from mtgpu.api.dispatcher import arg
        from mtgpu.errors import ApiError

        cluster = self.cluster
        assert cluster is not None
        originals = {op: self.dispatcher._ops[op] for op in ops}

        def make(op: str) -> Any:
            original = originals[op]

            async def forwarding(caller: Caller, args: dict[str, Any]) -> Any:
                if cluster.is_leader() or caller.via == "forwarded":
                    r = original.fn(caller, args)
                    return await r if asyncio.iscoroutine(r) else r
                if op == "job.submit":
                    # The tenant's image is looked up here, where they submit it.
                    src = await submitted_image(self, caller, args, directive_container(
                        arg(args, "script", str), arg(args, "overrides", dict, {})))
                    if src is not None:
                        args = {**args, "container_source": src}
                leader = cluster.leader()
                if leader is None:
                    raise ApiError("no scheduler is elected right now; retry in a few seconds",
                                   "no_leader")
                return await cluster.peers.call(leader, "forward", op=op, args=args, timeout=30,
                                                caller={"name": caller.name, "uid": caller.uid,
                                                        "admin": caller.admin})
            forwarding.__doc__ = original.doc
            return forwarding

        for op in ops:
            self.dispatcher.register(op, make(op), admin=originals[op].admin,
                                     audit=originals[op].audit)

        async def forward(caller: Caller, args: dict[str, Any]) -> Any:
            """A tenant's request relayed by another member (peers only)."""
            if caller.via != "peer":
                raise ApiError("only other members may relay requests", "forbidden")
            c = arg(args, "caller", dict)
            inner = Caller(str(c["name"]), int(c["uid"]), bool(c["admin"]), "forwarded")
            answer = await self.dispatcher.handle(inner, {"op": arg(args, "op", str),
                                                          "args": arg(args, "args", dict)})
            if not answer["ok"]:
                raise ApiError(answer["error"], answer.get("code", "error"))
            return answer["result"]

        self.dispatcher.register("forward", forward)
        assert self.agent is not None
        self.dispatcher.register("job.dispatch", job_api.dispatch_op(self.jobs, self.agent.dispatch))

    async def sample(self) -> Any:
        """This member's inventory, with SIMULATED_CPUS applied."""
        import dataclasses

        inv = await asyncio.to_thread(self.sampler.sample)
        if self.options.simulated_cpus:
            inv = dataclasses.replace(inv, host=dataclasses.replace(
                inv.host, cpus=self.options.simulated_cpus))
        return inv

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.usage_sample_interval)
            try:
                inv = await self.sample()
            except Exception:  # noqa: BLE001 - sampling must never stop the daemon
                log.exception("sampling failed")
                continue
            self._last_inv = inv
            if self.scheduler is not None and (self.cluster is None or self.cluster.is_leader()):
                self.scheduler.report(inv)

    async def _retention_loop(self) -> None:
        """Remove finished job records older than JOB_RETENTION_DAYS, and their logs."""
        while True:
            try:
                await self.purge_jobs(time.time())
            except Exception:  # noqa: BLE001
                log.exception("job retention failed")
            # Hourly, or ten times per retention period when that is shorter.
            await asyncio.sleep(max(1.0, min(3600.0, self.options.job_retention_days * 8640)))

    async def _tenant_retention_loop(self) -> None:
        """Lock, then remove, tenants inactive for TENANT_RETENTION_DAYS (on the scheduler)."""
        while True:
            days = self.options.tenant_retention_days
            # Hourly, or ten times per retention period when that is shorter.
            pause = max(1.0, min(3600.0, (days or 1) * 8640))
            await asyncio.sleep(pause)
            if days is None or (self.cluster is not None and not self.cluster.is_leader()):
                continue
            try:
                await self.retention.run(False, "retention")
            except Exception:  # noqa: BLE001 - retention must never stop the daemon
                log.exception("tenant retention failed")

    async def purge_jobs(self, now: float) -> int:
        cutoff = now - self.options.job_retention_days * 86400
        old = [j for j in self.jobs.all()
               if j["state"] in FINAL_STATES and (j.get("end_time") or 0) < cutoff]
        if not old:
            return 0
        assert self.agent is not None
        for j in old:
            await self._remove_job_files(j)
        return int(await self.replicate(self.jobs.purge, [j["job_id"] for j in old]))

    async def _remove_job_files(self, j: dict[str, Any]) -> None:
        """The runner's directory (root's), and the default log directory in the home,
        removed by a process running as the tenant, never by root."""
        assert self.agent is not None
        try:
            self.agent.runner.remove(j["job_id"])
        except (MtgpuError, OSError):
            pass
        user = self.job_user(j["user"], j["uid"])
        if user.uid == 0 or not os.path.isdir(user.home):
            return
        target = os.path.join(user.home, ".mtgpu", "jobs", j["job_id"])
        try:
            proc = await asyncio.create_subprocess_exec(
                "rm", "-rf", "--one-file-system", "--", target, user=user.uid, group=user.gid,
                extra_groups=[], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await proc.wait()
        except OSError:
            log.warning("could not remove the logs of job %s", j["job_id"])

    def _register_host_ops(self) -> None:
        from mtgpu.api.dispatcher import arg
        from mtgpu.config import parse_size
        from mtgpu.errors import ApiError, GpuProbeError

        async def simulate(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """Set a simulated GPU's outside use (for tests and demos)."""
            node = arg(args, "node", str)
            if node != self.options.server_name:
                raise ApiError(f"no member {node!r} here; this is {self.options.server_name}",
                               "not_found")
            if self.sampler.simulated is None:
                raise ApiError("this member has no SIMULATED_GPUS", "bad_request")
            try:
                used = parse_size(arg(args, "used", (str, int)))
                self.sampler.simulated.set_outside_used(arg(args, "index", int), used)
            except (ValueError, GpuProbeError) as exc:
                raise ApiError(str(exc), "bad_request") from exc
            inv = await self.sample()
            assert self.scheduler is not None
            self.scheduler.report(inv)
            self.scheduler.kick()
            return {"node": node, "index": args["index"], "used": used}

        self.dispatcher.register("simulate", simulate, admin=True, audit=True)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.quotas.stop()
        if self.workspaces is not None:
            await self.workspaces.stop()
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self._starts is not None:
            await self._starts.close()
        if self.agent is not None:
            await self.agent.stop()
        for s in self._servers:
            s.close()
        for s in self._servers:
            try:
                await asyncio.wait_for(s.wait_closed(), 3)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        try:
            Path(self.options.run_dir, "mtgpu.pid").unlink()
        except OSError:
            pass

    def _local_stores(self) -> LocalStores | None:
        """Where tenants' podman keeps its storage here: local disk, or (None) the homes."""
        o = self.options
        root = local_root(o.containers.storage, o.tenant_home_root)
        if root is None:
            return None
        podman = real_podman()
        if not os.path.isabs(podman):
            log.info("podman is not installed; CONTAINERS.storage (%s) applies once it is and "
                     "the daemon restarts", root)
            return None
        stores = LocalStores(root, podman)
        try:
            stores.prepare()
        except OSError as exc:
            hint = ("" if exc.errno is None else  # our own message says what to do
                    ". Make it a local directory root can write, or set CONTAINERS.storage to "
                    "another one")
            raise MtgpuError(f"CONTAINERS.storage: the tenants' container stores cannot be kept "
                             f"in {root}: {exc}{hint}") from exc
        return stores

    def reload(self, config: str | None) -> None:
        """Apply a changed configuration, or keep the old one if the new one is bad."""
        try:
            new = load(config)
        except ConfigError as exc:
            log.error("SIGHUP: keeping the old configuration: %s", exc)
            return
        needs_restart = [k for k in ("ssh_listen", "state_dir", "run_dir", "server_name",
                                     "cluster_mode", "cluster_id", "cluster_key")
                         if getattr(new, k) != getattr(self.options, k)]
        names = [k.upper() for k in needs_restart]
        if new.containers.storage != self.options.containers.storage:
            names.append("CONTAINERS.storage")
        if names:
            log.warning("SIGHUP: %s change only on restart (systemctl restart mtgpu)",
                        ", ".join(names))
        new = _keep(new, self.options, needs_restart)
        self.options = new

        async def republish() -> None:  # a dataset or interpreter may have been fixed too
            await self.publish()
            await asyncio.to_thread(self._link_homes)
        self._tasks.append(asyncio.get_running_loop().create_task(republish()))
        self.penalties.failures = new.ssh_penalty_failures
        self.penalties.seconds = new.ssh_penalty_seconds
        logging.getLogger("mtgpu").setLevel(new.log_level)
        log.info("SIGHUP: configuration reloaded from %s", new.source or "defaults")


def _keep(new: Options, old: Options, keys: list[str]) -> Options:
    """``new`` with ``keys`` (and CONTAINERS.storage, which only a restart applies) as in ``old``."""
    import dataclasses

    from mtgpu.config.options import replace

    containers = dataclasses.replace(new.containers, storage=old.containers.storage)
    return replace(new, containers=containers, **{k: getattr(old, k) for k in keys})


async def serve(options: Options, config: str | None) -> int:
    daemon = Daemon(options)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, daemon.stopping.set)
    loop.add_signal_handler(signal.SIGINT, daemon.stopping.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload, config)
    try:
        await daemon.start()
    except MtgpuError as exc:
        print(f"mtgpu-server: {exc}", file=sys.stderr)
        await daemon.stop()
        return 1
    await daemon.stopping.wait()
    log.info("stopping")
    await daemon.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtgpu-server", description="The MTGPU daemon.")
    parser.add_argument("--config", help="configuration file (default $MTGPU_CONFIG, then "
                                         "/etc/mtgpu/mtgpu.yaml)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--version", action="version", version=f"mtgpu {mtgpu.__version__}")
    args = parser.parse_args(argv)
    try:
        options = load(args.config)
    except ConfigError as exc:
        print(f"mtgpu-server: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{options.source or 'defaults'}: OK")
        return 0
    logging.basicConfig(level=options.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    asyncssh.set_log_level(logging.WARNING)
    try:
        return asyncio.run(serve(options, args.config or os.environ.get("MTGPU_CONFIG")))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
