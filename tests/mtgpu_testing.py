"""Test support: real mtgpu-server processes driven by the real OpenSSH client.

Each :class:`Host` runs ``mtgpu-server`` in a private mount namespace with a private
copy of ``/etc``, so the accounts it creates never touch the developer's own
``/etc``. Its state, run and home directories live under a fresh directory in /tmp
(mode 0755, so tenants can reach their homes), and it listens on a free loopback
port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SSH_OPTS = [
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "BatchMode=yes",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "ConnectTimeout=10",
]


#: Which ``mt-job`` the tenants of the hosts made from now on run: ``"python"`` (the
#: virtualenv's) or ``"c"`` (the fast path mtgpu/cli/fastjob.c, which mtgpu-setup
#: installs as ``mt-job`` wherever a C compiler exists). Set by the ``mtjob_client``
#: fixture (tests/conftest.py) for the tests marked ``mtjob_clients``.
MT_JOB_CLIENTS = ("python", "c")
mt_job_client = "python"
_fast_mtjob: Path | None = None


def fast_mtjob() -> Path:
    """mtgpu/cli/fastjob.c compiled as mtgpu-setup compiles it (handing every other
    command to this virtualenv's Python mt-job), once per test run, where tenants can
    run it (not under /tmp: their sessions have a private one)."""
    global _fast_mtjob
    if _fast_mtjob is None or not _fast_mtjob.exists():
        import atexit

        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc, "tests/run.sh machines have a C compiler (gcc)"
        d = Path(tempfile.mkdtemp(prefix="mtgpu-test-mtjob-", dir="/var/lib"))
        d.chmod(0o755)
        atexit.register(shutil.rmtree, d, True)
        out = d / "mt-job-fast"
        subprocess.run(
            [
                cc,
                "-O2",
                "-o",
                str(out),
                str(REPO / "mtgpu" / "cli" / "fastjob.c"),
                f'-DMTGPU_PY_MTJOB="{Path(sys.executable).parent / "mt-job"}"',
            ],
            check=True,
        )
        _fast_mtjob = out
    return _fast_mtjob


def run_share() -> tuple[int, int]:
    """``(i, n)``: this test run is the i-th of n running at once on this machine
    (tests/run.sh runs the cluster tests beside the others); each takes its own UID
    blocks and subnets, so that no run's cleanup reaches another's tenants."""
    i, _, n = os.environ.get("MTGPU_TEST_SHARE", "0/1").partition("/")
    return int(i), max(1, int(n))


def _uid_block() -> str:
    import random

    i, n = run_share()
    lo = 20000 + random.choice(range(i, 110, n)) * 100  # below the workspace tests' 32100+
    return f"{lo}-{lo + 99}"


def shared_uid_range(base: int, size: int = 100, stride: int = 400) -> str:
    """A fixed block of ``size`` UIDs from ``base`` (a suite's own, such as the
    workspace tests' 32100), moved ``stride`` UIDs per share of this run so that runs at
    once on one machine never meet each other's tenants there either."""
    i, _ = run_share()
    lo = base + i * stride
    return f"{lo}-{lo + size - 1}"


def remove_session_cgroups(uids: list[int], timeout: float = 5.0) -> None:
    """Remove the session cgroups (mtgpu.slice/tenant-UID) of a host's tenants, which
    empty once their processes have been killed."""
    from mtgpu.schedd import cgroups, fence

    system = cgroups.detect()
    dirs = [d for uid in uids for d in fence.session_dirs(system, uid).values()]
    deadline = time.time() + timeout
    while dirs and time.time() < deadline:
        left = []
        for d in dirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)  # busy until its last process has gone
        dirs = left
        if dirs:
            time.sleep(0.1)


#: A scripted answer of :func:`fake_daemon` that closes the connection instead.
CLOSE = None


def fake_daemon(path: Path, answers: list[dict[str, Any] | None]) -> tuple[Any, list[dict[str, Any]]]:
    """A stand-in API socket at ``path`` answering each request line with the next of
    ``answers`` (:data:`CLOSE`: close the connection instead); returns its thread and
    the requests it saw."""
    import json
    import threading

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(8)
    srv.settimeout(60)
    seen: list[dict[str, Any]] = []

    def serve() -> None:
        with srv:
            while answers:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn, conn.makefile("rwb") as f:
                    for line in f:
                        req = json.loads(line)
                        seen.append(req)
                        answer = answers.pop(0)
                        if answer is CLOSE:
                            break
                        f.write(json.dumps({"id": req["id"], **answer}).encode() + b"\n")
                        f.flush()
                        if not answers:
                            return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t, seen


def wait_for(pred, timeout=60, what="condition", interval=0.3):
    """``pred()``'s first true value, asked every ``interval`` s; fails after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def show_job(host: Host, user: str, key: Path, jid: str) -> dict[str, Any]:
    """``mt-job show JID --json`` as ``user``, over real SSH."""
    import json

    r = host.ssh(user, key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_job(
    host: Host, user: str, key: Path, jid: str, pred, what: str, timeout: float = 45
) -> dict[str, Any]:
    """The job's view (as :func:`show_job`) once ``pred`` holds for it."""
    deadline = time.time() + timeout
    while True:
        j = show_job(host, user, key, jid)
        if pred(j):
            return j
        if time.time() > deadline:
            raise AssertionError(f"job {jid}: timed out waiting for {what}: {j}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world_traversable(path: Path) -> bool:
    p = path.resolve()
    for part in [p, *p.parents]:
        if not os.stat(part).st_mode & 0o001:
            return False
    return True


def agreed_scheduler(hosts: list[Host], timeout: float = 5.0) -> str | None:
    """The scheduler every one of ``hosts`` names (asked over its API socket), or None
    while they disagree, name none, or one does not answer (a daemon going down may
    close the socket without an answer)."""
    names = set()
    for h in hosts:
        try:
            r = h.api("cluster.status", timeout=timeout)
        except (OSError, ValueError):
            return None
        if not r.get("ok") or not r["result"]["scheduler"]:
            return None
        names.add(r["result"]["scheduler"])
    return names.pop() if len(names) == 1 else None


def python_env() -> dict[str, str]:
    """Environment for processes that must import this checkout's mtgpu."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTGPU_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def make_key(directory: Path, name: str) -> Path:
    """An ed25519 key pair made by OpenSSH's ssh-keygen; returns the private key path."""
    path = directory / f"key_{name}"
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@test", "-f", str(path)], check=True
        )
    return path


#: Files shadow-utils makes in /etc for a moment while an account changes
#: (passwd.lock, shadow.15351, passwd+): never part of a copy.
_ETC_TRANSIENT = re.compile(r"^(passwd|shadow|group|gshadow|subuid|subgid)(\.lock|\.\d+|\+)$")


def copy_etc(dst: Path) -> None:
    """A copy of /etc for one test host, taken while other processes may be changing
    accounts there: shadow-utils' lock and temporary files are left out, and a file
    that vanishes between the listing and the copy is retried."""

    def transient(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if _ETC_TRANSIENT.match(n)}

    for attempt in range(5):
        try:
            shutil.copytree("/etc", dst, symlinks=True, ignore=transient)
            return
        except shutil.Error as e:
            vanished = all("No such file or directory" in why for _src, _dst, why in e.args[0])
            if not vanished or attempt == 4:
                raise
            shutil.rmtree(dst, ignore_errors=True)
            time.sleep(0.2)


def _accounts(passwd: Path) -> dict[str, tuple[int, str]]:
    """Account name -> (UID, GECOS) in a passwd file (empty if it cannot be read)."""
    out = {}
    try:
        for line in passwd.read_text().splitlines():
            f = line.split(":")
            if len(f) > 4 and f[2].isdigit():
                out[f[0]] = (int(f[2]), f[4])
    except OSError:
        pass
    return out


class Host:
    """One real mtgpu-server under test."""

    def __init__(
        self, extra_config: dict[str, Any] | None = None, name: str = "testhost", base: str = "/tmp"
    ) -> None:
        #: ``base``: where the host's directory goes. Under /tmp its tenants see it only
        #: through the daemon's own directories bound back into their private /tmp.
        os.makedirs(base, mode=0o755, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="mtgpu-t-", dir=base))
        os.chmod(self.dir, 0o755)
        self.etc = self.dir / "etc"
        copy_etc(self.etc)
        self.homes = self.dir / "homes"
        self.homes.mkdir(mode=0o755)
        os.chmod(self.homes, 0o755)
        self.keys = self.dir / "keys"
        self.keys.mkdir(mode=0o700)
        self.port = free_port()
        self.config: dict[str, Any] = {
            "SERVER_NAME": name,
            "SSH_LISTEN": f"127.0.0.1:{self.port}",
            "STATE_DIR": str(self.dir / "state"),
            "RUN_DIR": str(self.dir / "run"),
            "TENANT_HOME_ROOT": str(self.homes),
            "SSH_PENALTY_FAILURES": 1000,
            # A sub-range of its own: cleanup kills this host's tenants' processes by
            # UID, which must never reach another test run's tenants.
            "TENANT_UID_RANGE": _uid_block(),
            # Private tenant networks change the namespace the daemon runs in (veths,
            # NAT rules, IPv4 forwarding): tests that want them ask, and run the host in
            # a network namespace of its own (Network) or remove what it made.
            "TENANT_NETWORK": "shared",
        }
        self.config.update(extra_config or {})
        self.config_path = self.dir / "mtgpu.yaml"
        self.write_config()
        self.proc: subprocess.Popen[bytes] | None = None
        #: Accounts in the /etc copy before this host's daemon first ran: the real
        #: host's (MTGPU tenants among them), never this test's to end.
        self.etc_baseline: set[str] | None = None
        #: The mount namespaces this host's daemons ran in, by (st_dev, st_ino) of
        #: ``/proc/PID/ns/mnt``, each held open until :meth:`cleanup`: what runs in
        #: one was started by this test (supervisors, tenants' tmux servers and
        #: jobs). Held, because a freed namespace's inode number is soon given to a
        #: new one, perhaps a daemon of another test run on this machine.
        self.namespaces: dict[tuple[int, int], int] = {}
        self.log_path = self.dir / "server.log"
        #: Extra environment of the daemon (MTGPU_CLOCK_OFFSET_FILE, say).
        self.env: dict[str, str] = {}
        #: The mt-job its tenants run (see :data:`mt_job_client`).
        self.mt_job_client = mt_job_client

    # -------------------------------------------------------------- process

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))
        # A file holding CLUSTER_KEY must be root's alone, as mtgpu-setup makes it.
        os.chmod(self.config_path, 0o600 if self.config.get("CLUSTER_KEY") else 0o644)

    @property
    def run_dir(self) -> Path:
        return Path(self.config["RUN_DIR"])

    @property
    def state_dir(self) -> Path:
        return Path(self.config["STATE_DIR"])

    def api(self, op: str, *, timeout: float = 5.0, **args: Any) -> dict[str, Any]:
        """One request to the daemon's API socket (as root here); its answer as sent."""
        import json

        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.run_dir / "api.sock"))
            s.sendall(json.dumps({"op": op, "args": args, "id": 1}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
        return json.loads(buf)

    #: Set by Network.add: the network namespace and address this host lives at.
    netns: str | None = None
    address = "127.0.0.1"

    #: Directories this host must not see (other members' homes, say): each is covered
    #: by an empty tmpfs in its mount namespace, as if it were another machine's disk.
    hidden: tuple[str, ...] = ()
    #: Directories this host has its own empty copy of (``/run/user``, say: another
    #: machine's tenants' runtime directories are not this one's).
    private_dirs: tuple[str, ...] = ()
    #: Shell commands run in the daemon's mount namespace just before it starts, each
    #: ending in `` && `` (the mounts a killed daemon left there, say).
    before_start = ""
    #: Run the daemon with ``--log-file`` at ``log_path``: it writes and rotates the
    #: file itself (LOG_MAX_SIZE, LOG_KEEP), as off systemd.
    log_file = False

    def start(self, timeout: float = 30, wait_port: bool = True) -> Host:
        if self.etc_baseline is None:
            self.etc_baseline = set(_accounts(self.etc / "passwd"))
        hide = "".join(f"mount -t tmpfs -o mode=0755,size=1m mtgpu-hidden {p} && " for p in self.hidden)
        hide += "".join(
            f"mount -t tmpfs -o mode=0755,size=64m mtgpu-private {p} && " for p in self.private_dirs
        )
        script = (
            f"mount --bind {self.etc} /etc && {hide}{self.before_start}exec {sys.executable} -m mtgpu.server "
            f"--config {self.config_path}" + (f" --log-file {self.log_path}" if self.log_file else "")
        )
        log = open(self.log_path, "ab")  # noqa: SIM115
        # Only the network namespace (not `ip netns exec`, which mounts the namespace's
        # sysfs over /sys and so hides the cgroup hierarchies that jobs and podman use).
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        self.proc = subprocess.Popen(
            [*prefix, "unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdout=log,
            stderr=log,
            env={**python_env(), **self.env},
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mtgpu-server exited {self.proc.returncode}:\n{self.log()}")
            if (self.run_dir / "mtgpu.pid").exists() and (not wait_port or self._port_open()):
                self._record_namespace()
                self._link_mt_job()
                return self
            time.sleep(0.05)
        pid = (self.run_dir / "mtgpu.pid").exists()
        raise RuntimeError(
            f"mtgpu-server did not start in {timeout}s (pid file: {'yes' if pid else 'no'}, "
            f"{self.address}:{self.port}: {'open' if self._port_open() else 'no answer'}):\n{self.log()}"
        )

    def _link_mt_job(self) -> None:
        """Make the tenants' ``mt-job`` (RUN_DIR/bin, on their PATH) the selected client,
        as the daemon links ``mt-job-fast`` where mtgpu-setup could compile it."""
        if self.mt_job_client != "c":
            return
        link = self.run_dir / "bin" / "mt-job"
        tmp = link.with_name(".mt-job.test")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(fast_mtjob())
        os.replace(tmp, link)

    def _port_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((self.address, self.port)) == 0

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def restart(self) -> Host:
        self.stop()
        return self.start()

    def _record_namespace(self) -> None:
        try:
            fd = os.open(f"/proc/{self._server_pid()}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.namespaces:
            os.close(fd)
        else:
            self.namespaces[(st.st_dev, st.st_ino)] = fd

    def cleanup(self) -> None:
        self.stop()
        # What this host started and left running: its supervisors and its tenants'
        # tmux servers and jobs. Only processes that are provably the test's are
        # ended (see own_processes); never by a UID or name the test did not create.
        for _ in range(30):
            procs = self.own_processes()
            if not procs:
                break
            for p in procs:
                try:
                    p.kill()  # psutil checks the pid still names the same process
                except Exception:  # noqa: BLE001 - gone already
                    pass
            time.sleep(0.1)
        for fd in self.namespaces.values():
            os.close(fd)
        self.namespaces.clear()
        self.remove_network_rules()
        remove_session_cgroups(self.tenant_uids())
        self._remove_job_cgroups()
        shutil.rmtree(self.dir, ignore_errors=True)

    def remove_network_rules(self) -> list[str]:
        """The iptables rules this host's daemon made for its tenants' private networks
        and multi-member jobs (tagged with its own namespace directory's digest) that are
        still there,
        removed; what was removed. A tenant's veth went with its namespace."""
        import shlex

        from mtgpu.schedd.netns import TenantNetwork

        tag = TenantNetwork(str(self.run_dir / "tenants"), "100.72.0.0/16").tag
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        removed = []
        for table in ("nat", "filter"):
            r = subprocess.run(
                [*prefix, "iptables", "-w", "-t", table, "-S"], check=False, capture_output=True, text=True
            )
            for line in r.stdout.splitlines():
                if line.startswith("-A ") and (f"mtgpu-net {tag} " in line or f"mtgpu-job {tag} " in line):
                    subprocess.run(
                        [*prefix, "iptables", "-w", "-t", table, "-D", *shlex.split(line)[1:]],
                        check=False,
                        capture_output=True,
                    )
                    removed.append(line)
        return removed

    def _remove_job_cgroups(self) -> None:
        """The cgroups this host's supervisors made and recorded (cgroups.json in each
        job directory) and could not remove, their processes having been ended above."""
        import json

        for rec in self.state_dir.glob("jobs/*/cgroups.json"):
            try:
                dirs = json.loads(rec.read_text())
            except (OSError, ValueError):
                continue
            for path in dirs.values() if isinstance(dirs, dict) else ():
                p = Path(str(path))
                if p.is_dir() and p.name.startswith("mtgpu_job_"):
                    try:
                        p.rmdir()  # a cgroup directory goes with rmdir once it is empty
                    except OSError:
                        pass

    def tenant_uids(self) -> list[int]:
        """UIDs of the tenants this host's daemon created: accounts added to its /etc
        copy after the copy was taken (the real host's accounts, MTGPU tenants or
        not, are in the baseline), inside its TENANT_UID_RANGE, and the UID of no
        account in the real /etc (whose owner the test must never touch)."""
        lo, _, hi = str(self.config.get("TENANT_UID_RANGE", "")).partition("-")
        if not (lo.isdigit() and hi.isdigit()) or self.etc_baseline is None:
            return []
        real = {uid for uid, _ in _accounts(Path("/etc/passwd")).values()}
        return sorted(
            {
                uid
                for name, (uid, gecos) in _accounts(self.etc / "passwd").items()
                if name not in self.etc_baseline
                and "MTGPU tenant" in gecos
                and int(lo) <= uid <= int(hi)
                and uid not in real
            }
        )

    def own_processes(self) -> list[Any]:
        """Processes this host started that still run (psutil objects): those in a
        mount namespace one of its daemons ran in, and those of the tenants it created
        (:meth:`tenant_uids`; rootless podman's run in namespaces of their own)."""
        import psutil

        uids = set(self.tenant_uids())
        out = []
        for p in psutil.process_iter(["uids", "status"]):
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue  # a zombie is gone already: only its parent's wait is left
            try:
                mine = p.info["uids"] is not None and p.info["uids"].real in uids
                if not mine and self.namespaces:
                    st = os.stat(f"/proc/{p.pid}/ns/mnt")
                    mine = (st.st_dev, st.st_ino) in self.namespaces
            except (OSError, psutil.Error):
                continue
            if mine:
                out.append(p)
        return out

    # ---------------------------------------------------------------- tools

    def in_ns(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the server's mount namespace (its /etc)."""
        assert self.proc is not None
        pid = self._server_pid()
        return subprocess.run(["nsenter", "-t", str(pid), "-m", *argv], capture_output=True, text=True, **kw)

    def in_tenant_ns(self, user: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as ``user`` where that tenant's sessions run: in its private
        mount namespace (its /tmp, hence its tmux socket) when it has one."""
        uid = self.passwd(user)[2]
        ns = self.run_dir / "tenants" / f"{uid}.mnt"
        enter = (
            ["nsenter", f"--mount={ns}"] if self.in_ns(["mountpoint", "-q", str(ns)]).returncode == 0 else []
        )
        return self.in_ns(
            [*enter, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], **kw
        )

    def _server_pid(self) -> int:
        return int((self.run_dir / "mtgpu.pid").read_text())

    def passwd(self, name: str) -> list[str] | None:
        for line in (self.etc / "passwd").read_text().splitlines():
            if line.split(":")[0] == name:
                return line.split(":")
        return None

    def admin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run mtgpu-admin as root against this host."""
        proc = subprocess.run(
            [sys.executable, "-m", "mtgpu.cli.admin", "--config", str(self.config_path), *args],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"mtgpu-admin {' '.join(args)} failed: {proc.stderr}")
        return proc

    def key(self, name: str) -> Path:
        return make_key(self.keys, name)

    def pubkey(self, name: str) -> str:
        return Path(str(self.key(name)) + ".pub").read_text().strip()

    def add_user(self, name: str, key: str | None = None, *extra: str) -> Path:
        k = self.key(key or name)
        self.admin("user", "add", name, "--key", self.pubkey(key or name), *extra)
        return k

    def ssh_argv(self, user: str, key: Path | None, *cmd: str, opts: list[str] | None = None) -> list[str]:
        argv = ["ssh", *SSH_OPTS, "-p", str(self.port)]
        if key is not None:
            argv += ["-i", str(key)]
        return argv + (opts or []) + [f"{user}@{self.address}", *cmd]

    def ssh(
        self,
        user: str,
        key: Path | None,
        *cmd: str,
        input: bytes | None = None,
        opts: list[str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the real OpenSSH client against this host."""
        return subprocess.run(
            self.ssh_argv(user, key, *cmd, opts=opts),
            input=input,
            capture_output=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def host_key_fingerprints(self) -> set[str]:
        scan = subprocess.run(
            ["ssh-keyscan", "-p", str(self.port), self.address], capture_output=True, text=True, timeout=30
        )
        fp = subprocess.run(["ssh-keygen", "-lf", "-"], input=scan.stdout, capture_output=True, text=True)
        return {line.split()[1] for line in fp.stdout.splitlines() if line.strip()}


class ClientTerminal:
    """An interactive `ssh -tt` running in a client-side tmux: type keys, read the screen."""

    _count = 0

    def __init__(
        self,
        host: Host,
        user: str,
        key: Path,
        *cmd: str,
        cols: int = 120,
        rows: int = 30,
        env: dict[str, str] | None = None,
        opts: list[str] | None = None,
    ) -> None:
        """``env``: the client's whole environment (a laptop's locale, COLORTERM...),
        instead of this process's; ``opts``: more ``ssh`` options."""
        ClientTerminal._count += 1
        self.sock = f"mtgpu-client-{os.getpid()}-{ClientTerminal._count}"
        import shlex

        argv = host.ssh_argv(user, key, *cmd, opts=["-tt", "-o", "ServerAliveInterval=2", *(opts or [])])
        if env is not None:
            argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        subprocess.run(
            [
                "tmux",
                "-L",
                self.sock,
                "new-session",
                "-d",
                "-x",
                str(cols),
                "-y",
                str(rows),
                shlex.join(argv) + "; echo SSH-EXITED-$?; sleep 600",
            ],
            check=True,
        )

    def ssh_pid(self) -> int | None:
        """The pid of this terminal's ``ssh`` client (to freeze it, say)."""
        for pid in self.tmux("list-panes", "-F", "#{pane_pid}").stdout.split():
            r = subprocess.run(["pgrep", "-P", pid, "-x", "ssh"], capture_output=True, text=True)
            if r.stdout.split():
                return int(r.stdout.split()[0])
        return None

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p").stdout

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-l", line)
        self.tmux("send-keys", "Enter")

    def wait_for(self, text: str, timeout: float = 20) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.screen()
            if text in s:
                return s
            time.sleep(0.1)
        raise AssertionError(f"{text!r} did not appear; screen:\n{self.screen()}")

    def resize(self, cols: int, rows: int) -> None:
        self.tmux("resize-window", "-x", str(cols), "-y", str(rows))

    def kill(self) -> None:
        """Drop the connection the hard way: kill the ssh client."""
        pids = self.tmux("list-panes", "-F", "#{pane_pid}").stdout.split()
        for pid in pids:
            subprocess.run(["pkill", "-9", "-P", pid, "-x", "ssh"], capture_output=True)

    def close(self) -> None:
        self.tmux("kill-server")


def start_openssh(host: Host, extra: str = "") -> tuple[subprocess.Popen[bytes], int]:
    """OpenSSH's sshd on a loopback port, in ``host``'s mount namespace (its accounts),
    with the same host keys. Returns the process and its port."""
    port = free_port()
    cfg = host.dir / f"sshd_config_{port}"
    cfg.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host.state_dir / "ssh_host_ed25519_key"}
HostKey {host.state_dir / "ssh_host_ecdsa_key"}
PidFile none
UsePAM yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp /usr/lib/openssh/sftp-server
AcceptEnv LANG LC_*
{extra}
""")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["nsenter", "-t", str(host._server_pid()), "-m", "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)],
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        if subprocess.run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], capture_output=True).stdout:
            return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("sshd did not start")


def authorize_for_openssh(host: Host, user: str, key: Path) -> None:
    """Put ``key`` in the tenant's own ~/.ssh/authorized_keys (written as the tenant)."""
    pub = Path(str(key) + ".pub").read_text()
    r = host.ssh(
        user, key, "mkdir -p ~/.ssh && chmod 700 ~/.ssh && cat > ~/.ssh/authorized_keys", input=pub.encode()
    )
    assert r.returncode == 0, r.stderr


class Network:
    """Test hosts in network namespaces of their own, on one bridge: 10.213.N.0/24.

    The test process reaches them from the root namespace through the bridge. A host's
    link can be cut (``cut``) and restored (``heal``) to make a partition.
    """

    _count = 0

    def __init__(self) -> None:
        Network._count += 1
        self.tag = f"{os.getpid() % 10000}{Network._count}"
        self.bridge = f"mtbr{self.tag}"[:15]
        i, n = run_share()
        subnets = range(1 + i, 201, n)
        self.subnet = subnets[(os.getpid() + Network._count) % len(subnets)]
        self.hosts: list[Host] = []
        self._run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._run(["ip", "addr", "add", f"10.213.{self.subnet}.1/24", "dev", self.bridge])
        self._run(["ip", "link", "set", self.bridge, "up"])

    @staticmethod
    def _run(argv: list[str]) -> None:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def add(self, host: Host) -> Host:
        i = len(self.hosts) + 2
        ns = f"mtns{self.tag}h{i}"
        veth, peer = f"mtv{self.tag}h{i}"[:15], f"mtp{self.tag}h{i}"[:15]
        self._run(["ip", "netns", "add", ns])
        self._run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
        self._run(["ip", "link", "set", peer, "netns", ns])
        self._run(["ip", "link", "set", veth, "master", self.bridge])
        self._run(["ip", "link", "set", veth, "up"])
        addr = f"10.213.{self.subnet}.{i}"
        for argv in (
            ["ip", "addr", "add", f"{addr}/24", "dev", peer],
            ["ip", "link", "set", peer, "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            self._run(["ip", "netns", "exec", ns, *argv])
        host.netns, host.address, host.veth = ns, addr, veth
        host.config["SSH_LISTEN"] = f"{addr}:{host.port}"
        host.write_config()
        self.hosts.append(host)
        return host

    def second_source(self) -> str:
        """A second address of the test process on the bridge (``ssh -b`` it): clients
        that the hosts see come from somewhere other than the test's other logins."""
        addr = f"10.213.{self.subnet}.250"
        if (
            addr
            not in subprocess.run(
                ["ip", "-o", "addr", "show", "dev", self.bridge], capture_output=True, text=True
            ).stdout
        ):
            self._run(["ip", "addr", "add", f"{addr}/24", "dev", self.bridge])
        return addr

    def cut(self, host: Host) -> None:
        self._run(["ip", "link", "set", host.veth, "down"])

    def heal(self, host: Host) -> None:
        self._run(["ip", "link", "set", host.veth, "up"])

    def close(self) -> None:
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", h.veth], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
