"""Each tenant has a private loopback (TENANT_NETWORK: private).

Two real tenants on a real daemon, reached with the real OpenSSH client. The host runs
in a network namespace of its own (``Network``), so the veths, NAT rules and IPv4
forwarding the daemon makes never touch the machine's own; the test also removes the
rules it can see were this host's (``Host.remove_network_rules``) and checks that
nothing of the daemon's is left behind.

What is shown: ann's ``python3 -m http.server`` on 127.0.0.1 serves ann's session,
ann's job and ann's ``ssh -L``, and is unreachable (connection refused: bob's own
loopback has nothing there) from bob's session, bob's job and bob's ``ssh -L``;
``ssh -R`` listens inside the tenant's namespace; outbound connections reach an
address outside the host; DNS through a loopback resolver (as systemd-resolved's
127.0.0.53) works; ``nsenter`` into another tenant's namespace is refused; removing a
tenant removes its namespace, veth and rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import tally
from mtgpu_testing import SSH_OPTS, Host, Network, free_port, wait_for
from security_testing import STUCK_LISTENER, procs_of

from mtgpu.schedd import netns

pytestmark = pytest.mark.skipif(
    subprocess.run(["iptables", "-V"], check=False, capture_output=True).returncode != 0,
    reason="needs iptables",
)

#: The loopback resolver of the host's /etc/resolv.conf, and what it answers.
RESOLVER = "127.0.0.77"
ANSWER = "10.77.0.9"

#: A DNS server in a few lines: every A query gets ANSWER (a resolver the test starts).
DNS_SERVER = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
ans = socket.inet_aton(sys.argv[2])
print("ready", flush=True)
while True:
    q, a = s.recvfrom(4096)
    end = 12
    while q[end]:
        end += q[end] + 1
    question = q[12:end + 5]
    head = q[:2] + b"\x81\x80" + q[4:6] + b"\x00\x01\x00\x00\x00\x00"
    s.sendto(head + question + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + ans, a)
"""

FETCH = (
    'python3 -c "import sys, urllib.request\n'
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
    "except Exception as exc:\n"
    "    print('FAILED', exc)\" "
)


@pytest.fixture(scope="module")
def net():
    n = Network()
    try:
        yield n
    finally:
        n.close()


@pytest.fixture(scope="module")
def host(net):
    h = Host({"TENANT_NETWORK": "private", "PRIVATE_TMP_SIZE": "64M", "SIMULATED_CPUS": 2})
    net.add(h)
    (h.etc / "resolv.conf").write_text(f"nameserver {RESOLVER}\n")
    dns = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{h.netns}", sys.executable, "-c", DNS_SERVER, RESOLVER, ANSWER],
        stdout=subprocess.PIPE,
        text=True,
    )
    h.start()
    try:
        assert dns.stdout.readline().strip() == "ready"
        h.keys_of = {n: h.add_user(n) for n in ("ann", "bob")}
        for n, k in h.keys_of.items():
            r = h.ssh(n, k, "true")
            assert r.returncode == 0, r.stderr
        h.web_port = free_port()
        r = sh(
            h,
            "ann",
            "umask 077; echo ann-secret > ~/secret.txt; cd ~ && "
            f"(setsid python3 -m http.server {h.web_port} --bind 127.0.0.1 "
            ">/dev/null 2>&1 < /dev/null &); echo started",
        )
        assert b"started" in r.stdout, r.stderr
        wait_for(lambda: "ann-secret" in fetch(h, "ann"), 30, "ann's http.server")
        yield h
    finally:
        h.cleanup()
        dns.kill()
        dns.wait()


def sh(h: Host, user: str, cmd: str, **kw) -> subprocess.CompletedProcess[bytes]:
    return h.ssh(user, h.keys_of[user], cmd, **kw)


def fetch(h: Host, user: str, url: str | None = None) -> str:
    url = url or f"http://127.0.0.1:{h.web_port}/secret.txt"
    return sh(h, user, FETCH + url).stdout.decode()


def uid_of(h: Host, user: str) -> int:
    return int(h.passwd(user)[2])


