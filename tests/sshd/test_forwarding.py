"""Forwarding as VS Code Remote-SSH needs it, and nothing more."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time

import pytest
from mtgpu_testing import free_port

pytestmark = pytest.mark.root


class EchoServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            data = c.recv(1024)
            c.sendall(b"echo:" + data)
            c.close()

    def close(self) -> None:
        self.sock.close()


def _talk(port: int, payload: bytes = b"hi", host: str = "127.0.0.1", timeout: float = 15) -> bytes:
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.sendall(payload)
                data = s.recv(1024)
                if data or time.time() > deadline:
                    return data
        except OSError:
            if time.time() > deadline:
                raise
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fwd(shared_host):
    key = shared_host.add_user("fwdy")
    assert shared_host.ssh("fwdy", key, "true").returncode == 0
    return shared_host, key


def _background_ssh(host, key, *opts):
    return subprocess.Popen(
        host.ssh_argv("fwdy", key, opts=["-N", "-o", "ExitOnForwardFailure=yes", *opts]),
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def test_local_forward_to_loopback_works(fwd):
    host, key = fwd
    echo = EchoServer()
    lport = free_port()
    p = _background_ssh(host, key, "-L", f"{lport}:127.0.0.1:{echo.port}")
    try:
        assert _talk(lport) == b"echo:hi"
    finally:
        p.kill()
        p.wait()
        echo.close()


def _owner_of_connection_from(port: int) -> int | None:
    """The UID that owns the loopback TCP socket whose local port is ``port`` (the
    kernel's record in /proc/net/tcp, which iptables' owner match also uses)."""
    with open("/proc/net/tcp") as f:
        lines = f.read().splitlines()[1:]
    for line in lines:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port:
            return int(f[7])
    return None


def test_local_forward_connects_as_the_tenant_never_as_root(fwd):
    """The service an -L forward reaches sees a connection the tenant owns, as if the
    tenant had connected from a shell; a forward to a closed port is refused cleanly."""
    host, key = fwd
    uid = int(host.passwd("fwdy")[2])
    owners: list[int | None] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        c, (_, peer_port) = srv.accept()
        owners.append(_owner_of_connection_from(peer_port))
        c.sendall(b"seen")
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    lport = free_port()
    p = _background_ssh(host, key, "-L", f"{lport}:127.0.0.1:{srv.getsockname()[1]}")
    try:
        assert _talk(lport) == b"seen"
        assert owners == [uid], f"the forwarded connection belonged to UID {owners}, not the tenant's {uid}"
    finally:
        p.kill()
        p.wait()
        srv.close()
    closed = free_port()
    lport = free_port()
    p = _background_ssh(host, key, "-L", f"{lport}:127.0.0.1:{closed}")
    try:
        try:
            got = _talk(lport, timeout=5)
        except OSError:  # the client resets the connection the server refused
            got = b""
        assert got == b""
        assert "Connection refused" in host.log()
    finally:
        p.kill()
        p.wait()


def test_local_forward_elsewhere_is_refused(fwd):
    host, key = fwd
    echo = EchoServer("127.0.0.2")  # reachable on this machine, but not an allowed name
    lport = free_port()
    p = _background_ssh(host, key, "-L", f"{lport}:127.0.0.2:{echo.port}")
    try:
        assert _talk(lport, timeout=3) == b""
        assert echo.accepted == 0
    except OSError:
        assert echo.accepted == 0
    finally:
        p.kill()
        p.wait()
        echo.close()
    assert "forwarding to 127.0.0.2" in host.log()


def test_remote_forward_binds_loopback_unprivileged_only(fwd):
    host, key = fwd
    echo = EchoServer()
    rport = free_port()
    p = _background_ssh(host, key, "-R", f"{rport}:127.0.0.1:{echo.port}")
    try:
        assert _talk(rport) == b"echo:hi"
    finally:
        p.kill()
        p.wait()
    for spec in (f"80:127.0.0.1:{echo.port}", f"0.0.0.0:{free_port()}:127.0.0.1:{echo.port}"):
        p = _background_ssh(host, key, "-R", spec)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError(f"-R {spec} was accepted") from None
        assert p.returncode == 255 and b"remote port forwarding failed" in p.stderr.read()
    echo.close()


TENANT_SOCKET_SERVER = """
import os, socket, sys
path = os.path.expanduser(sys.argv[1])
try: os.unlink(path)
except FileNotFoundError: pass
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"unix:" + c.recv(100)); c.close()
"""


def test_unix_socket_forward_only_to_own_sockets(fwd, shared_host):
    host, key = fwd
    other = host.add_user("sockowner")
    srv = subprocess.Popen(
        host.ssh_argv("sockowner", other, "python3", "-", "~/app.sock"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    srv.stdin.write(TENANT_SOCKET_SERVER.encode())
    srv.stdin.close()
    mine = subprocess.Popen(
        host.ssh_argv("fwdy", key, "python3", "-", "~/mine.sock"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    mine.stdin.write(TENANT_SOCKET_SERVER.encode())
    mine.stdin.close()
    try:
        assert srv.stdout.readline().strip() == b"listening"
        assert mine.stdout.readline().strip() == b"listening"
        lport = free_port()
        p = _background_ssh(host, key, "-L", f"{lport}:{host.homes}/fwdy/mine.sock")
        try:
            assert _talk(lport) == b"unix:hi"
        finally:
            p.kill()
        p.wait()
        # The other tenant's socket: refused even though the daemon (root) could reach it.
        (host.homes / "sockowner").chmod(0o755)
        lport = free_port()
        p = _background_ssh(host, key, "-L", f"{lport}:{host.homes}/sockowner/app.sock")
        try:
            assert _talk(lport, timeout=3) == b""
        except OSError:
            pass
        finally:
            p.kill()
        p.wait()
        assert "not a socket you own" in host.log()
    finally:
        srv.kill()
        mine.kill()


TENANT_HTTP_SCRIPT = r"""
cat > /tmp/vscode-like-$$.py <<'PY'
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print("listeningOn==%d==" % s.getsockname()[1], flush=True)
c, _ = s.accept(); c.sendall(b"vscode-server:" + c.recv(100)); c.close()
PY
python3 /tmp/vscode-like-$$.py
"""


def _socks5(proxy_port: int, host: str, port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as s:
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack(">H", port))
        reply = s.recv(10)
        assert reply[1] == 0, f"SOCKS connect failed: {reply!r}"
        s.sendall(payload)
        return s.recv(1024)


def test_vscode_remote_ssh_flow(fwd):
    """`ssh -T -D PORT host bash` reads a script that starts a loopback server and
    prints its port; the client then reaches it through the SOCKS port."""
    host, key = fwd
    dport = free_port()
    p = subprocess.Popen(
        host.ssh_argv("fwdy", key, "bash", opts=["-T", "-D", str(dport)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        p.stdin.write(TENANT_HTTP_SCRIPT.encode())
        p.stdin.flush()
        line = p.stdout.readline().decode()
        assert "listeningOn==" in line
        port = int(line.split("==")[1])
        assert _socks5(dport, "127.0.0.1", port, b"hello") == b"vscode-server:hello"
    finally:
        p.kill()
        p.wait()
