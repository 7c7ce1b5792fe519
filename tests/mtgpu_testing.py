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
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10"]


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


def wait_for(pred, timeout=60, what="condition", interval=0.3):
    """``pred()``'s first true value, asked every ``interval`` s; fails after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


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
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@test",
                        "-f", str(path)], check=True)
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


class Host:
    """One real mtgpu-server under test."""

    def __init__(self, extra_config: dict[str, Any] | None = None, name: str = "testhost") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mtgpu-t-", dir="/tmp"))
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
        }
        self.config.update(extra_config or {})
        self.config_path = self.dir / "mtgpu.yaml"
        self.write_config()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "server.log"
        #: Extra environment of the daemon (MTGPU_CLOCK_OFFSET_FILE, say).
        self.env: dict[str, str] = {}

    # -------------------------------------------------------------- process

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))

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

    def start(self, timeout: float = 30, wait_port: bool = True) -> Host:
        hide = "".join(f"mount -t tmpfs -o mode=0755,size=1m mtgpu-hidden {p} && "
                       for p in self.hidden)
        hide += "".join(f"mount -t tmpfs -o mode=0755,size=64m mtgpu-private {p} && "
                        for p in self.private_dirs)
        script = (f"mount --bind {self.etc} /etc && {hide}exec {sys.executable} -m mtgpu.server "
                  f"--config {self.config_path}")
        log = open(self.log_path, "ab")  # noqa: SIM115
        # Only the network namespace (not `ip netns exec`, which mounts the namespace's
        # sysfs over /sys and so hides the cgroup hierarchies that jobs and podman use).
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        self.proc = subprocess.Popen([*prefix, "unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                     stdout=log, stderr=log, env={**python_env(), **self.env},
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mtgpu-server exited {self.proc.returncode}:\n{self.log()}")
            if (self.run_dir / "mtgpu.pid").exists() and (not wait_port or self._port_open()):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mtgpu-server did not start in {timeout}s:\n{self.log()}")

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

    def cleanup(self) -> None:
        self.stop()
        # Tenants' leftover processes (tmux servers, jobs) run as test UIDs.
        for uid in self.tenant_uids():
            subprocess.run(["pkill", "-9", "-U", str(uid)], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def tenant_uids(self) -> list[int]:
        uids = []
        try:
            for line in (self.etc / "passwd").read_text().splitlines():
                f = line.split(":")
                if len(f) > 4 and "MTGPU tenant" in f[4]:
                    uids.append(int(f[2]))
        except OSError:
            pass
        return uids

    # ---------------------------------------------------------------- tools

    def in_ns(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the server's mount namespace (its /etc)."""
        assert self.proc is not None
        pid = self._server_pid()
        return subprocess.run(["nsenter", "-t", str(pid), "-m", *argv], capture_output=True,
                              text=True, **kw)

    def _server_pid(self) -> int:
        return int((self.run_dir / "mtgpu.pid").read_text())

    def passwd(self, name: str) -> list[str] | None:
        for line in (self.etc / "passwd").read_text().splitlines():
            if line.split(":")[0] == name:
                return line.split(":")
        return None

    def admin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run mtgpu-admin as root against this host."""
        proc = subprocess.run([sys.executable, "-m", "mtgpu.cli.admin", "--config",
                               str(self.config_path), *args], capture_output=True, text=True,
                              env=python_env(), timeout=60)
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

    def ssh(self, user: str, key: Path | None, *cmd: str, input: bytes | None = None,
            opts: list[str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        """Run the real OpenSSH client against this host."""
        return subprocess.run(self.ssh_argv(user, key, *cmd, opts=opts), input=input,
                              capture_output=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def host_key_fingerprints(self) -> set[str]:
        scan = subprocess.run(["ssh-keyscan", "-p", str(self.port), self.address],
                              capture_output=True, text=True, timeout=30)
        fp = subprocess.run(["ssh-keygen", "-lf", "-"], input=scan.stdout, capture_output=True,
                            text=True)
        return {line.split()[1] for line in fp.stdout.splitlines() if line.strip()}


class ClientTerminal:
    """An interactive `ssh -tt` running in a client-side tmux: type keys, read the screen."""

    _count = 0

    def __init__(self, host: Host, user: str, key: Path, *cmd: str, cols: int = 120,
                 rows: int = 30) -> None:
        ClientTerminal._count += 1
        self.sock = f"mtgpu-client-{os.getpid()}-{ClientTerminal._count}"
        import shlex

        argv = host.ssh_argv(user, key, *cmd, opts=["-tt", "-o", "ServerAliveInterval=2"])
        subprocess.run(["tmux", "-L", self.sock, "new-session", "-d", "-x", str(cols), "-y", str(rows),
                        shlex.join(argv) + "; echo SSH-EXITED-$?; sleep 600"], check=True)

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
HostKey {host.state_dir / 'ssh_host_ed25519_key'}
HostKey {host.state_dir / 'ssh_host_ecdsa_key'}
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
    proc = subprocess.Popen(["nsenter", "-t", str(host._server_pid()), "-m", "/usr/sbin/sshd", "-D",
                             "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], capture_output=True).stdout:
            return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("sshd did not start")


def authorize_for_openssh(host: Host, user: str, key: Path) -> None:
    """Put ``key`` in the tenant's own ~/.ssh/authorized_keys (written as the tenant)."""
    pub = Path(str(key) + ".pub").read_text()
    r = host.ssh(user, key, "mkdir -p ~/.ssh && chmod 700 ~/.ssh && cat > ~/.ssh/authorized_keys",
                 input=pub.encode())
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
        for argv in (["ip", "addr", "add", f"{addr}/24", "dev", peer], ["ip", "link", "set", peer, "up"],
                     ["ip", "link", "set", "lo", "up"]):
            self._run(["ip", "netns", "exec", ns, *argv])
        host.netns, host.address, host.veth = ns, addr, veth
        host.config["SSH_LISTEN"] = f"{addr}:{host.port}"
        host.write_config()
        self.hosts.append(host)
        return host

    def cut(self, host: Host) -> None:
        self._run(["ip", "link", "set", host.veth, "down"])

    def heal(self, host: Host) -> None:
        self._run(["ip", "link", "set", host.veth, "up"])

    def close(self) -> None:
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", h.veth], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
