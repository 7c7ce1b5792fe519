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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

import mtgpu
from mtgpu import clock, lograte, logsetup
from mtgpu.accounts import local as local_policy
from mtgpu.accounts.provision import Account, LocalAccounts
from mtgpu.accounts.published import DATASETS_ROOT, Published, Publisher, link_home
from mtgpu.accounts.quota import DiskQuotas
from mtgpu.accounts.registry import Registry, key_id
from mtgpu.api import admin as admin_api
from mtgpu.api import alloc as alloc_api
from mtgpu.api import cluster as cluster_api
from mtgpu.api import drains as drain_api
from mtgpu.api import jobs as job_api
from mtgpu.api import policy as policy_api
from mtgpu.api import published as published_api
from mtgpu.api import servers as server_api
from mtgpu.api import steps as step_api
from mtgpu.api import terminals as terminal_api
from mtgpu.api import users as user_api
from mtgpu.api import workspaces as workspace_api
from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.api.jobs import cut_off_text
from mtgpu.api.unix import serve_lines, start_unix_api
from mtgpu.clock import PolicyClock
from mtgpu.cluster.homes import layout as homes_layout
from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.cluster.lease import lease_seconds, remove_lease
from mtgpu.cluster.starts import StartBatcher, StartRefusedForNow, StartUnanswered
from mtgpu.cmdline import with_examples
from mtgpu.config import Options, load, show
from mtgpu.config.options import plan_reload
from mtgpu.errors import ApiError, CommandError, ConfigError, MtgpuError, ValidationError
from mtgpu.gateway.session import Gateway, container_store_env, ungranted_message
from mtgpu.gpuinfo.sampler import Sampler
from mtgpu.jobstate import FINAL_STATES
from mtgpu.proc import arun
from mtgpu.schedd import fence
from mtgpu.schedd.agent import Agent
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobenv import JobLaunch, JobUser
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.runner import Runner
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.vramwatch import VramWatch
from mtgpu.scripts import TENANT_TOOLS
from mtgpu.sshd import hostcerts
from mtgpu.sshd.hostcerts import HostCertificates
from mtgpu.sshd.limits import Penalties
from mtgpu.sshd.server import start_ssh_server
from mtgpu.state import durable
from mtgpu.state.audit import AuditLog
from mtgpu.state.codec import JobRecord, StateFormatError
from mtgpu.state.store import LEADER_FALLBACK, StateStore
from mtgpu.tmux.runtime import LiveTerminals
from mtgpu.tmux.runtime import session_env as tmux_session_env
from mtgpu.workspaces.jobs import IMAGE_SUBSYSTEM, JobContainers
from mtgpu.workspaces.podman import Podman, real_podman
from mtgpu.workspaces.service import Workspaces
from mtgpu.workspaces.storage import LocalStores, local_root

log = logging.getLogger("mtgpu.server")

#: mtgpu-server's exit status for state of a format this release cannot read (at start,
#: or sent by a scheduler of a newer release): systemd's unit does not restart it
#: (RestartPreventExitStatus), since starting again would refuse again.
EXIT_STATE_FORMAT = 3

#: The longest a submission waits for members that have not reported (seconds).
SETTLE_MAX = 20.0
#: How many times a start a member did not answer is asked for.
START_TRIES = 5
#: How long a start a member refuses for now (``starting``: it is loading its state
#: after a restart) is asked for again (seconds), as ApiClient waits for a starting daemon.
START_REFUSED_WAIT = 120.0

SYSTEM_UID_MAX = 999
#: ``nobody`` (the kernel's overflow UID, shared by unprivileged daemons and squashed
#: NFS clients) and the 32-bit "no UID" values: never a person's account.
NOBODY_UIDS = frozenset({65534, 4294967294, 4294967295})


def system_uid(uid: int) -> bool:
    """Whether ``uid`` is a system account's, which is never an MTGPU user."""
    return uid <= SYSTEM_UID_MAX or uid in NOBODY_UIDS