def in_host_ns(h: Host, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{h.netns}", *argv], check=False, capture_output=True, text=True
    )


def job(h: Host, user: str, body: str) -> str:
    r = sh(h, user, "mt-job submit --parsable -", input=f"#!/bin/sh\n{body}\n".encode())
    assert r.returncode == 0, r.stderr

    jid = r.stdout.decode().strip()

    def done():
        r = sh(h, user, f"mt-job show {jid} --json")
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        return j if j.get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

    j = wait_for(done, 120, f"job {jid} to end")
    return sh(h, user, f"cat {j['stdout']}").stdout.decode()


# --------------------------------------------------------------- loopback


def test_a_tenants_loopback_service_reaches_its_own_session_only(host: Host) -> None:
    assert "ann-secret" in fetch(host, "ann")
    out = fetch(host, "bob")
    assert "ann-secret" not in out and "FAILED" in out and "refused" in out, out


def test_each_tenant_has_its_own_network_namespace(host: Host) -> None:
    ino = {u: sh(host, u, "stat -L -c %i /proc/self/ns/net").stdout.decode().strip() for u in ("ann", "bob")}
    daemon = str(Path(f"/proc/{host._server_pid()}/ns/net").stat().st_ino)
    assert ino["ann"] != ino["bob"] and daemon not in ino.values(), (ino, daemon)
    # The namespace is kept as a file under RUN_DIR/tenants, and a second session joins it.
    assert sh(host, "ann", "stat -L -c %i /proc/self/ns/net").stdout.decode().strip() == ino["ann"]
    r = host.in_ns(["stat", "-L", "-c", "%i", str(host.run_dir / "tenants" / f"{uid_of(host, 'ann')}.net")])
    assert r.stdout.strip() == ino["ann"], r


def test_jobs_share_their_tenants_loopback_only(host: Host) -> None:
    url = f"http://127.0.0.1:{host.web_port}/secret.txt"
    assert "ann-secret" in job(host, "ann", FETCH + url)
    out = job(host, "bob", FETCH + url)
    assert "ann-secret" not in out and "refused" in out, out


@contextlib.contextmanager
def _forwarding(h: Host, user: str, flag: str, spec: str) -> Iterator[int]:
    """``ssh -N`` as ``user`` with one forward (``-L`` or ``-D``) listening on a free
    local port, which it yields once the listener answers."""
    port = free_port()
    argv = [
        "ssh",
        *SSH_OPTS,
        "-i",
        str(h.keys_of[user]),
        "-p",
        str(h.port),
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        flag,
        f"127.0.0.1:{port}{spec}",
        f"{user}@{h.address}",
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 20, f"the ssh {flag} listener")
        yield port
    finally:
        proc.terminate()
        proc.wait()


def _local_forward(h: Host, user: str, dest_port: int) -> str:
    try:
        with _forwarding(h, user, "-L", f":127.0.0.1:{dest_port}") as port:
            with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
                s.sendall(b"GET /secret.txt HTTP/1.0\r\n\r\n")
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
            return data.decode(errors="replace")
    except OSError as exc:
        return f"FAILED {exc}"


def test_ssh_local_forward_reaches_the_tenants_own_loopback(host: Host) -> None:
    assert "ann-secret" in _local_forward(host, "ann", host.web_port)
    # bob's forward to the same port lands on bob's own loopback: nothing listens there.
    assert "ann-secret" not in _local_forward(host, "bob", host.web_port)
    assert "refused" in host.log() or "Connection refused" in host.log()


def _socks_fetch(h: Host, user: str, dest_port: int) -> str:
    with _forwarding(h, user, "-D", "") as port:
        r = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "15",
                "--socks5-hostname",
                f"127.0.0.1:{port}",
                f"http://127.0.0.1:{dest_port}/secret.txt",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        return r.stdout + r.stderr


def test_ssh_dynamic_forward_reaches_the_tenants_own_loopback(host: Host) -> None:
    assert "ann-secret" in _socks_fetch(host, "ann", host.web_port)
    out = _socks_fetch(host, "bob", host.web_port)
    assert "ann-secret" not in out and "curl:" in out, out


