"""The view-model of remotegpu-cli: every server, its hardware, usage, workspaces and
the user's jobs, kept fresh in background tasks; and the actions, each one API call.

The screen (:mod:`mtgpu.tui.screen`) and the subcommands (:mod:`mtgpu.tui.main`) only
read :class:`Fleet` and call its actions. A server that does not answer is marked
unreachable with the reason and retried later; it never holds up the others.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mtgpu.errors import RESEND_CODES, RETRYABLE_CODES, ApiError, MtgpuError
from mtgpu.jobstate import RUNNING
from mtgpu.tui.link import ServerLink, ServerUnreachable
from mtgpu.tui.sources import (
    CLUSTER,
    SSH_CONFIG,
    ServerList,
    Target,
    add_server,
    member_target,
    remove_server,
    save_server_list,
    ssh_config_hosts,
)
from mtgpu.tui.view import FINAL, GpuHistory, month_usage, usage_refused

log = logging.getLogger("remotegpu")

#: Answers after which a submission is sent again with its key: its outcome is in
#: doubt, or nothing was done (the codes mtgpu.api.client retries on too; this
#: package ships without mtgpu.api, with mtgpu.errors).
SUBMIT_RETRIED = RESEND_CODES | RETRYABLE_CODES

CONNECTING, UP, UNREACHABLE = "connecting", "up", "unreachable"


@dataclass
class ServerState:
    """What is known of one server right now."""

    target: Target
    status: str = CONNECTING
    reason: str = ""
    user: str | None = None
    server: str | None = None  # the name the server gives itself
    cluster_id: str | None = None
    members: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    workspaces: list[dict[str, Any]] | None = None  # None: workspaces are off there
    updated: float | None = None
    hidden: bool = False  # a ~/.ssh/config host that did not answer as MTGPU
    notice: str | None = None  # the server's warning for this user (retention, disk limit)
    #: The user's own usage this month there (:func:`~mtgpu.tui.view.month_usage`);
    #: None with ``usage_error`` saying why when the server did not give it.
    usage: dict[str, Any] | None = None
    usage_error: str | None = None
    #: Recent usage of each GPU, by (node, index), for the sparklines.
    history: dict[tuple[str, Any], GpuHistory] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def group(self) -> str:
        """Servers of one cluster share jobs; a standalone server is its own group."""
        return f"cluster:{self.cluster_id}" if self.cluster_id else f"server:{self.server or self.name}"

    def node(self) -> dict[str, Any] | None:
        """This server's own entry of the ``nodes`` listing."""
        for n in self.nodes:
            if n.get("name") == self.server:
                return n
        return self.nodes[0] if len(self.nodes) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        """The ``remotegpu-cli servers --json`` object."""
        n = self.node() or {}
        return {
            "name": self.name,
            "host": self.target.host,
            "port": self.target.port,
            "user": self.user or self.target.user,
            "source": self.target.source,
            "status": self.status,
            "reason": self.reason or None,
            "server": self.server,
            "notice": self.notice,
            "cluster_id": self.cluster_id,
            "state": n.get("state"),
            "cpus": n.get("cpus"),
            "cpu_percent": n.get("cpu_percent"),
            "ram_total": n.get("ram_total"),
            "ram_used": n.get("ram_used"),
            "gpus": [
                {
                    k: g.get(k)
                    for k in (
                        "index",
                        "brand",
                        "type",
                        "vram_total",
                        "vram_used",
                        "util",
                        "jobs",
                        "mig_mode",
                        "parent",
                    )
                }
                for g in n.get("gpus", [])
            ],
            "workspaces": self.workspaces,
            "usage": self.usage,
            "usage_error": self.usage_error,
            "updated": self.updated,
        }