class _SchedulerSide:
    """What the cluster runtime asks of this member's scheduler.

    A cycle: the scheduler replicates through the runtime's store, and the runtime
    hands the scheduler reports, asks it for leases and tells it of leadership. This
    narrow object is made first and given to the runtime; it reaches the scheduler
    once the daemon has made it, and until then answers as if there were none."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def report(self, inv: Any) -> None:
        if self._daemon.scheduler is not None:
            self._daemon.scheduler.report(inv)

    def grant(self, name: str) -> float | None:
        return self._daemon.scheduler.grant(name) if self._daemon.scheduler is not None else None

    def unreported(self) -> list[str]:
        return self._daemon.scheduler.unknown() if self._daemon.scheduler is not None else []

    async def leadership(self, leader: bool) -> None:
        await self._daemon._leadership(leader)


class Daemon:
    """The running parts of one host."""

    def __init__(self, options: Options, config_path: str | None = None) -> None:
        self.options = options
        #: The configuration file a reload rereads (None: $MTGPU_CONFIG or the default).
        self.config_path = config_path
        self.registry = Registry(options.tenant_uid_range)
        self.accounts = LocalAccounts(options.tenant_home_root, options.tenant_shell)
        # Admin actions go to the replicated audit log; until start() has registered
        # every operation, one not known yet is answered "starting".
        self.dispatcher = Dispatcher(auditor=lambda *a: admin_api.write_audit(self, *a), starting=True)
        self.penalties = Penalties(options.ssh_penalty_failures, options.ssh_penalty_seconds)
        self.tools_dir = str(Path(options.run_dir) / "bin")
        self.terminals = LiveTerminals()  # the ptys served, to tell dead connections
        self.jobs = JobTable()
        self.drains = Drains()  # members admins drained (replicated)
        self.audit = AuditLog()  # admin actions (replicated)
        # The agent, made at start, samples with the sampler, and the sampler asks it
        # which job a process belongs to: it gets _job_of, which reaches the agent.
        self.sampler = Sampler(options, job_of=self._job_of)
        self.store: StateStore | None = None
        self.scheduler: Scheduler | None = None
        self.agent: Agent | None = None
        self.identity = (
            ClusterIdentity.derive(options.cluster_id, options.cluster_key)
            if options.cluster_mode == "cluster"
            else None
        )
        self.raft: Any = None  # the Raft transport over peer channels, in a cluster
        #: This member's host certificates (set by start_ssh_server, in a cluster).
        self.host_certs: HostCertificates | None = None
        self.cluster: Any = None  # mtgpu.cluster.runtime.ClusterRuntime, in a cluster
        #: The log index this member's replica must apply before it schedules, from
        #: when it last became the scheduler (None: it never has).
        self._leading_from: int | None = None
        #: Starts on other members, batched per member (the scheduler's side).
        self._starts: StartBatcher | None = None
        self._last_inv: Any = None
        self._servers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        #: mtgpu-server's exit status once stopping is set (EXIT_STATE_FORMAT: state it
        #: cannot read reached it from the scheduler).
        self.exit_status = 0
        self._unlisten: Callable[[], None] | None = None
        self.workspaces: Workspaces | None = None  # container workspaces
        self.job_containers: JobContainers | None = None  # containerized jobs
        #: Tenants' container stores on this member's disk (CONTAINERS.storage), or
        #: None: in their homes.
        self.container_stores: LocalStores | None = None
        #: Tenant sessions' cgroup and private namespace (made at start).
        self.fence: fence.TenantFence | None = None
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
            return JobUser(
                name, uid, uid, str(Path(self.options.tenant_home_root) / name), self.options.tenant_shell
            )

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
            found = self.accounts.existing(name)
            if found is None or found.uid != uid:
                raise MtgpuError(f"the account {name!r} (UID {uid}) does not exist on this host")
            why = await asyncio.to_thread(lambda: self.local_refusal(pwd.getpwuid(uid)))
            if why is not None:
                raise MtgpuError(why)
            acct = found
        return JobUser.from_account(acct)

    async def cancel_jobs_of(self, name: str, why: str) -> list[str]:
        """Cancel every pending or running job (and workspace reservation) of ``name``."""
        ids = [j.job_id for j in self.jobs.active_records() if j.user == name]
        if not ids:
            return []
        r = await self.replicate(self.jobs.cancel, ids, "an admin", time.time(), why)
        if self.scheduler is not None:
            self.scheduler.forget(r["cancelled"])
        return sorted(r["cancelled"] + r["stopping"])

    async def peer_session(self, process: asyncssh.SSHServerProcess, name: str) -> None:
        """A channel from another member (authenticated by its cluster certificate)."""
        if process.subsystem == "mtgpu-raft" and self.raft is not None:
            await self.raft.accept(process.stdin, process.stdout, name)
        elif process.subsystem == IMAGE_SUBSYSTEM and self.job_containers is not None:
            await self.job_containers.serve_image(process, name, self.accounts.existing)
        elif process.subsystem == "mtgpu-peer":
            await serve_lines(
                process.stdin, process.stdout, self.dispatcher, Caller(f"mtgpu-peer.{name}", 0, True, "peer")
            )
        else:
            process.stderr.write(b"mtgpu: this member serves no such peer channel yet\n")
            process.exit(1)

    def is_admin_name(self, name: str) -> bool:
        u = self.registry.get(name)
        return name in self.options.admins or bool(u and u["admin"])

    def caller_for(self, account: Account, via: str) -> Caller:
        return Caller(account.name, account.uid, self.is_admin_name(account.name), via)

    def _api_limits(self) -> tuple[int, int]:
        return self.options.api_max_connections_per_user, self.options.api_max_connections

    def local_refusal(self, pw: pwd.struct_passwd) -> str | None:
        """Why the OS account ``pw``, not a registry user, may not use MTGPU here
        (LOCAL_ACCOUNTS, a removed tenant, an expired account), or None."""
        o = self.options
        facts = local_policy.LocalFacts(
            pw.pw_name,
            pw.pw_uid,
            pw.pw_gecos,
            pw.pw_shell,
            local_policy.shadow_expired(pw.pw_name),
            self.registry.retired_uid(pw.pw_uid),
            pw.pw_name in o.admins,
            self.registry.local_grant(pw.pw_name, o.cluster_name),
        )
        return local_policy.refusal(facts, o.local_accounts, o.cluster_name)

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
        why = self.local_refusal(pw)
        if why is not None:
            raise ApiError(why, "refused")
        return Caller(pw.pw_name, uid, pw.pw_name in self.options.admins, "socket")

    async def catch_up(self) -> bool:
        """Bring this member's replica up to the scheduler's log (read-your-writes);
        True once done, False on a standalone host or if it could not in time."""
        if self.cluster is None:
            return False
        try:
            await self.cluster.catch_up()
            return True
        except ApiError as exc:
            log.info("could not catch up with the scheduler's log: %s", exc)
            return False

    async def local_key_allowed(self, username: str, key_line: str) -> bool:
        """Whether an existing local account lists ``key_line`` in its authorized_keys.

        The file is read by a process running as that account, never by root.
        """
        acct = self.accounts.existing(username)
        if acct is None or system_uid(acct.uid):
            return False
        if self.registry.by_uid(acct.uid) is not None:
            return False  # a managed tenant's UID under another name: never trust it
        try:
            why = await asyncio.to_thread(lambda: self.local_refusal(pwd.getpwnam(username)))
        except KeyError:
            return False
        if why is not None:
            log.info("refusing login as %r: %s", username, why)
            return False
        path = os.path.join(acct.home, ".ssh", "authorized_keys")
        try:
            # As the account, so its own permissions decide; a file that never ends
            # (a FIFO) is given up after 10 s and its reader killed.
            read = await arun(
                ["cat", "--", path],
                user=acct.uid,
                group=acct.gid,
                extra_groups=list(acct.groups),
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                timeout=10,
                check=False,
                stderr=False,
            )
        except CommandError:
            return False
        if read.returncode != 0:
            return False
        data = read.stdout
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
            # Tenants' private /tmp shows what is published even where it lies there.
            if self.fence is not None:
                self.fence.keep_also(
                    [
                        *self.options.datasets_directories,
                        *(i.prefix for i in self.published.interpreters if i.ok),
                    ]
                )

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
        (``release.json``, written by mtgpu-setup install, or the job table's full
        dump), or a dump with a damaged job record, before anything opens it. State of
        an older format is converted as the store loads it (mtgpu.state.codec)."""
        import json

        from mtgpu.state import codec

        stamp = Path(self.options.state_dir) / "release.json"
        try:
            data = json.loads(stamp.read_text())
            fmt, by = int(data.get("state_format", 1)), str(data.get("version", "?"))
        except (OSError, ValueError, AttributeError, TypeError):
            fmt, by = 1, ""
        if fmt > mtgpu.STATE_FORMAT:
            raise codec.StateFormatError(codec.newer_text(f"STATE_DIR {self.options.state_dir}", fmt, by))
        dumped = codec.check_state_dir(self.options.state_dir)
        if dumped is not None and dumped < mtgpu.STATE_FORMAT:
            log.info(
                "STATE_DIR holds state format %d; converting it to format %d", dumped, mtgpu.STATE_FORMAT
            )

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
                raise MtgpuError(
                    f"{key} {d} cannot be written: {exc.strerror}. Fix its "
                    f"permissions or point {key} elsewhere"
                ) from exc
        self._check_state_format()
        # The daemon's temporary files (asyncssh puts a forwarded agent's socket in a
        # directory of its own there) lie in a root-owned directory under RUN_DIR, which
        # tenants' private /tmp keeps visible; 0711: tenants reach what they are handed
        # and list nothing.
        tmp = Path(o.run_dir) / "tmp"
        tmp.mkdir(mode=0o711, exist_ok=True)
        st = tmp.lstat()
        if not tmp.is_dir() or tmp.is_symlink() or st.st_uid != os.geteuid():
            raise MtgpuError(f"{tmp} is not a directory of the daemon's own; remove it and restart")
        os.chmod(tmp, 0o711)
        tempfile.tempdir = str(tmp)
        tools = Path(self.tools_dir)
        tools.mkdir(exist_ok=True)
        os.chmod(tools, 0o755)
        here = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None
        sources = [Path(sys.executable).parent] + ([here] if here else [])
        # Commands put on tenants' PATH (RUN_DIR/bin), linked from beside this interpreter.
        for name in TENANT_TOOLS:
            # mt-job-fast, where the installer could compile it, is mt-job's fast path.
            cands = ("mt-job-fast", "mt-job") if name == "mt-job" else (name,)
            src = next((s / c for c in cands for s in sources if (s / c).exists()), None)
            link = tools / name
            if link.is_symlink() or link.exists():
                link.unlink()
            if src is not None:
                link.symlink_to(src)

    async def start(self) -> None:
        """Start this host's daemon: wire() makes its parts and starts them."""
        await self.wire()

    async def wire(self) -> None:
        """Make this host's parts and start them, top to bottom: the daemon's one
        composition root. Each part gets what it uses in its constructor; the one
        cycle (the cluster runtime and the scheduler) goes through _SchedulerSide."""
        self._prepare_dirs()
        o = self.options
        loop = asyncio.get_running_loop()
        self._listen_for_refused_state(loop)
        # Its network runs the DNS relays on this loop.
        self.fence = fence.from_options(
            o, extra_keep=[sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent)], loop=loop
        )
        log.info("%s", self.fence.describe())
        if self.fence.network is not None:
            log.info("%s", self.fence.network.describe())
        for line in self.fence.lacking():
            log.warning("isolation: %s", line)
        self.container_stores = await asyncio.to_thread(self._local_stores)
        admin_api.recent_log()  # `mtgpu-admin logs` shows what is logged from now on
        lograte.install()  # a flood of one kind of line is summarized, not written
        # Before any tenant can log in: datasets are read-only from the first session.
        await self.publish()
        user_api.register(self.dispatcher, self)
        published_api.register(self.dispatcher, self)
        terminal_api.register(self.dispatcher, self.terminals)
        self._last_inv = await self.sample()
        gateway = Gateway(self)
        consumers = [self.registry, self.jobs, self.drains, self.audit]
        if self.identity is not None:
            from mtgpu.cluster.runtime import ClusterRuntime

            # The runtime needs the scheduler (reports, leases, leadership) and the
            # scheduler the runtime's store: the runtime is made first, with the
            # narrow _SchedulerSide, which reaches the scheduler once it is made.
            side = _SchedulerSide(self)
            self.cluster = ClusterRuntime(
                o,
                self.identity,
                lambda: self._last_inv,
                drains=self.drains,
                on_store=self._use_store,
                on_leader=side.leadership,
                on_report=side.report,
                grant=side.grant,
                unreported=side.unreported,
                replica_digest=self.jobs.digest,
            )
            cluster_api.register_hello(self.dispatcher, self.cluster)
            # Peers find each other through the SSH server, so it starts first.
            self._servers.append(
                await start_unix_api(o.api_socket, self.dispatcher, self.identify_uid, self._api_limits)
            )
            self._servers.append(await start_ssh_server(self, gateway))
            if self.host_certs is not None:  # renewed well before they expire
                self._tasks.append(loop.create_task(self.host_certs.run()))
                hostcerts.register(self.dispatcher, self.host_certs)
            self.store = await self.cluster.open_store(consumers)
            self.raft = self.cluster.transport
        else:
            self.store = StateStore(o.server_name, consumers, o.state_dir)
        await self.store.wait_ready(timeout=120)
        await asyncio.to_thread(self._link_homes)
        cluster = self.cluster
        network_on, network_off = self._job_network()
        runner = Runner(
            Path(o.state_dir) / "jobs",
            python=sys.executable,
            tenant_namespace=self.fence.namespace,  # jobs share their tenant's /tmp
            tenant_net_namespace=self.fence.net_namespace,  # ... and its loopback
            job_network_on=network_on,
            job_network_off=network_off,
            # A job's `tmux -L mtgpu` reaches the tenant's one tmux server, as its
            # sessions' does (in the session cgroup, which has no GPUs).
            tenant_env=lambda uid, gid: {
                k: v for k, v in tmux_session_env(o.run_dir, uid, gid).items() if k == "TMUX_TMPDIR"
            },
            workdir_help=cluster.workdir_help if cluster is not None else None,  # homes may not be shared
        )
        await asyncio.to_thread(runner.build_jobinit)  # mtgpu-setup install built it already
        # Container workspaces: reservations in the job table, podman as the tenant
        # (their published ports on the tenant's loopback). Started further down.
        workspaces = Workspaces(self, Podman(fence=self.fence))
        job_containers = JobContainers(
            workspaces,
            connect=cluster.peers.connection if cluster is not None else None,
            homes_shared_with=(
                (lambda: homes_layout(cluster.members)["shares"].get(o.server_name, []))
                if cluster is not None
                else None
            ),
        )
        self.agent = Agent(
            o.server_name,
            self.jobs,
            runner,
            self.sampler,
            self.replicate,
            self.user_for,
            address=cluster.address.rsplit(":", 1)[0] if cluster is not None else "127.0.0.1",
            address_of=(
                (lambda name: a.rsplit(":", 1)[0] if (a := cluster.addresses.get(name)) else None)
                if cluster is not None
                else None
            ),
            # What a job's srun reaches: the tenants' commands and this daemon's API.
            tools_dir=self.tools_dir,
            api_socket=o.api_socket,
            on_change=self._jobs_changed,
            prepare_container=job_containers.prepare,
            job_env=lambda u: container_store_env(self, u.uid, u.gid),
            rendezvous_ports=o.rendezvous_ports,
            job_network=network_on is not None,
        )
        # In a cluster: a submission the members that reported cannot run waits for
        # the others as long as they may take (a member silent for CLUSTER_LOST_AFTER
        # since the scheduler started counts as lost), within the peers' 30 s
        # forwarding bound. Leases (mtgpu.cluster.lease): CLUSTER_LOST_AFTER is the
        # lease bound, and a new scheduler waits out what a deposed one may still
        # have granted.
        in_cluster = cluster is not None
        self.scheduler = Scheduler(
            self.jobs,
            self.replicate,
            self.dispatch,
            term=self.term,
            aging_per_hour=o.priority_aging,
            drains=self.drains,
            members=(lambda: cluster.members.members) if in_cluster else None,
            own_name=o.server_name if in_cluster else None,
            state_current=self._state_current if in_cluster else None,
            grace=min(o.cluster_lost_after, SETTLE_MAX) if in_cluster else 0.0,
            lost_after=o.cluster_lost_after if in_cluster else None,
            lease=lease_seconds(o.cluster_lost_after, o.cluster_fence_grace) if in_cluster else None,
            takeover_wait=LEADER_FALLBACK if in_cluster else 0.0,
        )
        self.scheduler.report(self._last_inv)
        self.agent.start()
        agent = self.agent
        self.vram_watch = VramWatch(
            self.sampler.process_use,
            agent.vram_shares,
            agent.job_processes,
            agent.stop_vram,
            interval=o.vram_watch_interval,
            tolerance=o.vram_tolerance,
        )
        self._tasks += [
            loop.create_task(self._sample_loop()),
            loop.create_task(self._retention_loop()),
            loop.create_task(self.vram_watch.run()),
        ]
        job_api.register(self.dispatcher, self)  # type: ignore[arg-type]  # self.scheduler is made above
        alloc_api.register(self.dispatcher, self)
        self.steps = step_api.StepLog()
        step_api.register(self.dispatcher, self, self.steps)
        server_api.register(self.dispatcher, self)
        drain_api.register(self.dispatcher, self)
        admin_api.register(self.dispatcher, self)
        self._register_host_ops()
        self.workspaces = workspaces
        workspace_api.register(self.dispatcher, workspaces)
        workspaces.start()
        self.job_containers = job_containers
        policy_api.register(self.dispatcher, self, self.retention)
        await self.quotas.start()
        self._tasks.append(loop.create_task(self._tenant_retention_loop()))
        if cluster is not None:
            await cluster.start(self.replicate)
            cluster_api.register(self.dispatcher, cluster)
            # On a member that is not the scheduler, tenant job operations go to the leader.
            self.dispatcher.use(cluster_api.leader_forwarding(cluster, self))  # type: ignore[arg-type]  # as above
            cluster_api.register_relayed(self.dispatcher, self.jobs, agent.dispatch, agent.rendezvous_port)
        else:
            remove_lease(Path(o.state_dir) / "jobs")  # nobody else's jobs to fence against
            self.scheduler.start()
            self._servers.append(
                await start_unix_api(o.api_socket, self.dispatcher, self.identify_uid, self._api_limits)
            )
            self._servers.append(await start_ssh_server(self, gateway))
        self.dispatcher.started()
        # Written whole, then renamed: a reader (mtgpu-setup, a test) never sees it empty.
        tmp = Path(o.run_dir, f".mtgpu.pid.{os.getpid()}")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, Path(o.run_dir, "mtgpu.pid"))
        log.info("MTGPU %s serving SSH on %s:%d as %s", mtgpu.__version__, *o.ssh_listen, o.server_name)

    def _job_network(
        self,
    ) -> tuple[Callable[[JobLaunch], None] | None, Callable[[str], None] | None]:
        """With private tenant networks: what gives a multi-member job's part its job
        network as it starts (netns.JobNet), and what removes it as a job ends (None,
        None without)."""
        assert self.fence is not None
        net = self.fence.network
        if net is None or not net.private:
            return None, None

        def on(la: JobLaunch) -> None:
            ports = self.agent.rendezvous_ports if self.agent is not None else self.options.rendezvous_ports
            net.open_job(la.job_id, la.user.uid, la.node_rank, la.member_addrs, ports)

        return on, net.close_job

    def _jobs_changed(self) -> None:
        """A job started or ended here: the scheduler looks again, sessions' GPUs change."""
        if self.scheduler is not None:
            self.scheduler.kick()
        self.session_gpus()

    def _job_of(self) -> Callable[[int], str | None] | None:
        """Which job a process belongs to, for the sampler; None before the agent exists.

        The sampler is made before the agent (which samples with it): it gets this
        method, which reaches the agent once there is one."""
        return self.agent.job_processes().job_of if self.agent is not None else None

    def _state_current(self) -> bool:
        """Whether this member's replica has applied everything committed before it
        became the scheduler (its member list may lack members until then)."""
        target, store = self._leading_from, self.cluster.store if self.cluster is not None else None
        return target is None or (store is not None and store.sync.raftLastApplied >= target)

    def _use_store(self, store: StateStore) -> None:
        """A role change reopened the replicated store: use the new one (and its transport)."""
        self.store, self.raft = store, self.cluster.transport

    async def _leadership(self, leader: bool) -> None:
        """The scheduler runs on the Raft leader only; a new one rebuilds its queue."""
        assert self.scheduler is not None
        if leader:
            if self.cluster is not None:
                # What the last scheduler committed (members that joined, jobs) is in
                # this member's log but maybe not yet applied: until it is, the member
                # list may lack members, and the inventory is not known to be complete.
                self._leading_from = self.cluster.last_index()
            self.scheduler.report(self._last_inv)
            self.scheduler.start()
        else:
            await self.scheduler.stop()

    async def dispatch(self, job: JobRecord, term: int) -> None:
        """Start each member's part of a placed job, all at once: here directly, elsewhere
        by peer call. If any part cannot start, this raises and the job fails; the
        members whose part did start stop it (their agents see the job ended)."""
        assert self.agent is not None
        members = job.nodes
        port = 0
        if len(members) > 1:
            # The member that runs rank 0 picks the rendezvous port, free there now.
            rank0 = members[0]
            try:
                if rank0 == self.options.server_name:
                    port = self.agent.rendezvous_port()
                else:
                    assert self.cluster is not None
                    port = int((await self.cluster.peers.call(rank0, "job.rendezvous"))["port"])
            except Exception as exc:
                raise MtgpuError(f"its rank-0 member {rank0} gave no rendezvous port: {exc}") from exc

        async def one(node: str) -> None:
            if node == self.options.server_name:
                assert self.agent is not None
                self.session_gpus(job)  # before the job can open its GPUs
                await self.agent.dispatch(job, term, port)
            else:
                assert self.cluster is not None
                if self._starts is None:
                    self._starts = StartBatcher(self.cluster.peers.call)
                loop = asyncio.get_running_loop()
                refused_until = loop.time() + START_REFUSED_WAIT
                attempt = 0
                while True:
                    try:
                        await self._starts.start(node, job.job_id, term, job.attempt, port)
                        return
                    except StartRefusedForNow as exc:
                        # Nothing was done there: a member restarted after a failover
                        # (its scheduler's start is asked for again) is loading its state.
                        if loop.time() >= refused_until:
                            raise MtgpuError(f"its part on {node} could not start: {exc}") from exc
                        log.info(
                            "%s refused the start of %s for now (%s); asking again", node, job.job_id, exc
                        )
                        await asyncio.sleep(1.0)
                    except StartUnanswered as exc:
                        # Lost with its connection (the member changing role, say): it
                        # may have started; asking again starts it at most once.
                        attempt += 1
                        if attempt == START_TRIES:
                            raise MtgpuError(f"its part on {node} could not start: {exc}") from exc
                        log.info(
                            "no answer from %s to the start of %s (%s); asking again",
                            node,
                            job.job_id,
                            exc,
                        )
                        await asyncio.sleep(1.0)
                    except Exception as exc:
                        raise MtgpuError(f"its part on {node} could not start: {exc}") from exc

        results = await asyncio.gather(*(one(node) for node in members), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    def check_in_touch(self) -> None:
        """Refuse (retryably: nothing is done) while this member is cut off from its
        cluster's majority: a submission taken there could be lost, and one relayed
        from there waits for an answer that cannot come."""
        from mtgpu.errors import ApiError

        since = self.store.out_of_touch_since() if self.store is not None else None
        if since is not None:
            raise ApiError(cut_off_text(since), "no_leader")

    async def sample(self) -> Any:
        """This member's inventory, with SIMULATED_CPUS applied and its RAM as jobs are
        offered it: the session pool (SESSIONS_MEMORY) taken out."""
        import dataclasses

        inv = await asyncio.to_thread(self.sampler.sample)
        if self.options.simulated_cpus:
            inv = dataclasses.replace(
                inv, host=dataclasses.replace(inv.host, cpus=self.options.simulated_cpus)
            )
        if self.fence is not None:
            total, used = await asyncio.to_thread(
                self.fence.offered_ram, inv.host.ram_total, inv.host.ram_used
            )
            inv = dataclasses.replace(inv, host=dataclasses.replace(inv.host, ram_total=total, ram_used=used))
        return inv

    def session_gpus(self, starting: JobRecord | None = None) -> None:
        """SESSION_GPUS free: keep tenant sessions off the GPUs jobs hold here now
        (and those of ``starting``, a job about to start here)."""
        if self.fence is None or self.options.session_gpus != "free":
            return
        jobs = [*self.jobs.active_records(), *([starting] if starting else [])]
        indices = {
            i for j in jobs for m in j.members if m.node == self.options.server_name for i in m.gpu_indices
        }
        try:
            every = {g.index for g in self._last_inv.gpus} if self._last_inv else set()
        except AttributeError:
            every = set()
        per_gpu = {i: set(self.sampler.device_nodes([i])) for i in every | indices}
        shared = set.intersection(*per_gpu.values()) if len(per_gpu) > 1 else set()
        devices = set()
        for i in indices:
            for node in per_gpu.get(i, set()) - shared:  # nvidiactl, UVM: every GPU's
                try:
                    st = os.stat(node)
                except OSError:
                    continue
                devices.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
        self.fence.set_held_gpus(devices)

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.usage_sample_interval)
            self.session_gpus()
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

    async def purge_usage(self, now: float) -> int:
        """Drop usage sums of days older than USAGE_RETENTION_DAYS and roll days older
        than DAILY_DAYS into months (when there are any)."""
        from mtgpu.schedd.usage import DAILY_DAYS, day_of

        before = day_of(now - self.options.usage_retention_days * 86400)
        # Whole months only, so that no month is part days, part month row.
        roll = day_of(now - DAILY_DAYS * 86400)[:8] + "01"
        if not any(k[:10] < before or (k[7] == "-" and k[:10] < roll) for k in list(self.jobs.usage)):
            return 0
        return int(await self.replicate(self.jobs.purge_usage, before, roll))

    async def purge_jobs(self, now: float) -> int:
        try:
            await self.purge_usage(now)
        except Exception:  # noqa: BLE001 - the job records' retention goes on
            log.exception("usage retention failed")
        cutoff = now - self.options.job_retention_days * 86400
        old = [j for j in self.jobs.all() if j["state"] in FINAL_STATES and (j.get("end_time") or 0) < cutoff]
        if not old:
            return 0
        assert self.agent is not None
        # The tenant's record keeps the last job end (TENANT_RETENTION_DAYS counts it),
        # as the job record that held it goes.
        ends: dict[str, float] = {}
        for j in old:
            ends[j["user"]] = max(ends.get(j["user"], 0.0), j.get("end_time") or 0.0)
        for name, end in sorted(ends.items()):
            u = self.registry.get(name)
            if u is not None and (u.get("last_active") or 0) < end:
                await self.replicate(self.registry.record_activity, name, end)
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
        from mtgpu.schedd.jobenv import default_output_dir

        cluster = j.get("log_cluster") or ""
        target = os.path.join(user.home, default_output_dir(cluster)[2:].replace("%j", j["job_id"]))

        # In the tenant's fence (session cgroup, mount and network namespaces), as
        # everything that runs with a tenant's UID; where the fence cannot be made
        # the files stay (they are the tenant's own, under its quota).
        fenced = self.fence if os.geteuid() == 0 else None
        if fenced is None and user.uid != os.geteuid():
            return
        try:
            prefix = await asyncio.to_thread(fenced.prefix, user.uid, user.gid, [], "/") if fenced else []
        except MtgpuError as exc:
            log.warning("kept the logs of job %s: %s", j["job_id"], exc)
            return

        async def as_tenant(*argv: str) -> bytes:
            done = await arun(
                [*prefix, *argv],
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                timeout=600,
                check=False,
                stderr=False,
            )
            return done.stdout

        try:
            if not cluster:
                # A record from before per-cluster directories: ~/.mtgpu/jobs/ID may be
                # another cluster's (shared homes), so it goes only if nothing in it was
                # written after this job ended.
                after = f"@{int((j.get('end_time') or 0) + 60)}"
                if await as_tenant("find", target, "-newermt", after, "-print", "-quit"):
                    log.info("kept %s: written after job %s ended (another cluster's?)", target, j["job_id"])
                    return
            await as_tenant("rm", "-rf", "--one-file-system", "--", target)
        except (OSError, CommandError):
            log.warning("could not remove the logs of job %s", j["job_id"])

    def _register_host_ops(self) -> None:
        from mtgpu.api.dispatcher import arg
        from mtgpu.config import parse_size
        from mtgpu.errors import ApiError, GpuProbeError

        async def simulate(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """Set a simulated GPU's outside use, or what a job's process holds on its
            simulated GPUs (for tests and demos)."""
            if self.sampler.simulated is None:
                raise ValidationError(
                    f"{self.options.server_name} has real GPUs, not SIMULATED_GPUS: "
                    "their use is what the driver reports and cannot be set"
                )
            try:
                used = parse_size(arg(args, "used", (str, int)))
                if args.get("job") is not None:
                    answer = self._simulate_job(
                        str(arg(args, "job", (str, int))), used, arg(args, "pid", int, None)
                    )
                else:
                    node = arg(args, "node", str)
                    if node != self.options.server_name:
                        raise ApiError(
                            f"no member {node!r} here; this is {self.options.server_name}", "not_found"
                        )
                    self.sampler.simulated.set_outside_used(arg(args, "index", int), used)
                    answer = {"node": node, "index": args["index"], "used": used}
            except (ValueError, GpuProbeError) as exc:
                raise ValidationError(str(exc)) from exc
            inv = await self.sample()
            assert self.scheduler is not None
            self.scheduler.report(inv)
            self.scheduler.kick()
            return answer

        self.dispatcher.register("simulate", simulate, admin=True, audit=True)

        def config_reload(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """Reread the configuration file, as SIGHUP does; say what was applied and
            which changed keys need a restart."""
            return self.reload(self.config_path)

        self.dispatcher.register("config.reload", config_reload, admin=True, audit=True)

    def _simulate_job(self, jid: str, used: int, pid: int | None) -> dict[str, Any]:
        """Make a process of job ``jid`` (its main process, or ``pid``) hold ``used``
        bytes of each of the job's simulated GPUs here."""
        import psutil

        from mtgpu.errors import ApiError, ValidationError
        from mtgpu.jobstate import RUNNING

        assert self.agent is not None and self.sampler.simulated is not None
        here = self.options.server_name
        j = self.jobs.record(jid)
        if j is None:
            raise ApiError(f"no job {jid}", "not_found")
        m = j.member_on(here)
        if j.state != RUNNING or m is None:
            where = ", ".join(j.nodes)
            raise ValidationError(
                f"job {jid} is {j.state} and does not run on {here}"
                + (f"; run this on {where}" if where else "")
            )
        if not m.gpu_indices:
            raise ValidationError(f"job {jid} holds no GPUs on {here}")
        if pid is None:
            sup = self.agent.runner.supervisor_pid(jid)
            try:
                kids = (
                    sorted(psutil.Process(sup).children(), key=lambda p: p.create_time())
                    if sup is not None
                    else []
                )
            except psutil.Error:
                kids = []
            if not kids:
                raise ValidationError(f"job {jid} has no running process on {here} yet")
            pid = kids[0].pid
        for i in m.gpu_indices:
            self.sampler.simulated.set_process_used(i, pid, used, m.vram_per_gpu)
        return {"node": here, "job": jid, "gpus": list(m.gpu_indices), "pid": pid, "used": used}

    def _listen_for_refused_state(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop (_stop_for_state) when the store refuses a dump from the scheduler;
        the refusal comes on PySyncObj's thread."""

        def refused(why: str) -> None:
            loop.call_soon_threadsafe(self._stop_for_state, why)

        self._unlisten = durable.on_refused_dump(refused)

    def _stop_for_state(self, why: str) -> None:
        """The scheduler sent state of a newer format (a newer release leads): stop
        with EXIT_STATE_FORMAT, which systemd does not restart, rather than serve
        from state this release would misread."""
        log.critical(
            "stopping: %s. This member serves nothing until it runs that release: "
            "mtgpu-setup install on it, then start it again",
            why,
        )
        self.exit_status = EXIT_STATE_FORMAT
        self.stopping.set()

    async def stop(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
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
            except (TimeoutError, Exception):  # noqa: BLE001
                pass
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        if self.fence is not None and self.fence.network is not None:
            await asyncio.to_thread(self.fence.network.close)
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
            log.info(
                "podman is not installed; CONTAINERS.storage (%s) applies once it is and the daemon restarts",
                root,
            )
            return None
        stores = LocalStores(root, podman)
        try:
            stores.prepare()
        except OSError as exc:
            hint = (
                ""
                if exc.errno is None
                # our own message says what to do
                else ". Make it a local directory root can write, or set CONTAINERS.storage to another one"
            )
            raise MtgpuError(
                f"CONTAINERS.storage: the tenants' container stores cannot be kept in {root}: {exc}{hint}"
            ) from exc
        return stores

    def reload(self, config: str | None) -> dict[str, Any]:
        """Apply a changed configuration, or keep the old one if the new one is bad.

        Every changed key is either applied or, if only a restart applies it
        (mtgpu.config.options.RELOAD), kept at its old value and named, in the log and
        in the answer: ``{"source", "applied": [KEY], "needs_restart": [KEY]}``, with
        ``"error"`` when the file was refused (then nothing changed)."""
        try:
            new = load(config)
        except ConfigError as exc:
            log.error("reload: keeping the old configuration: %s", exc)
            return {"source": config or "", "error": str(exc), "applied": [], "needs_restart": []}
        plan = plan_reload(self.options, new)
        if plan.needs_restart:
            log.warning(
                "reload: %s changed but need a restart (systemctl restart mtgpu); "
                "their old values stay in force until then",
                ", ".join(plan.needs_restart),
            )
        new = self.options = plan.options

        async def republish() -> None:  # a dataset or interpreter may have been fixed too
            await self.publish()
            await asyncio.to_thread(self._link_homes)

        self._tasks.append(asyncio.get_running_loop().create_task(republish()))
        self.penalties.configure(new.ssh_penalty_failures, new.ssh_penalty_seconds)
        if self.agent is not None:
            self.agent.use_rendezvous_ports(new.rendezvous_ports)
        logging.getLogger("mtgpu").setLevel(new.log_level)
        logsetup.resize(new.log_max_size, new.log_keep)
        log.info(
            "reload: configuration reloaded from %s; applied: %s",
            new.source or "defaults",
            ", ".join(plan.applied) or "nothing changed",
        )
        return {
            "source": new.source,
            "applied": list(plan.applied),
            "needs_restart": list(plan.needs_restart),
        }


async def serve(options: Options, config: str | None) -> int:
    daemon = Daemon(options, config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, daemon.stopping.set)
    loop.add_signal_handler(signal.SIGINT, daemon.stopping.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload, config)
    try:
        await daemon.start()
    except MtgpuError as exc:
        print(f"mtgpu-server: {exc}", file=sys.stderr)
        await daemon.stop()
        return EXIT_STATE_FORMAT if isinstance(exc, StateFormatError) else 1
    await daemon.stopping.wait()
    log.info("stopping")
    await daemon.stop()
    return daemon.exit_status


def _raise_nofile(want: int = 65536) -> None:
    """Descriptors as the systemd unit gives them (LimitNOFILE), also when started by
    hand: the connection limits (API_MAX_CONNECTIONS, SSH_MAX_*) are reached long
    before the descriptors run out."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtgpu-server",
        description="The MTGPU daemon, in the foreground (systemd's mtgpu.service runs it; "
        "on hosts without systemd, mtgpu-setup start does).",
    )
    parser.add_argument(
        "--config", help="configuration file (default $MTGPU_CONFIG, then /etc/mtgpu/mtgpu.yaml)"
    )
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument(
        "--show",
        action="store_true",
        help="with --check: print every key's effective value and where it comes from, like sshd -T",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="log to PATH, rotated by LOG_MAX_SIZE and LOG_KEEP, instead of standard error "
        "(mtgpu-setup start uses this)",
    )
    return with_examples(
        parser,
        {
            "": "mtgpu-server --check\nmtgpu-server --check --show --config /etc/mtgpu/mtgpu.yaml\n"
            "mtgpu-server --config /etc/mtgpu/mtgpu.yaml"
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    moved = os.environ.get(clock.WALL_OFFSET_ENV)
    if moved:  # a test moving this daemon's wall clock (mtgpu.clock)
        clock.shift_wall_clock(moved)
    try:
        options = load(args.config)
    except ConfigError as exc:
        print(f"mtgpu-server: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print("\n".join(show(options)) if args.show else f"{options.source or 'defaults'}: OK")
        return 0
    try:
        logsetup.setup(
            options.log_level, log_file=args.log_file, max_size=options.log_max_size, keep=options.log_keep
        )
    except OSError as exc:
        print(f"mtgpu-server: cannot open the log {args.log_file}: {exc}", file=sys.stderr)
        return 1
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    asyncssh.set_log_level(logging.WARNING)
    if moved:
        log.warning(
            "this daemon's wall clock is moved by the seconds in %s (%s: for tests)",
            moved,
            clock.WALL_OFFSET_ENV,
        )
    from mtgpu.gateway.spawn import use_pidfd_reaping

    use_pidfd_reaping()
    _raise_nofile()
    try:
        return asyncio.run(serve(options, args.config or os.environ.get("MTGPU_CONFIG")))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