def test_ssh_remote_forward_listens_inside_the_tenants_namespace(host: Host) -> None:
    # A local server on the test's side, exposed to ann's namespace with ssh -R.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        try:
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.0 200 OK\r\n\r\nfrom-the-laptop")
            c.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    rport = free_port()
    argv = [
        "ssh",
        *SSH_OPTS,
        "-i",
        str(host.keys_of["ann"]),
        "-p",
        str(host.port),
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-R",
        f"127.0.0.1:{rport}:127.0.0.1:{srv.getsockname()[1]}",
        f"ann@{host.address}",
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{rport}/"
        # bob's loopback has no such listener, nor has the host's own.
        time.sleep(0)
        out = wait_for(
            lambda: (o := fetch(host, "ann", url)) and "from-the-laptop" in o and o,
            30,
            "ann to reach the -R listener",
        )
        assert "from-the-laptop" in out
        assert "from-the-laptop" not in fetch(host, "bob", url)
        r = in_host_ns(host, "ss", "-Hltn", f"sport = :{rport}")
        assert r.stdout.strip() == "", r.stdout  # not in the host's namespace
    finally:
        proc.terminate()
        proc.wait()
        srv.close()


# ---------------------------------------------------------- out and DNS


def test_outbound_connections_and_dns_work_from_sessions_and_jobs(host: Host, net: Network) -> None:
    # An address outside the host: the test's own side of the bridge.
    outside = f"10.213.{net.subnet}.1"
    srv = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", outside],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(Path(__file__).parent),
    )
    try:
        line = srv.stdout.readline()
        port = int(line.split("port ")[1].split()[0])
        url = f"http://{outside}:{port}/{Path(__file__).name}"
        assert "private loopback" in fetch(host, "ann", url)
        assert "private loopback" in job(host, "ann", FETCH + url)
    finally:
        srv.kill()
        srv.wait()
    look = "python3 -c \"import socket; print('ADDR', socket.gethostbyname('model.example'))\""
    assert f"ADDR {ANSWER}" in sh(host, "ann", look).stdout.decode()
    assert f"ADDR {ANSWER}" in job(host, "ann", look)


# -------------------------------------------------------------- hostile


SERVE6 = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"host-service")
    c.close()
"""

DIAL6 = (
    'python3 -c "import socket, sys\n'
    "try:\n"
    "    print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).recv(64).decode())\n"
    "except OSError as exc:\n"
    "    print('FAILED', exc)\" "
)


def _link_local(mac: str) -> str:
    """The EUI-64 link-local address the kernel gives an interface with this MAC."""
    b = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([b[0] ^ 2]) + b[1:3] + b"\xff\xfe" + b[3:]
    return "fe80::" + ":".join(f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2))


def test_a_tenant_reaches_no_host_service_over_ipv6(host: Host) -> None:
    """The rules between a tenant and the host are IPv4's: over the link-local address
    of its link's host end (``[fe80::…%eth0]``) a tenant reached host services bound to
    ``[::]``, ranks of multi-member jobs among them. The link carries no IPv6 now; the
    tenant's own ``::1`` still works."""
    port = free_port()
    srv = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{host.netns}", sys.executable, "-c", SERVE6, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout.readline().strip() == "ready"
        veth = netns.veth_name(uid_of(host, "bob"))
        assert in_host_ns(host, "ip", "-6", "-o", "addr", "show", "dev", veth).stdout.strip() == ""
        link = in_host_ns(host, "ip", "-o", "link", "show", "dev", veth).stdout.split()
        mac = link[link.index("link/ether") + 1]
        target = f"{_link_local(mac)}%eth0"
        r = sh(host, "bob", f"cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6; {DIAL6} '{target}' {port}")
        out = r.stdout.decode()
        assert out.split()[0] == "1" and "host-service" not in out and "FAILED" in out, (out, r.stderr)
        tally("attacks_refused")
        loop6 = (
            "python3 -c \"import socket; s = socket.socket(socket.AF_INET6); s.bind(('::1', 0)); "
            "s.listen(); c = socket.create_connection(s.getsockname()[:2]); print('LOOP6', s.accept()[1][0])\""
        )
        assert "LOOP6 ::1" in sh(host, "bob", loop6).stdout.decode()
    finally:
        srv.kill()
        srv.wait()