class Fleet:
    """Every server the user can reach, refreshed in the background."""

    def __init__(
        self,
        server_list: ServerList,
        *,
        timeout: float = 10.0,
        interval: float = 2.0,
        workspace_every: int = 15,
        ssh_config: Path | None = None,
    ) -> None:
        self.server_list = server_list
        self.timeout = timeout
        self.interval = interval
        self.workspace_every = max(1, workspace_every)
        self.states: dict[str, ServerState] = {}
        self.links: dict[str, ServerLink] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._new: list[str] = []
        self._stopping = False
        self.on_change: Callable[[], None] = lambda: None
        for t in server_list.targets:
            self._add(t)
        if server_list.ssh_config:
            known = {t.host.lower() for t in server_list.targets}
            for alias in ssh_config_hosts(ssh_config):
                if alias.lower() not in known and alias not in self.states:
                    self._add(Target(name=alias, host=alias, source=SSH_CONFIG))

    # ------------------------------------------------------------ servers

    def _add(self, target: Target) -> ServerState:
        name, n = target.name, 2
        while name in self.states:
            name, n = f"{target.name}~{n}", n + 1
        target = replace(target, name=name)
        st = ServerState(target)
        self.states[name] = st
        self.links[name] = ServerLink(target, self.timeout)
        self._wake[name] = asyncio.Event()
        self._new.append(name)
        return st

    def visible(self) -> list[ServerState]:
        return [s for s in self.states.values() if not s.hidden]

    def start(self) -> None:
        """Start the background task of every server not yet running."""
        loop = asyncio.get_running_loop()
        for name in self._new:
            if name in self.states and name not in self._tasks:
                self._tasks[name] = loop.create_task(self._run(self.states[name]))
        self._new = []

    def abort(self) -> None:
        """Stop at once: cancel every refresh and drop every connection without waiting
        for any server, so that quitting never waits for the network."""
        self._stopping = True
        for t in self._tasks.values():
            t.cancel()
        for link in self.links.values():
            link.abort()

    async def stop(self) -> None:
        """:meth:`abort`, then let the cancelled tasks end (each at its next turn)."""
        tasks = list(self._tasks.values())
        self.abort()
        if tasks:
            # A cancel can be lost inside a timeout that fires at the same moment
            # (asyncio.wait_for before 3.12); the flag ends those tasks at their next
            # turn, before any further wait.
            await asyncio.wait(tasks, timeout=self.timeout + 5)
        self._tasks.clear()

    def refresh_now(self, state: ServerState | None = None) -> None:
        for name, ev in self._wake.items():
            if state is None or name == state.name:
                ev.set()

    async def _run(self, st: ServerState) -> None:
        backoff = 2.0
        while self._alive(st):
            try:
                await self._connect(st)
                backoff = 2.0
                count = 0
                while self._alive(st):
                    slow = count % self.workspace_every == 0
                    await self._refresh(st, workspaces=slow)
                    if slow:  # it changes only as jobs end
                        await self.read_usage(st)
                    count += 1
                    ev = self._wake[st.name]
                    try:
                        await asyncio.wait_for(ev.wait(), self.interval)
                        count = 0  # an action asked: workspaces too
                    except TimeoutError:
                        pass
                    ev.clear()
            except ServerUnreachable as exc:
                if not self._alive(st):
                    break
                self._unreachable(st, str(exc), host_key=exc.host_key)
                if st.hidden:
                    await self.links[st.name].close()
                    return
            except Exception as exc:  # noqa: BLE001 - a bug must not silently stop a server
                if not self._alive(st):
                    break
                log.exception("refreshing %s failed", st.name)
                self._unreachable(st, f"internal error: {exc}")
            if not self._alive(st):
                break  # stopping: wait for nothing (a lost cancel would wait out the backoff)
            try:
                await asyncio.wait_for(self._wake[st.name].wait(), backoff)
            except TimeoutError:
                pass
            self._wake[st.name].clear()
            backoff = min(backoff * 2, 30.0)

    def _alive(self, st: ServerState) -> bool:
        """Whether ``st``'s task should go on: not stopping, not removed, and not
        cancelled (a cancel can be lost in a timeout that fires at the same moment, in
        asyncio.wait_for before Python 3.12, but the task still counts it)."""
        task = asyncio.current_task()
        return (
            not self._stopping
            and self.states.get(st.name) is st
            and not (task is not None and task.cancelling())
        )

    def _unreachable(self, st: ServerState, reason: str, host_key: bool = False) -> None:
        # A ~/.ssh/config host that never answered as MTGPU is some other host: hide it.
        # One whose host key is not trusted yet stays, with how to trust it: it may well
        # be a server, and hiding it would leave the user guessing.
        if st.target.source == SSH_CONFIG and st.server is None and not host_key:
            st.hidden = True
        st.status, st.reason = UNREACHABLE, reason
        self.on_change()

    async def _connect(self, st: ServerState) -> None:
        link = self.links[st.name]
        if not link.up:
            if st.status != CONNECTING:
                st.status = CONNECTING
                self.on_change()
            await link.connect()
        who = await link.call("whoami")
        st.user, st.server = who.get("name"), who.get("server")
        try:
            m = await link.call("cluster.members")
            st.cluster_id, st.members = m.get("cluster_id"), list(m.get("members", []))
        except ApiError:  # an older server: no member list
            st.members = []
        try:
            policy = await link.call("workspace.policy")
            on = bool(policy.get("enabled"))
        except ApiError:
            on = False
        st.workspaces = [] if on else None
        st.status, st.reason, st.notice = UP, "", link.notice
        self._learn_members(st)
        self.on_change()

    def _learn_members(self, st: ServerState) -> None:
        """Add the members of ``st``'s cluster that are not known yet."""
        known_servers = {s.server for s in self.states.values() if s.server}
        known_keys = {s.target.key() for s in self.states.values()}
        added = False
        for m in st.members:
            if m.get("name") in known_servers or m.get("name") == st.server:
                continue
            t = member_target(st.target, m, st.user)
            if (
                t is None
                or t.key() in known_keys
                or any(s.target.source == CLUSTER and s.target.name == t.name for s in self.states.values())
            ):
                continue
            self._add(t)
            added = True
        if added and self._tasks and not self._stopping:
            self.start()  # the view is running: follow the new members too

    async def _refresh(self, st: ServerState, workspaces: bool = True) -> None:
        link = self.links[st.name]
        st.nodes = list(await link.call("nodes"))
        for n in st.nodes:
            for g in n.get("gpus") or []:
                st.history.setdefault((str(n.get("name")), g.get("index")), GpuHistory()).add(g)
        st.jobs = await link.call_all("job.list", all=True)
        if workspaces and st.workspaces is not None:
            try:
                st.workspaces = list(await link.call("workspace.list", timeout=max(self.timeout, 30)))
            except ApiError as exc:
                log.info("workspace.list on %s: %s", st.name, exc)
        st.status, st.reason, st.updated = UP, "", time.time()
        st.notice = link.notice or st.notice
        self.on_change()

    async def read_usage(self, st: ServerState) -> None:
        """The user's own usage this month, as ``mt-job usage`` reads it (one
        ``job.usage`` call, by GPU type). A server that refuses it (an older MTGPU), gives
        an answer of another shape or does not answer in time keeps working: its usage
        is shown as not available, and why."""
        link = self.links[st.name]
        why: str | None = None
        try:
            st.usage = month_usage(await link.call("job.usage", by=["gpu_type"]))
        except ApiError as exc:
            why = usage_refused(exc.code, str(exc))
        except ValueError as exc:
            why = f"its answer is not a usage summary: {exc}"
        except ServerUnreachable as exc:
            if not link.up:
                raise
            why = str(exc)  # this call alone timed out
        if why is not None:
            st.usage = None
            log.info("job.usage on %s: %s", st.name, why)
        st.usage_error = why
        self.on_change()

    async def once(self) -> list[ServerState]:
        """Connect to every server, read everything once, and close (for subcommands)."""
        try:
            while self._new:  # members learnt from one pass are read in the next
                batch, self._new = self._new, []
                await asyncio.gather(*(self._once(self.states[n]) for n in batch))
        finally:
            self._stopping = True
            await asyncio.gather(*(link.close() for link in self.links.values()), return_exceptions=True)
        return self.visible()

    async def _once(self, st: ServerState) -> None:
        try:
            await self._connect(st)
            await self._refresh(st)
            await self.read_usage(st)
        except ServerUnreachable as exc:
            self._unreachable(st, str(exc), host_key=exc.host_key)
        except ApiError as exc:
            self._unreachable(st, f"refused: {exc}")

    # --------------------------------------------------------------- views

    def jobs(self) -> list[tuple[ServerState, dict[str, Any]]]:
        """The user's jobs across servers, each once per cluster: active ones first
        (running, then pending by queue position), then finished ones, newest first."""
        seen: set[tuple[str, str]] = set()
        out: list[tuple[ServerState, dict[str, Any]]] = []
        for st in self.states.values():
            if st.status != UP:
                continue
            for j in st.jobs:
                key = (st.group, str(j.get("job_id")))
                if key not in seen:
                    seen.add(key)
                    out.append((st, j))

        def order(item: tuple[ServerState, dict[str, Any]]) -> tuple[Any, ...]:
            j = item[1]
            state = j.get("state", "")
            if state not in FINAL:
                return (
                    0 if state == RUNNING else 1,
                    j.get("position") or 0,
                    j.get("submit_time") or 0,
                    str(j.get("job_id")),
                )
            return (2, -(j.get("end_time") or j.get("submit_time") or 0), str(j.get("job_id")))

        return sorted(out, key=order)

    def workspaces(self) -> list[tuple[ServerState, dict[str, Any]]]:
        return [(st, w) for st in self.states.values() if st.status == UP for w in (st.workspaces or [])]

    def state(self, name: str) -> ServerState:
        try:
            return self.states[name]
        except KeyError:
            raise MtgpuError(f"no server {name!r}; `remotegpu-cli servers` lists them") from None

    # ------------------------------------------------------------- actions

    def _link(self, st: ServerState) -> ServerLink:
        link = self.links[st.name]
        if not link.up:
            raise ServerUnreachable(f"{st.name} is not connected ({st.reason or 'connecting'})")
        return link

    async def cancel_job(self, st: ServerState, job_id: str) -> dict[str, Any]:
        r = await self._link(st).call("job.cancel", job_ids=[str(job_id)])
        self.refresh_now(st)
        return dict(r)

    async def submit_job(self, st: ServerState, path: str | Path) -> dict[str, Any]:
        """Submit a job file from this computer; the job's workdir is the home there."""
        p = Path(path).expanduser()
        try:
            script = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise MtgpuError(f"cannot read the job file {p}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise MtgpuError(f"{p} is not a text file (UTF-8); a job file is a shell script") from exc
        r = await self._submit(st, script, p.name)
        self.refresh_now(st)
        return dict(r)

    async def _submit(self, st: ServerState, script: str, file_name: str = "") -> Any:
        """``job.submit`` with a key of its own, sent again with that key (for a
        minute at most) while its outcome is unknown or nothing was done, so that a
        retry returns the first job rather than a second one."""
        key = secrets.token_hex(16)
        deadline = time.monotonic() + 60.0
        while True:
            try:
                # The job file's name names the job, as mt-job submit names it (a
                # script typed in has none: the daemon's default applies).
                named: dict[str, Any] = {"file_name": file_name} if file_name else {}
                return await self._link(st).call_long("job.submit", script=script, token=key, **named)
            except ApiError as exc:
                if exc.code not in SUBMIT_RETRIED or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.5)

    async def create_workspace(
        self, st: ServerState, name: str, source: str, ports: list[int] | None = None
    ) -> dict[str, Any]:
        """``source`` is a template name, or an image (anything with ``/`` or ``:``)."""
        args: dict[str, Any] = {"name": name, "ports": ports or None}
        args["image" if ("/" in source or ":" in source) else "template"] = source
        r = await self._link(st).call_long("workspace.create", **args)
        self.refresh_now(st)
        return dict(r)

    async def workspace_choices(self, st: ServerState) -> tuple[list[str], list[str], bool]:
        """What a new workspace may start from there: the admin's template names, the
        images every tenant may use, and whether any other image is allowed."""
        link = self._link(st)
        templates = await link.call("workspace.templates")
        policy = await link.call("workspace.policy")
        names = [str(t["name"]) for t in templates or [] if isinstance(t, dict) and "name" in t]
        images = [str(i) for i in (policy or {}).get("images") or []]
        return names, images, bool((policy or {}).get("allow_user_images"))

    async def workspace_action(self, st: ServerState, action: str, name: str) -> dict[str, Any]:
        """``start``, ``stop`` or ``rm`` a workspace."""
        if action not in ("start", "stop", "rm"):
            raise MtgpuError(f"unknown workspace action {action!r}")
        r = await self._link(st).call_long(f"workspace.{action}", name=name)
        self.refresh_now(st)
        return dict(r)

    async def forward_ports(self, st: ServerState, name: str) -> list[tuple[int, int]]:
        """Forward each published port of a workspace to this computer's loopback, on the
        container's port number where free: returns (container port, local port) pairs."""
        link = self._link(st)
        r = await link.call("workspace.ports", name=name)
        if not r.get("ports"):
            asked = ", ".join(str(p) for p in r.get("requested_ports", [])) or "none"
            raise MtgpuError(
                f"{name} publishes no ports now (state {r.get('state')}; asked for: "
                f"{asked}); create it with ports, such as `web busybox 8888`"
            )
        out = []
        for p in r["ports"]:
            cport, hport = int(p["container_port"]), int(p["host_port"])
            local = await link.forward(hport, cport if cport >= 1024 else 0)
            out.append((cport, local))
        return out

    async def follow_log(self, st: ServerState, job_id: str) -> AsyncIterator[str]:
        """A job's output as it grows, until the job ends (``mt-job logs -f`` there)."""
        async for chunk in self._link(st).follow(shlex.join(["mt-job", "logs", "-f", str(job_id)])):
            yield chunk

    def add_server(self, destination: Target) -> ServerState:
        self.server_list = add_server(self.server_list, destination)
        save_server_list(self.server_list)
        st = self._add(replace(destination, source="list"))
        self.start()
        return st

    async def remove_server(self, st: ServerState) -> None:
        self.server_list = remove_server(self.server_list, st.name)
        save_server_list(self.server_list)
        self.states.pop(st.name, None)
        task = self._tasks.pop(st.name, None)
        if task is not None:
            task.cancel()
        link = self.links.pop(st.name, None)
        if link is not None:
            await link.close()
        self.on_change()
