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
from pathlib import Path
from typing import Any

import asyncssh

import mtgpu
from mtgpu.accounts.provision import Account, LocalAccounts
from mtgpu.accounts.registry import Registry, key_id
from mtgpu.api import users as user_api
from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.api.unix import start_unix_api
from mtgpu.config import Options, load
from mtgpu.errors import ConfigError, MtgpuError
from mtgpu.gateway.session import Gateway
from mtgpu.sshd.server import Penalties, start_ssh_server
from mtgpu.state.store import StateStore

log = logging.getLogger("mtgpu.server")

# Commands put on tenants' PATH (RUN_DIR/bin), linked from beside this interpreter.
TOOLS = ("mt-job", "mt-container", "mt-podman", "mt-python", "mt-attach", "mtgpu-admin")
SYSTEM_UID_MAX = 999


class Daemon:
    """The running parts of one host."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.registry = Registry(options.tenant_uid_range)
        self.accounts = LocalAccounts(options.tenant_home_root, options.tenant_shell)
        self.dispatcher = Dispatcher()
        self.penalties = Penalties(options.ssh_penalty_failures, options.ssh_penalty_seconds)
        self.tools_dir = str(Path(options.run_dir) / "bin")
        self.store: StateStore | None = None
        self._servers: list[Any] = []
        self.stopping = asyncio.Event()

    # ------------------------------------------------------------- helpers

    async def replicate(self, method: Any, *args: Any) -> Any:
        assert self.store is not None
        return await self.store.call(method, *args)

    def is_admin_name(self, name: str) -> bool:
        u = self.registry.get(name)
        return name in self.options.admins or bool(u and u["admin"])

    def caller_for(self, account: Account, via: str) -> Caller:
        return Caller(account.name, account.uid, self.is_admin_name(account.name), via)

    def identify_uid(self, uid: int) -> Caller | None:
        """The caller behind a local UID (from SO_PEERCRED)."""
        if uid == 0:
            return Caller("root", 0, True, "socket")
        u = self.registry.by_uid(uid)
        if u is not None:
            return Caller(u["name"], uid, self.is_admin_name(u["name"]), "socket")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return None
        if uid <= SYSTEM_UID_MAX:
            return None
        return Caller(pw.pw_name, uid, pw.pw_name in self.options.admins, "socket")

    async def local_key_allowed(self, username: str, key_line: str) -> bool:
        """Whether an existing local account lists ``key_line`` in its authorized_keys.

        The file is read by a process running as that account, never by root.
        """
        acct = self.accounts.existing(username)
        if acct is None or acct.uid <= SYSTEM_UID_MAX:
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

    # ------------------------------------------------------------ lifecycle

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
        tools = Path(self.tools_dir)
        tools.mkdir(exist_ok=True)
        os.chmod(tools, 0o755)
        here = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None
        sources = [Path(sys.executable).parent] + ([here] if here else [])
        for name in TOOLS:
            src = next((s / name for s in sources if (s / name).exists()), None)
            link = tools / name
            if link.is_symlink() or link.exists():
                link.unlink()
            if src is not None:
                link.symlink_to(src)

    async def start(self) -> None:
        self._prepare_dirs()
        o = self.options
        self.store = StateStore(o.server_name, [self.registry], o.state_dir)
        await self.store.wait_ready()
        user_api.register(self.dispatcher, self)
        self._servers.append(await start_unix_api(o.api_socket, self.dispatcher, self.identify_uid))
        gateway = Gateway(self)
        self._servers.append(await start_ssh_server(self, gateway))
        Path(o.run_dir, "mtgpu.pid").write_text(f"{os.getpid()}\n")
        log.info("MTGPU %s serving SSH on %s:%d as %s", mtgpu.__version__, *o.ssh_listen,
                 o.server_name)

    async def stop(self) -> None:
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
        if needs_restart:
            log.warning("SIGHUP: %s change only on restart (systemctl restart mtgpu)",
                        ", ".join(k.upper() for k in needs_restart))
            new = _keep(new, self.options, needs_restart)
        self.options = new
        self.penalties.failures = new.ssh_penalty_failures
        self.penalties.seconds = new.ssh_penalty_seconds
        logging.getLogger("mtgpu").setLevel(new.log_level)
        log.info("SIGHUP: configuration reloaded from %s", new.source or "defaults")


def _keep(new: Options, old: Options, keys: list[str]) -> Options:
    from mtgpu.config.options import replace

    return replace(new, **{k: getattr(old, k) for k in keys})


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