SERVE4 = SERVE6.replace("socket.AF_INET6", "socket.AF_INET").replace('("::", ', '("0.0.0.0", ')


def test_a_tenant_reaches_no_host_service_over_ipv4_but_the_ssh_server(host: Host) -> None:
    """A host service bound to ``0.0.0.0`` (a database, a job of a tenant who runs in
    the host's network) is reached from a tenant's namespace on none of the host's
    addresses; the host's SSH server still is (``ssh`` to one's own host works)."""
    port = free_port()
    srv = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{host.netns}", sys.executable, "-c", SERVE4, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout.readline().strip() == "ready"
        veth = netns.veth_name(uid_of(host, "bob"))
        gateway = (
            in_host_ns(host, "ip", "-4", "-o", "addr", "show", "dev", veth).stdout.split()[3].split("/")[0]
        )
        for target in (gateway, host.address):
            out = sh(host, "bob", f"{DIAL6} {target} {port}").stdout.decode()
            assert "host-service" not in out and "FAILED" in out and "refused" in out, (target, out)
            tally("attacks_refused")
        ssh_port = int(str(host.config["SSH_LISTEN"]).rsplit(":", 1)[1])
        banner = sh(host, "bob", f"{DIAL6} {host.address} {ssh_port}").stdout.decode()
        assert banner.startswith("SSH-2.0-"), banner
    finally:
        srv.kill()
        srv.wait()


def test_a_tenant_cannot_enter_another_tenants_namespace(host: Host) -> None:
    bob_ns = host.run_dir / "tenants" / f"{uid_of(host, 'bob')}.net"
    r = sh(
        host,
        "ann",
        f"nsenter --net={bob_ns} true; echo rc=$?; "
        "pid=$(pgrep -u bob | head -1); nsenter -t $pid -n true; echo rc=$?; "
        f"unshare -n true; echo rc=$?",
    )
    out = r.stdout.decode()
    assert "rc=0" not in out, out
    # Forwards: -L to another host address is refused; ann's forwards stay in ann's.
    assert "ann-secret" not in _local_forward(host, "bob", host.web_port)


def test_forward_destination_on_the_tenant_side_is_loopback_only(host: Host) -> None:
    # The tenant side of bob's veth (as seen from the host) is not a forward target.
    r = host.ssh("ann", host.keys_of["ann"], "-o", "ExitOnForwardFailure=yes", "-W", "100.72.0.2:22", "true")
    assert r.returncode != 0


def test_removing_a_tenant_removes_its_network(host: Host) -> None:
    k = host.add_user("carl")
    assert host.ssh("carl", k, "true").returncode == 0
    uid = uid_of(host, "carl")
    veth = f"mtn{uid}"
    assert in_host_ns(host, "ip", "link", "show", veth).returncode == 0
    assert f'{uid}"' in in_host_ns(host, "iptables", "-t", "nat", "-S").stdout
    host.admin("user", "remove", "carl", "--json")
    assert in_host_ns(host, "ip", "link", "show", veth).returncode != 0
    for table in ("nat", "filter"):
        assert f' {uid}"' not in in_host_ns(host, "iptables", "-t", table, "-S").stdout
    r = host.in_ns(["ls", str(host.run_dir / "tenants")])
    assert f"{uid}.net" not in r.stdout


def test_mtgpu_setup_status_says_which_network_is_in_force(host: Host) -> None:
    r = subprocess.run(
        [
            "nsenter",
            f"--net=/run/netns/{host.netns}",
            sys.executable,
            "-m",
            "mtgpu.install.setup",
            "status",
            "--config",
            str(host.config_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "network: private (TENANT_NETWORK: private)" in r.stdout, r.stdout + r.stderr


# -------------------------------------------------------- restart, cleanup


def test_restart_keeps_running_tenants_networks_and_stop_cleans_the_rest(net: Network) -> None:
    h = net.add(Host({"TENANT_NETWORK": "private", "PRIVATE_TMP_SIZE": "64M", "SIMULATED_CPUS": 2}))
    h.start()
    try:
        k = h.add_user("dora")
        r = h.ssh(
            "dora", k, "(setsid sleep 600 >/dev/null 2>&1 < /dev/null &); stat -L -c %i /proc/self/ns/net"
        )
        assert r.returncode == 0, r.stderr
        ino = r.stdout.decode().strip()
        veth = f"mtn{uid_of(h, 'dora')}"
        assert in_host_ns(h, "ip", "link", "show", veth).returncode == 0
        h.restart()
        # The restarted daemon found dora's namespace again in her running process.
        r = h.ssh("dora", k, "stat -L -c %i /proc/self/ns/net; pkill -u dora -x sleep; echo done")
        assert r.stdout.decode().split()[0] == ino, (r.stdout, ino)
        wait_for(
            lambda: h.ssh("dora", k, "pgrep -x sleep || echo none").stdout.strip() == b"none",
            20,
            "dora's sleep to end",
        )
        h.stop()
        # Nobody lives in it any more: the daemon removed it, with its veth and rules.
        assert in_host_ns(h, "ip", "link", "show", veth).returncode != 0
        for table in ("nat", "filter"):
            assert "mtgpu-net" not in in_host_ns(h, "iptables", "-t", table, "-S").stdout
    finally:
        h.cleanup()
    assert h.remove_network_rules() == []


# --------------------------------------------------------------- forward helpers


@pytest.mark.parametrize("flag", ["-W", "-L"])
def test_a_forward_helper_runs_inside_the_tenants_fence(host: Host, flag: str) -> None:
    """The process that makes a tenant's forwarded connection is the tenant's, so the
    tenant may attach to it: it must be inside the session cgroup and the private mount
    namespace, like every other process of that UID, for as long as it lives."""
    uid = uid_of(host, "ann")
    port = free_port()
    listener = subprocess.Popen(
        [
            "ssh",
            *SSH_OPTS,
            "-i",
            str(host.keys_of["ann"]),
            "-p",
            str(host.port),
            f"ann@{host.address}",
            f"exec python3 -c '{STUCK_LISTENER}' {port} 40",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    fwd = None
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "stuck"
        session = next(p for p, cmd in procs_of(uid).items() if "stuck" in cmd or str(port) in cmd)
        mnt = os.readlink(f"/proc/{session}/ns/mnt")
        base = ["ssh", *SSH_OPTS, "-i", str(host.keys_of["ann"]), "-p", str(host.port)]
        if flag == "-W":
            fwd = subprocess.Popen(
                [*base, "-W", f"127.0.0.1:{port}", f"ann@{host.address}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            lport = free_port()
            fwd = subprocess.Popen(
                [*base, "-N", "-L", f"127.0.0.1:{lport}:127.0.0.1:{port}", f"ann@{host.address}"],
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", lport)) == 0, 20, "the -L listener")
            held = socket.create_connection(("127.0.0.1", lport))
        helper = wait_for(
            lambda: next(
                (p for p, cmd in procs_of(uid).items() if " -I -c " in cmd and "connect" in cmd), None
            ),
            20,
            "the forward helper to wait on the stuck listener",
        )
        checked = 0
        for pid in [helper, *procs_of(uid)]:
            try:
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
                ns = os.readlink(f"/proc/{pid}/ns/mnt")
            except OSError:
                continue  # ended meanwhile
            assert f"tenant-{uid}" in cgroup, (pid, procs_of(uid).get(pid), cgroup)
            assert ns == mnt, (pid, procs_of(uid).get(pid), ns, mnt)
            checked += 1
        assert checked >= 2
        if flag == "-L":
            held.close()
    finally:
        for p in (fwd, listener):
            if p is not None:
                p.kill()
                p.wait()
        sh(host, "ann", "pkill -u ann -f 'stuck' || true")
